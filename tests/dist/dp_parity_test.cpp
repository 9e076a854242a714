// Data parallelism: dp = world size gives the losses of one process, because
// every dp rank reads its slice of the same global batch and gradients are
// summed over losses already divided by the global token count.
#include <gtest/gtest.h>

#include "parity.h"

using namespace meshtrain;

namespace {

void expect_same(const test::Curve& ref, const test::Curve& got, double tol) {
  test::expect_same_curve(ref, got, tol, "dp");
}

const std::string kData = test::scratch_dir("dp-parity-data");

}  // namespace

// Over both collective settings a CPU rank accepts: "mpi" takes the staged
// communicators of device_config.collectives (CPU tensors pass through them).
class DataParallelCollectives : public ::testing::TestWithParam<const char*> {};

TEST_P(DataParallelCollectives, SameLossesAsOneProcess) {
  const int n = test_runtime().size();
  Config cfg = test::tiny_config(test::synthetic_data(kData, 96), std::string("dp-") + GetParam());
  cfg.device.collectives = parse_choice<CollectivesChoice>(GetParam()).value();
  const auto ref = test::single_process_losses(cfg);
  const auto got = test::train_losses(test::with_mesh(cfg, n, 1, 1));
  expect_same(ref, got, 1e-5);
  // It learns: the last loss is below the first.
  EXPECT_LT(got.back(), got.front());
}

INSTANTIATE_TEST_SUITE_P(Collectives, DataParallelCollectives, ::testing::Values("auto", "mpi"));

TEST(DataParallel, AccumulationAndMicrobatchesKeepParity) {
  const int n = test_runtime().size();
  Config cfg = test::tiny_config(test::synthetic_data(kData, 96), "dp-accum");
  cfg.grad_step = 2;
  cfg.data.micro_batch_size = 8 / n / 2 > 0 ? 8 / n / 2 : 1;
  const auto ref = test::single_process_losses(cfg);
  const auto got = test::train_losses(test::with_mesh(cfg, n, 1, 1));
  expect_same(ref, got, 1e-5);
}

// The Jaxformer model: capacity and the aux loss are per sequence, so dp
// slicing the batch changes nothing.
TEST(DataParallel, MoeMlaSameLossesAsOneProcess) {
  const int n = test_runtime().size();
  Config cfg = test::moe_mla(test::tiny_config(test::synthetic_data(kData, 96), "dp-moe-mla"));
  cfg.model.capacity_factor = 1.0;  // tight: some assignments are dropped
  cfg.training_steps = 4;
  const auto ref = test::single_process_losses(cfg);
  expect_same(ref, test::train_losses(test::with_mesh(cfg, n, 1, 1)), 1e-5);
}

// Jaxformer's architecture, as the published file builds it (its shared
// expert's output dropped, so those parameters get zero gradients).
TEST(DataParallel, JaxformerSameLossesAsOneProcess) {
  const int n = test_runtime().size();
  Config cfg = test::jaxformer(test::tiny_config(test::synthetic_data(kData, 96), "dp-jaxformer"),
                               SharedExpert::LinearDiscarded);
  cfg.training_steps = 4;
  const auto ref = test::single_process_losses(cfg);
  expect_same(ref, test::train_losses(test::with_mesh(cfg, n, 1, 1)), 1e-5);
}

// DeepSeek-V3's options (sigmoid router with group-limited top-k, scaled
// gates, SwiGLU experts, a dense first layer) with capacity drops.
TEST(DataParallel, DeepSeekV3OptionsSameLossesAsOneProcess) {
  const int n = test_runtime().size();
  Config cfg = test::deepseek_v3(test::tiny_config(test::synthetic_data(kData, 96), "dp-v3"));
  cfg.model.capacity_factor = 1.0;
  cfg.training_steps = 4;
  const auto ref = test::single_process_losses(cfg);
  expect_same(ref, test::train_losses(test::with_mesh(cfg, n, 1, 1)), 1e-5);
}
