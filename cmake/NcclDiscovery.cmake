# Finds a header and a shared library that live under one install root, for
# NCCL and the CUDA runtime. Plain file checks (no find_library) so the logic is
# the same in a configure and under `cmake -P` (tests/cmake/nccl_discovery_test.cmake
# runs it on fake directory layouts). Header and library must come from the same
# root: a header of one NCCL with the library of another would compile and then
# misbehave at run time.

# System install roots searched last; tests point this at a fake layout.
if(NOT DEFINED MT_CUDA_SYSTEM_ROOTS)
  set(MT_CUDA_SYSTEM_ROOTS /usr/local/cuda /usr)
endif()

# The roots searched for NCCL, most specific first. The PyTorch wheel's own NCCL
# (site-packages/nvidia/nccl) comes before system copies: libtorch_cuda loads
# that one, and a process can hold only one libnccl.so.2.
#   torch_site: the site-packages folder holding torch ("" when unknown).
function(mt_nccl_roots out torch_site)
  set(roots)
  foreach(var NCCL_ROOT NCCL_HOME)
    if(DEFINED ENV{${var}} AND NOT "$ENV{${var}}" STREQUAL "")
      list(APPEND roots "$ENV{${var}}")
    endif()
  endforeach()
  if(torch_site)
    list(APPEND roots "${torch_site}/nvidia/nccl")
  endif()
  if(DEFINED ENV{CUDA_HOME} AND NOT "$ENV{CUDA_HOME}" STREQUAL "")
    list(APPEND roots "$ENV{CUDA_HOME}")
  endif()
  list(APPEND roots ${MT_CUDA_SYSTEM_ROOTS})
  set(${out} "${roots}" PARENT_SCOPE)
endfunction()

# The CUDA runtime (cuda_runtime.h + libcudart): the wheel's nvidia/cu13 (or
# cu12-era nvidia/cuda_runtime) first, then a toolkit.
function(mt_cudart_roots out torch_site)
  set(roots)
  if(torch_site)
    list(APPEND roots "${torch_site}/nvidia/cu13" "${torch_site}/nvidia/cuda_runtime")
  endif()
  if(DEFINED ENV{CUDA_HOME} AND NOT "$ENV{CUDA_HOME}" STREQUAL "")
    list(APPEND roots "$ENV{CUDA_HOME}")
  endif()
  list(APPEND roots ${MT_CUDA_SYSTEM_ROOTS})
  set(${out} "${roots}" PARENT_SCOPE)
endfunction()

# mt_find_in_roots(<prefix> HEADER h LIBS name... ROOTS dir...): the first root
# with include/<h> and one of lib{,64,/<multiarch>}/<name>. Sets <prefix>_FOUND,
# <prefix>_INCLUDE_DIR, <prefix>_LIBRARY and <prefix>_SEARCHED (for messages).
function(mt_find_in_roots prefix)
  cmake_parse_arguments(A "" "HEADER" "LIBS;ROOTS" ${ARGN})
  set(found FALSE)
  set(inc "")
  set(lib "")
  foreach(root ${A_ROOTS})
    if(NOT EXISTS "${root}/include/${A_HEADER}")
      continue()
    endif()
    foreach(sub lib lib64 lib/x86_64-linux-gnu lib/aarch64-linux-gnu)
      foreach(name ${A_LIBS})
        if(EXISTS "${root}/${sub}/${name}" AND NOT IS_DIRECTORY "${root}/${sub}/${name}")
          set(found TRUE)
          set(inc "${root}/include")
          set(lib "${root}/${sub}/${name}")
          break()
        endif()
      endforeach()
      if(found)
        break()
      endif()
    endforeach()
    if(found)
      break()
    endif()
  endforeach()
  string(REPLACE ";" ", " searched "${A_ROOTS}")
  set(${prefix}_FOUND ${found} PARENT_SCOPE)
  set(${prefix}_INCLUDE_DIR "${inc}" PARENT_SCOPE)
  set(${prefix}_LIBRARY "${lib}" PARENT_SCOPE)
  set(${prefix}_SEARCHED "${searched}" PARENT_SCOPE)
endfunction()

# "MAJOR.MINOR.PATCH" from the NCCL_MAJOR/MINOR/PATCH defines of nccl.h, or
# "unknown" when the header does not carry them.
function(mt_nccl_header_version out header)
  file(STRINGS "${header}" lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH)[ \t]+[0-9]+")
  set(v_MAJOR "")
  set(v_MINOR "")
  set(v_PATCH "")
  foreach(line ${lines})
    if(line MATCHES "^#define NCCL_(MAJOR|MINOR|PATCH)[ \t]+([0-9]+)")
      set(v_${CMAKE_MATCH_1} ${CMAKE_MATCH_2})
    endif()
  endforeach()
  if(v_MAJOR STREQUAL "" OR v_MINOR STREQUAL "" OR v_PATCH STREQUAL "")
    set(${out} "unknown" PARENT_SCOPE)
  else()
    set(${out} "${v_MAJOR}.${v_MINOR}.${v_PATCH}" PARENT_SCOPE)
  endif()
endfunction()

# NCCL for a torch install: sets MT_NCCL_FOUND, MT_NCCL_INCLUDE_DIR,
# MT_NCCL_LIBRARY, MT_NCCL_VERSION and MT_NCCL_SEARCHED in the caller.
function(mt_discover_nccl torch_site)
  mt_nccl_roots(roots "${torch_site}")
  # The wheel ships only the versioned name; toolkits have both.
  mt_find_in_roots(MT_NCCL HEADER nccl.h LIBS libnccl.so libnccl.so.2 ROOTS ${roots})
  set(version "")
  if(MT_NCCL_FOUND)
    mt_nccl_header_version(version "${MT_NCCL_INCLUDE_DIR}/nccl.h")
  endif()
  foreach(v FOUND INCLUDE_DIR LIBRARY SEARCHED)
    set(MT_NCCL_${v} "${MT_NCCL_${v}}" PARENT_SCOPE)
  endforeach()
  set(MT_NCCL_VERSION "${version}" PARENT_SCOPE)
endfunction()

# The CUDA runtime: sets MT_CUDART_FOUND, MT_CUDART_INCLUDE_DIR,
# MT_CUDART_LIBRARY and MT_CUDART_SEARCHED in the caller.
function(mt_discover_cudart torch_site)
  mt_cudart_roots(roots "${torch_site}")
  mt_find_in_roots(MT_CUDART HEADER cuda_runtime_api.h LIBS libcudart.so libcudart.so.13 libcudart.so.12
                   ROOTS ${roots})
  foreach(v FOUND INCLUDE_DIR LIBRARY SEARCHED)
    set(MT_CUDART_${v} "${MT_CUDART_${v}}" PARENT_SCOPE)
  endforeach()
endfunction()
