// gtest main for tests run under mpirun: MPI is initialised once for all tests,
// only rank 0 prints gtest's report, other ranks print just their failures
// (tagged with the rank), and every rank exits with the same code so mpirun and
// ctest see a failure wherever it happened.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdio>

#include "dist_env.h"
#include "meshtrain/core/log.h"
#include "meshtrain/dist/comm.h"

namespace meshtrain {
namespace {

// Test-only: the tests need the one Runtime that main owns.
Runtime* g_runtime = nullptr;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}

  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                 r.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};

}  // namespace

Runtime& test_runtime() { return *g_runtime; }

}  // namespace meshtrain

int main(int argc, char** argv) {
  meshtrain::Runtime runtime(&argc, &argv);
  meshtrain::g_runtime = &runtime;
  // The trainer's progress lines from every rank would drown the test output.
  meshtrain::setup_logging(runtime.rank(), runtime.size());
  spdlog::set_level(spdlog::level::warn);
  ::testing::InitGoogleTest(&argc, argv);
  if (runtime.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new meshtrain::RankFailurePrinter(runtime.rank()));
  }
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;

  // Agree on the outcome through the library under test's own all_reduce
  // (keeps mpi.h out of tests); a rank that failed still reaches this point.
  int failed_ranks = failed;
  {
    auto world = runtime.world();
    at::Tensor flag = at::full({1}, failed, at::kInt);
    world->all_reduce(flag, meshtrain::ReduceOp::Sum);
    failed_ranks = flag.item<int>();
  }
  if (runtime.rank() == 0 && failed_ranks > 0)
    std::fprintf(stderr, "[mpi_gtest_main] %d of %d rank(s) had failures\n", failed_ranks, runtime.size());
  meshtrain::g_runtime = nullptr;
  return failed_ranks > 0 ? 1 : 0;
}
