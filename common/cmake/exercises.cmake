# kit_add_exercise(<name>): the programs of one exercise, all from its annotated source.
#
#   <target>-exercise   exercises/<name>/<program>.cpp  (what the student edits; stage 0)
#   <target>-solution   solutions/<name>/<program>.cpp  (the last stage)
#   <target>-stage-NN   stage NN: the exercise with TODOs 1..NN done, rendered into the build
#                       folder by common/tools/stages.py and rebuilt when the source changes.
# <target> comes from exercises/<name>/info.toml (e.g. "ex01").
set(KIT_STAGES_PY ${CMAKE_SOURCE_DIR}/common/tools/stages.py)
include(${CMAKE_CURRENT_LIST_DIR}/unity.cmake)

function(kit_trainer target source)
  add_executable(${target} ${source})
  kit_use_common(${target})
endfunction()

function(kit_add_exercise name)
  set(info ${CMAKE_SOURCE_DIR}/exercises/${name}/info.toml)
  file(STRINGS ${info} target_line REGEX "^target *= *\"")
  string(REGEX REPLACE "^target *= *\"([^\"]+)\".*" "\\1" short "${target_line}")
  # The program's files (the first C++ file of info.toml) and its number of stages.
  execute_process(COMMAND ${Python3_EXECUTABLE} ${KIT_STAGES_PY} program ${name}
                  OUTPUT_VARIABLE files OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "exercise ${name}: ${err}")
  endif()
  separate_arguments(files UNIX_COMMAND "${files}")
  list(TRANSFORM files PREPEND ${CMAKE_SOURCE_DIR}/)
  list(GET files 0 exercise_file)
  list(GET files 1 solution_file)
  list(GET files 2 source)
  get_filename_component(file_name ${exercise_file} NAME)
  execute_process(COMMAND ${Python3_EXECUTABLE} ${KIT_STAGES_PY} count ${name} ${file_name}
                  OUTPUT_VARIABLE last OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "exercise ${name}: ${err}")
  endif()
  # Re-run CMake when the annotated source changes: the number of stages may change with it.
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${source} ${info})

  kit_trainer(${short}-exercise ${exercise_file})
  kit_trainer(${short}-solution ${solution_file})

  # Every build of this exercise as "stage:target:source", for the tests (tests/student): the
  # exercise is stage 0, the solution the last stage.
  set(builds "0:${short}-exercise:${exercise_file}" "${last}:${short}-solution:${solution_file}")
  if(KIT_BUILD_STAGES)
    # Stages 1..last-1 (stage 0 is the exercise, the last the solution), compiled together as
    # one family of programs (common/cmake/unity.cmake).
    set(members "")
    math(EXPR before_last "${last} - 1")
    foreach(k RANGE 1 ${before_last})
      string(LENGTH "${k}" len)
      set(kk ${k})
      if(len EQUAL 1)
        set(kk 0${k})
      endif()
      set(dir ${CMAKE_BINARY_DIR}/stages/${name}/stage-${kk})
      add_custom_command(
        OUTPUT ${dir}/${file_name}
        COMMAND ${Python3_EXECUTABLE} ${KIT_STAGES_PY} stage ${name} ${k} ${dir}
        DEPENDS ${source} ${info} ${KIT_STAGES_PY}
        COMMENT "Rendering ${name} stage ${kk}")
      list(APPEND members "${short}-stage-${kk}=${dir}/${file_name}")
      list(APPEND builds "${k}:${short}-stage-${kk}:${dir}/${file_name}")
    endforeach()
    if(members)
      kit_trainer_family(${short}-stages
        PRELUDE ${exercise_file} ${solution_file}
        MEMBERS ${members})
    endif()
  endif()
  set_property(GLOBAL APPEND PROPERTY KIT_EXERCISES ${name})
  set_property(GLOBAL PROPERTY KIT_${name}_TARGET ${short})
  set_property(GLOBAL PROPERTY KIT_${name}_SOLUTION ${solution_file})
  set_property(GLOBAL PROPERTY KIT_${name}_BUILDS ${builds})
endfunction()
