# Finds every dependency of meshtrain (docs/ARCHITECTURE.md, "Dependencies") and exposes it as one imported target:
#   mt_torch (libtorch), mt_mpi (OpenMPI), mt_nccl (NCCL, empty when absent),
#   spdlog::spdlog, nlohmann_json::nlohmann_json, CLI11::CLI11, GTest::gtest,
#   mt_textio (PCRE2, zlib, zstd: prepare-data's regex and decompression; MESHTRAIN_DEPS_PREFIX first),
#   mt_parquet (Arrow/Parquet C++ from the pyarrow wheel; empty when absent).

find_package(nlohmann_json REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(MPI REQUIRED COMPONENTS C)

# ---- libtorch -------------------------------------------------------------
# CMAKE_PREFIX_PATH points at torch's share/cmake (scripts/setup.sh passes it).
# We link the specific libraries instead of TorchConfig's ${TORCH_LIBRARIES}:
# that list pulls in libtorch.so, which exports a std::filesystem::remove_all
# built against a newer libstdc++ than Debian 12's (CUDA builds segfaulted in
# checkpoint pruning), and TorchConfig needs a full CUDA toolkit with nvcc,
# which a machine with only the PyTorch wheel does not have.
#   CPU (default):      torch_cpu, c10.
#   MESHTRAIN_CUDA=ON:  + torch_cuda, c10_cuda, the CUDA runtime and NCCL.
include(${CMAKE_CURRENT_LIST_DIR}/NcclDiscovery.cmake)
add_library(mt_torch INTERFACE)
# libtorch's include folder carries its own fmt (12.x); Debian's spdlog is built
# against the system fmt (9.x). A folder holding only a link to the system fmt,
# searched before torch's, makes <spdlog/spdlog.h> and <torch/torch.h> coexist.
find_path(MT_FMT_INCLUDE fmt/core.h PATHS /usr/include NO_DEFAULT_PATH)
set(MT_SYSTEM_FMT_DIR ${CMAKE_BINARY_DIR}/system-fmt)
if(MT_FMT_INCLUDE)
  file(MAKE_DIRECTORY ${MT_SYSTEM_FMT_DIR})
  file(CREATE_LINK ${MT_FMT_INCLUDE}/fmt ${MT_SYSTEM_FMT_DIR}/fmt SYMBOLIC)
endif()
find_path(MT_TORCH_CONFIG_DIR TorchConfig.cmake PATH_SUFFIXES Torch REQUIRED)
get_filename_component(MT_TORCH_ROOT "${MT_TORCH_CONFIG_DIR}/../../.." ABSOLUTE)
get_filename_component(MT_SITE "${MT_TORCH_ROOT}/.." ABSOLUTE)
find_library(MT_TORCH_CPU torch_cpu PATHS ${MT_TORCH_ROOT}/lib NO_DEFAULT_PATH REQUIRED)
find_library(MT_C10 c10 PATHS ${MT_TORCH_ROOT}/lib NO_DEFAULT_PATH REQUIRED)
target_include_directories(mt_torch SYSTEM INTERFACE
  ${MT_SYSTEM_FMT_DIR} ${MT_TORCH_ROOT}/include ${MT_TORCH_ROOT}/include/torch/csrc/api/include)
target_compile_definitions(mt_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=1)
# libtorch_cpu needs libcudart/libcupti at load time even on CPU; setup.sh
# installs them as wheels next to torch (nvidia/cu13/lib).
set(MT_TORCH_RPATH "${MT_TORCH_ROOT}/lib:${MT_SITE}/nvidia/cu13/lib:/usr/local/cuda/lib")
# The linker must resolve libtorch's own dependencies (cuDNN, NCCL, cuBLAS ...
# under site-packages/nvidia/*/lib) while linking.
file(GLOB MT_NVIDIA_LIB_DIRS LIST_DIRECTORIES TRUE ${MT_SITE}/nvidia/*/lib)
string(REPLACE ";" ":" MT_RPATH_LINK "${MT_NVIDIA_LIB_DIRS};/usr/local/cuda/lib;/usr/local/cuda/lib64")

add_library(mt_nccl INTERFACE)
if(MESHTRAIN_CUDA)
  find_library(MT_TORCH_CUDA torch_cuda PATHS ${MT_TORCH_ROOT}/lib NO_DEFAULT_PATH)
  find_library(MT_C10_CUDA c10_cuda PATHS ${MT_TORCH_ROOT}/lib NO_DEFAULT_PATH)
  if(NOT MT_TORCH_CUDA OR NOT MT_C10_CUDA)
    message(FATAL_ERROR "MESHTRAIN_CUDA=ON but ${MT_TORCH_ROOT}/lib has no libtorch_cuda.so/libc10_cuda.so: "
                        "this PyTorch is a CPU-only build. Point MESHTRAIN_TORCH_PREFIX at a CUDA PyTorch "
                        "(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)').")
  endif()
  mt_discover_cudart("${MT_SITE}")
  if(NOT MT_CUDART_FOUND)
    message(FATAL_ERROR "MESHTRAIN_CUDA=ON but the CUDA runtime (include/cuda_runtime_api.h + libcudart.so*) "
                        "was not found under any of: ${MT_CUDART_SEARCHED}. Install PyTorch's CUDA wheels or "
                        "set CUDA_HOME.")
  endif()
  mt_discover_nccl("${MT_SITE}")
  if(NOT MT_NCCL_FOUND)
    message(FATAL_ERROR "MESHTRAIN_CUDA=ON needs NCCL (include/nccl.h + libnccl.so or libnccl.so.2 in one root) "
                        "but none was found under: ${MT_NCCL_SEARCHED}. Install the nvidia-nccl wheel that "
                        "PyTorch depends on, or set NCCL_ROOT to an NCCL install.")
  endif()
  message(STATUS "libtorch (CUDA link): ${MT_TORCH_ROOT}")
  message(STATUS "CUDA runtime: ${MT_CUDART_LIBRARY}")
  message(STATUS "NCCL ${MT_NCCL_VERSION}: ${MT_NCCL_LIBRARY} (headers ${MT_NCCL_INCLUDE_DIR})")
  # The runtime wheel (nvidia/cu13/include) ships cuda_runtime.h without the
  # crt/ headers it includes (they come with nvcc): take them from a CUDA
  # toolkit of the same major version, after the wheel's folder.
  get_filename_component(MT_NVCC_ROOT "${CMAKE_CUDA_COMPILER}" DIRECTORY)
  find_path(MT_CUDA_CRT_ROOT crt/host_config.h NO_DEFAULT_PATH
            PATHS ${MT_CUDART_INCLUDE_DIR} $ENV{CUDA_HOME}/include $ENV{CUDA_PATH}/include
                  ${MT_NVCC_ROOT}/../include /usr/local/cuda/include)
  if(NOT MT_CUDA_CRT_ROOT)
    message(FATAL_ERROR "MESHTRAIN_CUDA=ON: ${MT_CUDART_INCLUDE_DIR}/cuda_runtime.h needs crt/host_config.h, "
                        "which is in neither that folder nor a CUDA toolkit (CUDA_HOME, CUDA_PATH, nvcc's "
                        "folder, /usr/local/cuda). Install the CUDA toolkit or set CUDA_HOME.")
  endif()
  target_include_directories(mt_torch SYSTEM INTERFACE ${MT_CUDART_INCLUDE_DIR} ${MT_CUDA_CRT_ROOT})
  # cuBLASLt for the GELU epilogues (src/ops/cublaslt_gelu.cpp): the copy
  # libtorch loads (the nvidia wheel's), else the toolkit's.
  get_filename_component(MT_CUDART_LIB_DIR ${MT_CUDART_LIBRARY} DIRECTORY)
  find_library(MT_CUBLASLT NAMES cublasLt libcublasLt.so.13 libcublasLt.so.12
               PATHS ${MT_NVIDIA_LIB_DIRS} ${MT_CUDART_LIB_DIR} $ENV{CUDA_HOME}/lib64 /usr/local/cuda/lib64 NO_DEFAULT_PATH)
  if(NOT MT_CUBLASLT)
    message(FATAL_ERROR "MESHTRAIN_CUDA=ON needs cuBLASLt (libcublasLt.so*), found in neither PyTorch's nvidia "
                        "wheels (${MT_NVIDIA_LIB_DIRS}) nor a CUDA toolkit (CUDA_HOME, /usr/local/cuda).")
  endif()
  message(STATUS "cuBLASLt: ${MT_CUBLASLT}")
  # --no-as-needed: nothing references libtorch_cuda's symbols directly, but
  # loading it is what registers torch's CUDA backend.
  target_link_libraries(mt_torch INTERFACE "-Wl,--no-as-needed,${MT_TORCH_CUDA}" ${MT_C10_CUDA} ${MT_TORCH_CPU}
                        ${MT_C10} ${MT_CUDART_LIBRARY} ${MT_CUBLASLT})
  target_compile_definitions(mt_torch INTERFACE MESHTRAIN_CUDA=1)
  get_filename_component(MT_NCCL_DIR ${MT_NCCL_LIBRARY} DIRECTORY)
  get_filename_component(MT_CUDART_DIR ${MT_CUDART_LIBRARY} DIRECTORY)
  # Only the NCCL and CUDA runtime found above: a system copy earlier on the
  # search path (/usr/local/cuda/lib) would be loaded instead of the one whose
  # header we compiled against, and a process holds one libnccl.so.2.
  # cuBLASLt's folder too: the binary names it directly (the GELU epilogues).
  get_filename_component(MT_CUBLASLT_DIR ${MT_CUBLASLT} DIRECTORY)
  set(MT_TORCH_RPATH "${MT_TORCH_ROOT}/lib:${MT_NCCL_DIR}:${MT_CUDART_DIR}:${MT_CUBLASLT_DIR}")
  target_include_directories(mt_nccl SYSTEM INTERFACE ${MT_NCCL_INCLUDE_DIR})
  target_link_libraries(mt_nccl INTERFACE ${MT_NCCL_LIBRARY})
  target_compile_definitions(mt_nccl INTERFACE MESHTRAIN_HAVE_NCCL=1)
else()
  target_link_libraries(mt_torch INTERFACE ${MT_TORCH_CPU} ${MT_C10})
  message(STATUS "libtorch (CPU link): ${MT_TORCH_ROOT}")
  message(STATUS "NCCL: not used (MESHTRAIN_CUDA=OFF: collectives over MPI)")
endif()
target_link_options(mt_torch INTERFACE "-Wl,-rpath,${MT_TORCH_RPATH}" "-Wl,-rpath-link,${MT_RPATH_LINK}")

# ---- MPI ------------------------------------------------------------------
add_library(mt_mpi INTERFACE)
target_link_libraries(mt_mpi INTERFACE MPI::MPI_C)

# ---- prepare-data: PCRE2 (tiktoken's regexes), zlib and zstd (compressed inputs)
# Each is looked for, in order, in MESHTRAIN_DEPS_PREFIX (where
# scripts/gpu/gpu-carry.sh unpacks Debian's -dev packages for a machine that lacks
# them, e.g. an offline Ubuntu GPU image: their static archives are linked, so
# the binary needs nothing more there), through pkg-config when it is
# installed, then in the compiler's usual places. pkg-config is optional.
set(MESHTRAIN_DEPS_PREFIX "" CACHE PATH "A local prefix (usr/) holding carried -dev packages (scripts/gpu/gpu-carry.sh)")
find_package(PkgConfig QUIET)
add_library(mt_textio INTERFACE)
# mt_find_c_library(NAME HEADER LIB PKGCONFIG_MODULE DEBIAN_PACKAGE): adds it to mt_textio.
function(mt_find_c_library name header lib module deb)
  if(MESHTRAIN_DEPS_PREFIX)
    find_path(MT_${name}_HEADER ${header} PATHS ${MESHTRAIN_DEPS_PREFIX}/include NO_DEFAULT_PATH)
    find_library(MT_${name}_LIBRARY NAMES lib${lib}.a ${lib}
                 PATHS ${MESHTRAIN_DEPS_PREFIX}/lib/${CMAKE_LIBRARY_ARCHITECTURE} ${MESHTRAIN_DEPS_PREFIX}/lib
                 NO_DEFAULT_PATH)
    if(MT_${name}_HEADER AND MT_${name}_LIBRARY)
      message(STATUS "${name}: ${MT_${name}_LIBRARY} (carried, MESHTRAIN_DEPS_PREFIX)")
      target_include_directories(mt_textio SYSTEM INTERFACE ${MT_${name}_HEADER})
      target_link_libraries(mt_textio INTERFACE ${MT_${name}_LIBRARY})
      return()
    endif()
  endif()
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(MT_${name}_PC QUIET IMPORTED_TARGET ${module})
    if(MT_${name}_PC_FOUND)
      target_link_libraries(mt_textio INTERFACE PkgConfig::MT_${name}_PC)
      return()
    endif()
  endif()
  find_path(MT_${name}_HEADER ${header})
  find_library(MT_${name}_LIBRARY ${lib})
  if(NOT MT_${name}_HEADER OR NOT MT_${name}_LIBRARY)
    message(FATAL_ERROR "${name} (${header} and lib${lib}) was not found (searched MESHTRAIN_DEPS_PREFIX="
                        "'${MESHTRAIN_DEPS_PREFIX}', pkg-config module ${module}, the system paths). Install "
                        "${deb}, or on an offline machine carry it: scripts/gpu/gpu-carry.sh (docs/gpus.md, GPU checks).")
  endif()
  message(STATUS "${name}: ${MT_${name}_LIBRARY}")
  target_include_directories(mt_textio SYSTEM INTERFACE ${MT_${name}_HEADER})
  target_link_libraries(mt_textio INTERFACE ${MT_${name}_LIBRARY})
endfunction()
mt_find_c_library(PCRE2 pcre2.h pcre2-8 libpcre2-8 libpcre2-dev)
mt_find_c_library(ZSTD zstd.h zstd libzstd libzstd-dev)
mt_find_c_library(ZLIB zlib.h z zlib zlib1g-dev)

# ---- Parquet: Arrow/Parquet C++ shipped inside the pyarrow wheel, found beside
# torch the way libtorch is, else in .deps/venv where scripts/setup.sh installs
# it (so a build against another torch, e.g. the CUDA wheel, still has it).
# Only src/data/parquet_reader.cpp uses it, compiled as C++20 (Arrow's headers
# need it); without pyarrow, .parquet inputs are refused with that reason.
add_library(mt_parquet INTERFACE)
set(MT_PY_SITES)
if(MT_TORCH_CONFIG_DIR)
  get_filename_component(MT_TORCH_SITE "${MT_TORCH_CONFIG_DIR}/../../../.." ABSOLUTE)
  list(APPEND MT_PY_SITES ${MT_TORCH_SITE})
elseif(Torch_DIR)
  get_filename_component(MT_TORCH_SITE "${Torch_DIR}/../../../.." ABSOLUTE)
  list(APPEND MT_PY_SITES ${MT_TORCH_SITE})
endif()
file(GLOB MT_VENV_SITES ${CMAKE_SOURCE_DIR}/.deps/venv/lib/python3*/site-packages)
list(APPEND MT_PY_SITES ${MT_VENV_SITES})
set(MT_HAVE_PARQUET OFF)
# OFF: a binary that must run where another pyarrow (or none) is installed,
# e.g. one built here and carried to a GPU machine.
option(MESHTRAIN_PARQUET "Read .parquet inputs through pyarrow's Arrow/Parquet C++ when found" ON)
if(NOT MESHTRAIN_PARQUET)
  set(MT_PY_SITES)
endif()
foreach(site ${MT_PY_SITES})
  if(MT_HAVE_PARQUET)
    break()
  endif()
  file(GLOB arrow_lib ${site}/pyarrow/libarrow.so.[0-9]*)
  file(GLOB parquet_lib ${site}/pyarrow/libparquet.so.[0-9]*)
  if(EXISTS ${site}/pyarrow/include/arrow/api.h AND arrow_lib AND parquet_lib)
    list(GET arrow_lib 0 arrow_lib)
    list(GET parquet_lib 0 parquet_lib)
    message(STATUS "Parquet: ${parquet_lib}")
    target_include_directories(mt_parquet SYSTEM INTERFACE ${site}/pyarrow/include)
    target_link_libraries(mt_parquet INTERFACE ${parquet_lib} ${arrow_lib})
    target_compile_definitions(mt_parquet INTERFACE MESHTRAIN_HAVE_PARQUET=1)
    target_link_options(mt_parquet INTERFACE "-Wl,-rpath,${site}/pyarrow")
    set(MT_HAVE_PARQUET ON)
  endif()
endforeach()
if(NOT MESHTRAIN_PARQUET)
  message(STATUS "Parquet: off (MESHTRAIN_PARQUET=OFF), .parquet inputs are refused")
elseif(NOT MT_HAVE_PARQUET)
  message(STATUS "Parquet: pyarrow's Arrow/Parquet C++ not found (looked in: ${MT_PY_SITES}), .parquet inputs are refused")
endif()
