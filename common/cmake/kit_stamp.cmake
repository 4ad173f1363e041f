# common/cmake/kit_stamp.cmake — the stamp of a kit_common build (common/cmake/prebuilt.cmake):
# a checksum of common/kit's sources and the kit's CMake files, the LibTorch, the compiler.
#
# Included: defines kit_stamp_text(). Run as a script (cmake -P, by kit_common's build, so that
# the stamp follows every change of the sources): writes -DOUT=<file> from -DSOURCE_DIR and the
# -DTORCH_VERSION ... -DNCCL values.

function(kit_stamp_text out source_dir torch_version torch_dir compiler build_type nccl)
  file(GLOB_RECURSE files ${source_dir}/common/kit/*.h ${source_dir}/common/kit/*.cpp
       ${source_dir}/common/gloo-declarations/*.h ${source_dir}/common/CMakeLists.txt
       ${source_dir}/common/cmake/*.cmake)
  list(SORT files)
  set(sums "")
  foreach(f ${files})
    file(SHA256 ${f} one)
    file(RELATIVE_PATH rel ${source_dir} ${f})
    string(APPEND sums "${rel} ${one}\n")
  endforeach()
  string(SHA256 sum "${sums}")
  set(${out} "sources ${sum}\ntorch ${torch_version} ${torch_dir}\ncompiler ${compiler}\nbuild-type ${build_type}\nnccl ${nccl}\n" PARENT_SCOPE)
endfunction()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  kit_stamp_text(text "${SOURCE_DIR}" "${TORCH_VERSION}" "${TORCH_DIR}" "${COMPILER}" "${BUILD_TYPE}" "${NCCL}")
  file(WRITE "${OUT}" "${text}")
endif()
