# Finds every dependency of meshtrain (docs/ARCHITECTURE.md, "Dependencies") and exposes it as one imported target:
#   mt_torch (libtorch), mt_mpi (OpenMPI), mt_nccl (NCCL, empty when absent),
#   spdlog::spdlog, nlohmann_json::nlohmann_json, CLI11::CLI11, GTest::gtest,
#   mt_textio (PCRE2, zlib, zstd: prepare-data's regex and decompression),
#   mt_parquet (Arrow/Parquet C++ from the pyarrow wheel; empty when absent).

find_package(nlohmann_json REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(MPI REQUIRED COMPONENTS C)

# ---- libtorch -------------------------------------------------------------
# CMAKE_PREFIX_PATH points at torch's share/cmake (scripts/setup.sh passes it).
# On CPU machines we link libtorch_cpu + libc10 directly: the PyPI wheel's
# TorchConfig would pull libtorch_cuda and its cuDNN/NCCL/nvshmem wheels, which
# a CPU build never loads. GPU machines (MESHTRAIN_CUDA=ON) use TorchConfig.
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
if(MESHTRAIN_CUDA)
  find_package(Torch REQUIRED)
  target_include_directories(mt_torch SYSTEM BEFORE INTERFACE ${MT_SYSTEM_FMT_DIR})
  target_link_libraries(mt_torch INTERFACE ${TORCH_LIBRARIES})
  target_compile_definitions(mt_torch INTERFACE MESHTRAIN_CUDA=1)
else()
  find_path(MT_TORCH_CONFIG_DIR TorchConfig.cmake PATH_SUFFIXES Torch REQUIRED)
  get_filename_component(MT_TORCH_ROOT "${MT_TORCH_CONFIG_DIR}/../../.." ABSOLUTE)
  find_library(MT_TORCH_CPU torch_cpu PATHS ${MT_TORCH_ROOT}/lib NO_DEFAULT_PATH REQUIRED)
  find_library(MT_C10 c10 PATHS ${MT_TORCH_ROOT}/lib NO_DEFAULT_PATH REQUIRED)
  target_include_directories(mt_torch SYSTEM INTERFACE
    ${MT_SYSTEM_FMT_DIR} ${MT_TORCH_ROOT}/include ${MT_TORCH_ROOT}/include/torch/csrc/api/include)
  target_link_libraries(mt_torch INTERFACE ${MT_TORCH_CPU} ${MT_C10})
  target_compile_definitions(mt_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=1)
  # libtorch_cpu needs libcudart/libcupti at load time even on CPU; setup.sh
  # installs them as wheels next to torch (nvidia/cu13/lib).
  get_filename_component(MT_SITE "${MT_TORCH_ROOT}/.." ABSOLUTE)
  set(MT_TORCH_RPATH "${MT_TORCH_ROOT}/lib;${MT_SITE}/nvidia/cu13/lib;/usr/local/cuda/lib")
  target_link_options(mt_torch INTERFACE "-Wl,-rpath,${MT_TORCH_ROOT}/lib:${MT_SITE}/nvidia/cu13/lib:/usr/local/cuda/lib"
    "-Wl,-rpath-link,${MT_SITE}/nvidia/cu13/lib:/usr/local/cuda/lib")
  message(STATUS "libtorch (CPU link): ${MT_TORCH_ROOT}")
endif()

# ---- MPI ------------------------------------------------------------------
add_library(mt_mpi INTERFACE)
target_link_libraries(mt_mpi INTERFACE MPI::MPI_C)

# ---- NCCL: compiled in when nccl.h is found --------------------------------
add_library(mt_nccl INTERFACE)
find_path(MT_NCCL_INCLUDE nccl.h HINTS /usr/local/cuda/include ENV CUDA_HOME PATH_SUFFIXES include)
find_library(MT_NCCL_LIB nccl HINTS /usr/local/cuda/lib /usr/local/cuda/lib64 ENV CUDA_HOME PATH_SUFFIXES lib lib64)
find_library(MT_CUDART_LIB cudart HINTS /usr/local/cuda/lib /usr/local/cuda/lib64 ENV CUDA_HOME PATH_SUFFIXES lib lib64)
if(MT_NCCL_INCLUDE AND MT_NCCL_LIB AND MT_CUDART_LIB)
  message(STATUS "NCCL: ${MT_NCCL_LIB}")
  target_include_directories(mt_nccl SYSTEM INTERFACE ${MT_NCCL_INCLUDE})
  target_link_libraries(mt_nccl INTERFACE ${MT_NCCL_LIB} ${MT_CUDART_LIB})
  target_compile_definitions(mt_nccl INTERFACE MESHTRAIN_HAVE_NCCL=1)
  get_filename_component(MT_NCCL_DIR ${MT_NCCL_LIB} DIRECTORY)
  target_link_options(mt_nccl INTERFACE "-Wl,-rpath,${MT_NCCL_DIR}")
else()
  message(STATUS "NCCL: not found, GPU collectives disabled")
endif()

# ---- prepare-data: PCRE2 (tiktoken's regexes), zlib and zstd (compressed inputs)
find_package(PkgConfig REQUIRED)
pkg_check_modules(MT_PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(MT_ZSTD REQUIRED IMPORTED_TARGET libzstd)
find_package(ZLIB REQUIRED)
add_library(mt_textio INTERFACE)
target_link_libraries(mt_textio INTERFACE PkgConfig::MT_PCRE2 PkgConfig::MT_ZSTD ZLIB::ZLIB)

# ---- Parquet: Arrow/Parquet C++ shipped inside the pyarrow wheel, found beside
# torch the way libtorch is (scripts/setup.sh installs pyarrow into .deps/venv).
# Only src/data/parquet_reader.cpp uses it, compiled as C++20 (Arrow's headers
# need it); without pyarrow, .parquet inputs are skipped with that reason.
add_library(mt_parquet INTERFACE)
if(MT_TORCH_CONFIG_DIR)
  get_filename_component(MT_PY_SITE "${MT_TORCH_CONFIG_DIR}/../../../.." ABSOLUTE)
elseif(Torch_DIR)
  get_filename_component(MT_PY_SITE "${Torch_DIR}/../../../.." ABSOLUTE)
endif()
find_path(MT_ARROW_INCLUDE arrow/api.h PATHS ${MT_PY_SITE}/pyarrow/include NO_DEFAULT_PATH)
file(GLOB MT_ARROW_LIB ${MT_PY_SITE}/pyarrow/libarrow.so.[0-9]*)
file(GLOB MT_PARQUET_LIB ${MT_PY_SITE}/pyarrow/libparquet.so.[0-9]*)
if(MT_ARROW_INCLUDE AND MT_ARROW_LIB AND MT_PARQUET_LIB)
  list(GET MT_ARROW_LIB 0 MT_ARROW_LIB)
  list(GET MT_PARQUET_LIB 0 MT_PARQUET_LIB)
  message(STATUS "Parquet: ${MT_PARQUET_LIB}")
  target_include_directories(mt_parquet SYSTEM INTERFACE ${MT_ARROW_INCLUDE})
  target_link_libraries(mt_parquet INTERFACE ${MT_PARQUET_LIB} ${MT_ARROW_LIB})
  target_compile_definitions(mt_parquet INTERFACE MESHTRAIN_HAVE_PARQUET=1)
  target_link_options(mt_parquet INTERFACE "-Wl,-rpath,${MT_PY_SITE}/pyarrow")
  set(MT_HAVE_PARQUET ON)
else()
  message(STATUS "Parquet: pyarrow's Arrow/Parquet C++ not found under ${MT_PY_SITE}/pyarrow, .parquet inputs are skipped")
endif()
