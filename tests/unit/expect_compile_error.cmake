# expect_compile_error.cmake — a compile-fail test: `cmake -DBUILD_DIR=... -DGOOD=target
# -DBAD="target[;target...]" -DEXPECT=regex -P expect_compile_error.cmake`. GOOD must build (so the compiler,
# its flags and include paths work: a failure of BAD is then the code's, not the setup's), each
# BAD target must fail with an error that matches EXPECT (so it fails for the reason the test is about).
foreach(v BUILD_DIR GOOD BAD EXPECT)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "expect_compile_error.cmake: -D${v}=... is missing")
  endif()
endforeach()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${GOOD} -j1
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${GOOD} does not compile, so ${BAD}'s failure would prove nothing:\n${out}")
endif()
foreach(bad ${BAD})  # one or more targets (a ;-list), each must fail
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${bad} -j1
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0)
    message(FATAL_ERROR "${bad} compiled, but it must not")
  endif()
  if(NOT out MATCHES "${EXPECT}")
    message(FATAL_ERROR "${bad} failed, but not with an error matching '${EXPECT}':\n${out}")
  endif()
  message(STATUS "${bad} is refused by the compiler, as expected")
endforeach()
