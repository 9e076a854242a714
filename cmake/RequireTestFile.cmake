# mt_require_test_file(SRC LIST): a test listed in LIST (a CMakeLists.txt)
# whose source SRC is gone fails the configure, naming both: skipping it
# would drop the test from CI unnoticed. tests/CMakeLists.txt calls it for
# every listed test; tests/cmake/require_test_file_test.cmake checks it.
function(mt_require_test_file src list)
  if(NOT EXISTS "${src}")
    message(FATAL_ERROR "${src} does not exist: a test listed in ${list} has no source file "
                        "(rename or remove its entry there)")
  endif()
endfunction()
