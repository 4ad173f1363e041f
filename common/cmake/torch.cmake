# common/cmake/torch.cmake — finds LibTorch, checks its version, and fills the gaps of a LibTorch
# that comes from the `torch` Python package (pip wheel) rather than from a full CUDA install.
#
#   CMAKE_PREFIX_PATH=$(python -c 'import torch;print(torch.utils.cmake_prefix_path)')
#
# Sets KIT_HAVE_NCCL (ON for a CUDA build of LibTorch) and kit_torch_extra_includes.

# The supported range (common/README.md: "Building on a cluster"). CI runs the suite on the pinned
# 2.13 (requirements.txt), compiles everything against 2.14.1 with CUDA (./kit cuda-build) and
# against the oldest release below, KIT_TORCH_OLDEST_CI (tests/cluster: cluster.torch_oldest); 2.15
# was compiled by hand with the same tool (common/README.md). 2.1 and older fail to compile (C++20
# and TransformerEncoderLayer's activation option). Others stop the configure step with one line;
# -DKIT_ALLOW_UNTESTED_TORCH=ON turns that into a warning.
set(KIT_TORCH_OLDEST 2.2)
set(KIT_TORCH_NEWEST 2.15)
set(KIT_TORCH_OLDEST_CI 2.2.2)
option(KIT_ALLOW_UNTESTED_TORCH "Build against a LibTorch outside the tested range" OFF)

# A CUDA LibTorch probes the GPUs of this machine for the architectures to compile kernels for.
# The kit compiles no kernels of its own, and a login node or CI machine has no GPU: skip it.
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(ENV{TORCH_CUDA_ARCH_LIST} "8.0;9.0")
endif()

# A CUDA LibTorch needs the CUDA toolkit (nvcc) to configure. FindCUDA derives the toolkit from
# nvcc's folder, which fails when nvcc on PATH is a link or a wrapper script (/usr/local/bin/nvcc):
# take the first of nvcc's real folder and /usr/local/cuda that has the CUDA headers.
if(NOT DEFINED CUDA_TOOLKIT_ROOT_DIR AND NOT DEFINED ENV{CUDA_HOME} AND NOT DEFINED ENV{CUDA_PATH})
  find_program(kit_nvcc nvcc)
  if(kit_nvcc)
    file(REAL_PATH "${kit_nvcc}" kit_nvcc_real)
    get_filename_component(kit_cuda_root "${kit_nvcc_real}/../.." ABSOLUTE)
    foreach(kit_root "${kit_cuda_root}" /usr/local/cuda)
      if(EXISTS "${kit_root}/include/cuda_runtime.h")
        set(CUDA_TOOLKIT_ROOT_DIR "${kit_root}" CACHE PATH "CUDA toolkit (from nvcc on PATH)")
        break()
      endif()
    endforeach()
  endif()
endif()

# A pip wheel of CUDA torch brings the CUDA libraries and headers it needs beside torch, in
# site-packages/nvidia/*/. A machine with only part of the CUDA toolkit (or nothing but nvcc)
# lacks some of them (libnvrtc, cusparse.h): take those from the wheel. Looked up before
# find_package(Torch), which resolves nvrtc while it runs.
set(kit_torch_extra_includes "")
string(REPLACE ":" ";" kit_env_prefixes "$ENV{CMAKE_PREFIX_PATH}")
# A prefix is .../site-packages/torch/share/cmake, a Torch_DIR (what a configured build folder
# keeps, when ./kit reconfigures it without CMAKE_PREFIX_PATH) one folder deeper.
set(kit_sites "")
foreach(kit_prefix ${CMAKE_PREFIX_PATH} ${kit_env_prefixes})
  get_filename_component(kit_site "${kit_prefix}/../../.." ABSOLUTE)
  list(APPEND kit_sites "${kit_site}")
endforeach()
foreach(kit_prefix ${Torch_DIR} $ENV{Torch_DIR})
  get_filename_component(kit_site "${kit_prefix}/../../../.." ABSOLUTE)
  list(APPEND kit_sites "${kit_site}")
endforeach()
foreach(kit_site ${kit_sites})  # .../site-packages
  if(IS_DIRECTORY "${kit_site}/nvidia" AND IS_DIRECTORY "${kit_site}/torch")
    file(GLOB kit_torch_extra_includes LIST_DIRECTORIES true "${kit_site}/nvidia/*/include")
    file(GLOB kit_nvrtc "${kit_site}/nvidia/*/lib/libnvrtc.so.*")
    list(FILTER kit_nvrtc EXCLUDE REGEX "builtins|alt")
    if(kit_nvrtc AND NOT CUDA_nvrtc_LIBRARY)
      list(GET kit_nvrtc 0 kit_nvrtc)
      set(CUDA_nvrtc_LIBRARY ${kit_nvrtc} CACHE FILEPATH "libnvrtc of the torch wheel")
    endif()
    break()
  endif()
endforeach()

find_package(Torch QUIET)
if(NOT Torch_FOUND)
  string(CONCAT kit_msg "kit: LibTorch not found (CMAKE_PREFIX_PATH: '${CMAKE_PREFIX_PATH}"
         "$ENV{CMAKE_PREFIX_PATH}', Torch_DIR: '${Torch_DIR}'): point CMAKE_PREFIX_PATH at "
         "$(python -c 'import torch;print(torch.utils.cmake_prefix_path)'), or leave it unset "
         "and ./kit build installs the pinned torch")
  message(FATAL_ERROR "${kit_msg}")
endif()

string(REGEX MATCH "^[0-9]+\\.[0-9]+" kit_torch_mm "${Torch_VERSION}")
if(kit_torch_mm VERSION_LESS KIT_TORCH_OLDEST OR kit_torch_mm VERSION_GREATER KIT_TORCH_NEWEST)
  string(CONCAT kit_msg "kit: LibTorch ${Torch_VERSION} is outside the supported range "
         "${KIT_TORCH_OLDEST} to ${KIT_TORCH_NEWEST} (from ${Torch_DIR}): use the pinned torch of "
         "requirements.txt, or -DKIT_ALLOW_UNTESTED_TORCH=ON to try anyway")
  if(KIT_ALLOW_UNTESTED_TORCH)
    message(WARNING "${kit_msg}")
  else()
    message(FATAL_ERROR "${kit_msg}")
  endif()
endif()

set(KIT_HAVE_NCCL OFF)
if(TORCH_CUDA_LIBRARIES OR CUDA_FOUND OR CUDAToolkit_FOUND)
  set(KIT_HAVE_NCCL ON)  # CUDA builds of LibTorch always ship ProcessGroupNCCL
else()
  set(kit_torch_extra_includes "")
endif()
message(STATUS "kit: LibTorch ${Torch_VERSION} from ${Torch_DIR}; NCCL ${KIT_HAVE_NCCL}")

# The Python interpreter that owns this LibTorch, for the Python references that must use the same
# torch as the C++ side (tests/bench, tests/oracle): the venv's python next to a pip torch, else
# the Python found on PATH if it imports this very torch.
get_filename_component(kit_site "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
set(kit_torch_python "")
foreach(kit_candidate "${kit_site}/../../../bin/python3" "${kit_site}/../../bin/python3"
                      "${Python3_EXECUTABLE}")
  if(EXISTS "${kit_candidate}")
    execute_process(COMMAND "${kit_candidate}" -c "import torch, os; print(os.path.dirname(torch.__file__))"
                    OUTPUT_VARIABLE kit_found ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE kit_rc)
    if(kit_rc EQUAL 0 AND EXISTS "${kit_found}")
      file(REAL_PATH "${kit_found}" kit_found)
      file(REAL_PATH "${TORCH_INSTALL_PREFIX}" kit_want)
      if(kit_found STREQUAL kit_want)
        get_filename_component(kit_torch_python "${kit_candidate}" ABSOLUTE)
        break()
      endif()
    endif()
  endif()
endforeach()
set(KIT_TORCH_PYTHON "${kit_torch_python}" CACHE FILEPATH
    "Python whose torch is the LibTorch of this build (empty: none found)")
