# cmake -P: a listed test whose file exists passes mt_require_test_file; one
# whose file is missing must stop the configure (ctest checks the message).
include(${SOURCE_DIR}/cmake/RequireTestFile.cmake)
mt_require_test_file(${SOURCE_DIR}/tests/unit/config_test.cpp tests/unit/CMakeLists.txt)
message(STATUS "an existing test file passed")
mt_require_test_file(${SOURCE_DIR}/tests/unit/no_such_test.cpp tests/unit/CMakeLists.txt)
message(STATUS "a missing test file passed too")
