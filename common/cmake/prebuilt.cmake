# common/cmake/prebuilt.cmake — kit_common built once for a whole course (included by
# common/CMakeLists.txt).
#
# An instructor builds the kit once, in a build folder every participant can read:
#     cmake -S . -B /p/course/kit-build -DCMAKE_BUILD_TYPE=Release ...  # after the site's modules
#     cmake --build /p/course/kit-build --target kit_common corpus images
# and each participant's new build folder links that library instead of compiling the kit:
#     export KIT_PREBUILT_COMMON=/p/course/kit-build     # ./kit passes it to a new build folder
#     ./kit check 00                                      # (or cmake -DKIT_PREBUILT_COMMON=...)
# The participant's build still compiles its own programs (exercises, solutions, ddprun) and one
# precompiled <torch/torch.h> for them (kit_pch below: an imported library brings none). The
# trainers' default data folder is compiled into the library: the instructor's build's (build the
# targets corpus and images there too; ./kit check and the job scripts pass --data-dir anyway).
#
# Every build of kit_common writes kit-common.stamp beside it (common/cmake/kit_stamp.cmake): a
# checksum of common/kit's sources and CMake files, the LibTorch and the compiler. A prebuilt
# folder is used only where its stamp is this build's own:
# the same kit, the same torch, the same compiler; anything else stops the configure step with one
# line, rather than linking a library built from other sources.
#
# Sets KIT_PCH_TARGET: the target whose precompiled header every program reuses.

# The stamp of this build: what a library built here depends on (common/cmake/kit_stamp.cmake).
include(${CMAKE_CURRENT_LIST_DIR}/kit_stamp.cmake)
set(kit_stamp_args "${Torch_VERSION}" "${Torch_DIR}"
    "${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}" "${CMAKE_BUILD_TYPE}" "${KIT_HAVE_NCCL}")
kit_stamp_text(kit_stamp ${CMAKE_SOURCE_DIR} ${kit_stamp_args})

set(KIT_PREBUILT_COMMON "" CACHE PATH
    "An instructor's build folder whose libkit_common.so this build links instead of compiling the kit")
# kit_stamp_after_build(kit_common): the stamp written again whenever the library is linked, so
# that it always describes the library (called by common/CMakeLists.txt after add_library).
function(kit_stamp_after_build target)
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -DOUT=${CMAKE_BINARY_DIR}/kit-common.stamp -DSOURCE_DIR=${CMAKE_SOURCE_DIR}
            "-DTORCH_VERSION=${Torch_VERSION}" "-DTORCH_DIR=${Torch_DIR}"
            "-DCOMPILER=${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}"
            "-DBUILD_TYPE=${CMAKE_BUILD_TYPE}" "-DNCCL=${KIT_HAVE_NCCL}"
            -P ${CMAKE_SOURCE_DIR}/common/cmake/kit_stamp.cmake
    VERBATIM)
endfunction()

if(NOT KIT_PREBUILT_COMMON)
  set(KIT_PCH_TARGET kit_common CACHE INTERNAL "the target whose precompiled header programs reuse")
  if(NOT EXISTS ${CMAKE_BINARY_DIR}/kit-common.stamp)
    file(WRITE ${CMAKE_BINARY_DIR}/kit-common.stamp "${kit_stamp}")
  endif()
  return()
endif()

set(kit_prebuilt_lib ${KIT_PREBUILT_COMMON}/lib/libkit_common.so)
if(NOT EXISTS ${kit_prebuilt_lib} OR NOT EXISTS ${KIT_PREBUILT_COMMON}/kit-common.stamp)
  message(FATAL_ERROR "kit: KIT_PREBUILT_COMMON=${KIT_PREBUILT_COMMON} holds no built kit "
                      "(lib/libkit_common.so and kit-common.stamp): build it there first with "
                      "'cmake --build ${KIT_PREBUILT_COMMON} --target kit_common', or unset "
                      "KIT_PREBUILT_COMMON and use a new build folder")
endif()
file(READ ${KIT_PREBUILT_COMMON}/kit-common.stamp theirs)
if(NOT theirs STREQUAL kit_stamp)
  string(REPLACE "\n" "; " theirs_line "${theirs}")
  string(REPLACE "\n" "; " ours_line "${kit_stamp}")
  message(FATAL_ERROR "kit: KIT_PREBUILT_COMMON=${KIT_PREBUILT_COMMON} was built from another "
                      "kit, torch or compiler (its stamp: ${theirs_line}this build's: ${ours_line}"
                      "): load the same modules as the instructor and use the course's commit, "
                      "or unset KIT_PREBUILT_COMMON and use a new build folder")
endif()
message(STATUS "kit: kit_common prebuilt in ${KIT_PREBUILT_COMMON} (KIT_PREBUILT_COMMON): "
               "this build compiles the programs only")

# The library as the instructor's build made it; its headers are this clone's (the same, by the
# stamp). What kit_common's own target hands on to its users (common/CMakeLists.txt) is handed on
# here: LibTorch, the backends' defines.
add_library(kit_common SHARED IMPORTED GLOBAL)
set(kit_prebuilt_defs USE_C10D_GLOO)
if(KIT_HAVE_NCCL)
  list(APPEND kit_prebuilt_defs USE_C10D_NCCL KIT_HAVE_NCCL=1)
endif()
set_target_properties(kit_common PROPERTIES
  IMPORTED_LOCATION ${kit_prebuilt_lib}
  INTERFACE_INCLUDE_DIRECTORIES ${CMAKE_SOURCE_DIR}/common
  INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${kit_torch_extra_includes}"
  INTERFACE_COMPILE_DEFINITIONS "${kit_prebuilt_defs}"
  INTERFACE_LINK_LIBRARIES "${TORCH_LIBRARIES};Threads::Threads")
if(kit_torch_extra_includes)
  set_property(TARGET kit_common APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES ${kit_torch_extra_includes})
endif()
# One precompiled <torch/torch.h> for this build's programs, compiled from an empty source.
file(WRITE ${CMAKE_BINARY_DIR}/kit_pch.cpp "// kit_pch: the precompiled header's own source (common/cmake/prebuilt.cmake)\n")
add_library(kit_pch OBJECT ${CMAKE_BINARY_DIR}/kit_pch.cpp)
target_link_libraries(kit_pch PRIVATE kit_common)
target_precompile_headers(kit_pch PRIVATE <torch/torch.h>)
set(KIT_PCH_TARGET kit_pch CACHE INTERNAL "the target whose precompiled header programs reuse")
