#pragma once
// The process's Runtime, created by mpi_gtest_main.cpp before any test runs.
#include "meshtrain/dist/runtime.h"

namespace meshtrain {

Runtime& test_runtime();

}  // namespace meshtrain
