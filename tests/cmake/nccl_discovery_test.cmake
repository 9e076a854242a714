# cmake -DSOURCE_DIR=<repo> -DWORK=<scratch dir> -P nccl_discovery_test.cmake
# Configure-time discovery of NCCL and the CUDA runtime (cmake/NcclDiscovery.cmake)
# on fake directory layouts: the PyTorch wheel's (only libnccl.so.2), a CUDA
# toolkit's, NCCL_ROOT overriding both, half installs that must not count, and
# nothing at all.
cmake_minimum_required(VERSION 3.22)
foreach(v SOURCE_DIR WORK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "nccl_discovery_test: pass -D${v}=...")
  endif()
endforeach()
unset(ENV{NCCL_ROOT})
unset(ENV{NCCL_HOME})
unset(ENV{CUDA_HOME})
set(MT_CUDA_SYSTEM_ROOTS ${WORK}/sys/usr/local/cuda ${WORK}/sys/usr)
include(${SOURCE_DIR}/cmake/NcclDiscovery.cmake)

set(failures 0)
macro(expect what got want)
  if(NOT "${got}" STREQUAL "${want}")
    message(SEND_ERROR "${what}: got '${got}', want '${want}'")
    math(EXPR failures "${failures} + 1")
  endif()
endmacro()

function(fake_nccl root libname major minor patch)
  file(MAKE_DIRECTORY ${root}/include)
  file(WRITE ${root}/include/nccl.h
       "#ifndef NCCL_H_\n#define NCCL_H_\n#define NCCL_MAJOR ${major}\n#define NCCL_MINOR ${minor}\n"
       "#define NCCL_PATCH ${patch}\n#define NCCL_SUFFIX \"\"\n#endif\n")
  get_filename_component(dir ${root}/${libname} DIRECTORY)
  file(MAKE_DIRECTORY ${dir})
  file(WRITE ${root}/${libname} "not really ELF")
endfunction()

file(REMOVE_RECURSE ${WORK})
set(site ${WORK}/site-packages)

# 1. Nothing anywhere: not found, and the message lists where it looked.
mt_discover_nccl("${site}")
expect("empty: found" "${MT_NCCL_FOUND}" "FALSE")
string(FIND "${MT_NCCL_SEARCHED}" "${site}/nvidia/nccl" at)
if(at EQUAL -1)
  message(SEND_ERROR "empty: searched list '${MT_NCCL_SEARCHED}' does not name the wheel folder")
  math(EXPR failures "${failures} + 1")
endif()

# 2. A toolkit-style system install (lib64/libnccl.so) is found.
fake_nccl(${WORK}/sys/usr/local/cuda lib64/libnccl.so 2 21 5)
mt_discover_nccl("${site}")
expect("toolkit: found" "${MT_NCCL_FOUND}" "TRUE")
expect("toolkit: lib" "${MT_NCCL_LIBRARY}" "${WORK}/sys/usr/local/cuda/lib64/libnccl.so")
expect("toolkit: version" "${MT_NCCL_VERSION}" "2.21.5")

# 3. The torch wheel's NCCL (only the versioned libnccl.so.2) wins over the
#    system one: libtorch_cuda loads the wheel's.
fake_nccl(${site}/nvidia/nccl lib/libnccl.so.2 2 28 9)
mt_discover_nccl("${site}")
expect("wheel: found" "${MT_NCCL_FOUND}" "TRUE")
expect("wheel: include" "${MT_NCCL_INCLUDE_DIR}" "${site}/nvidia/nccl/include")
expect("wheel: lib" "${MT_NCCL_LIBRARY}" "${site}/nvidia/nccl/lib/libnccl.so.2")
expect("wheel: version" "${MT_NCCL_VERSION}" "2.28.9")

# 4. NCCL_ROOT overrides the wheel (Debian multiarch layout).
fake_nccl(${WORK}/custom lib/x86_64-linux-gnu/libnccl.so.2 2 30 1)
set(ENV{NCCL_ROOT} ${WORK}/custom)
mt_discover_nccl("${site}")
expect("NCCL_ROOT: lib" "${MT_NCCL_LIBRARY}" "${WORK}/custom/lib/x86_64-linux-gnu/libnccl.so.2")
expect("NCCL_ROOT: version" "${MT_NCCL_VERSION}" "2.30.1")
unset(ENV{NCCL_ROOT})

# 5. A header without a library (or a library without a header) is no install.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${site}/nvidia/nccl/include ${WORK}/sys/usr/lib)
file(WRITE ${site}/nvidia/nccl/include/nccl.h "#define NCCL_MAJOR 2\n")
file(WRITE ${WORK}/sys/usr/lib/libnccl.so.2 "")
mt_discover_nccl("${site}")
expect("half install: found" "${MT_NCCL_FOUND}" "FALSE")

# 6. A header without version defines reports "unknown" instead of failing.
file(MAKE_DIRECTORY ${site}/nvidia/nccl/lib)
file(WRITE ${site}/nvidia/nccl/lib/libnccl.so.2 "")
mt_discover_nccl("${site}")
expect("no version: found" "${MT_NCCL_FOUND}" "TRUE")
expect("no version: version" "${MT_NCCL_VERSION}" "unknown")

# 7. The CUDA runtime from the wheel's nvidia/cu13 (libcudart.so.13 only).
file(MAKE_DIRECTORY ${site}/nvidia/cu13/include ${site}/nvidia/cu13/lib)
file(WRITE ${site}/nvidia/cu13/include/cuda_runtime_api.h "")
file(WRITE ${site}/nvidia/cu13/lib/libcudart.so.13 "")
mt_discover_cudart("${site}")
expect("cudart: found" "${MT_CUDART_FOUND}" "TRUE")
expect("cudart: lib" "${MT_CUDART_LIBRARY}" "${site}/nvidia/cu13/lib/libcudart.so.13")

file(REMOVE_RECURSE ${WORK})
if(failures GREATER 0)
  message(FATAL_ERROR "nccl_discovery_test: ${failures} check(s) failed")
endif()
message(STATUS "nccl_discovery_test: all checks passed")
