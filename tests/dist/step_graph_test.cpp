// device_config.cuda_graphs on CPU ranks (train/step_graph.h): the steps are
// checked for graph safety and then run eagerly, so a run with the key equals
// one without it; a step that reads device memory on the host, or whose
// memory use changes, is refused naming what did. (On a GPU the same steps
// are captured and replayed: Cuda.GraphedStepsMatchEagerSteps.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "parity.h"

using namespace meshtrain;

namespace {

const std::string kData = test::scratch_dir("step-graph-data");

Config graphed(Config c) {
  c.device.cuda_graphs = true;
  c.training_steps = 6;
  return c;
}

struct EnvVar {
  EnvVar(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~EnvVar() { unsetenv(name_); }
  const char* name_;
};

std::string train_error(const Config& cfg) {
  try {
    test::train_losses(cfg);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(StepGraph, CheckedStepsEqualTheRunWithoutGraphs) {
  const std::string data = test::synthetic_data(kData, 96);
  const Config dense = test::tiny_config(data, "graph-dense");
  Config accum = dense;
  accum.name = "graph-accum";
  accum.grad_step = 2;
  accum.data.micro_batch_size = 2;
  accum.model.dropout_rate = 0.1;  // the same masks: both runs draw them from the same generators
  Config moe = test::moe_mla(dense);
  moe.name = "graph-moe";
  Config bf16 = moe;
  bf16.name = "graph-moe-bf16";
  bf16.model.model_dtype = ModelDtype::Bfloat16;
  bf16.optimizer_state_dtype = ModelDtype::Bfloat16;  // meshtrain::adamw_ reads the learning rate tensor
  for (Config c : {dense, accum, moe, bf16}) {
    c.training_steps = 6;
    const test::Curve eager = test::train_losses(c);
    c.name += "-graphs";
    // The learning rate is an fp32 device scalar under graphs (the update reads
    // it there): a relative 6e-8 of the rate, far below the tolerance.
    test::expect_same_curve(eager, test::train_losses(graphed(c)), 1e-6, c.name);
  }
}

TEST(StepGraph, RefusesAStepThatReadsTheDeviceOnTheHost) {
  const std::string data = test::synthetic_data(kData, 96);
  for (const char* step : {"2", "5"}) {
    EnvVar hook("MESHTRAIN_TEST_HOST_READ_AT_STEP", step);
    Config c = graphed(test::tiny_config(data, std::string("graph-read-") + step));
    const std::string error = train_error(c);
    if (std::string(step) == "2") {
      EXPECT_NE(error.find("device_config.cuda_graphs: step 2 cannot be captured"), std::string::npos) << error;
      EXPECT_NE(error.find("aten::_local_scalar_dense"), std::string::npos) << error;
    } else {
      // After the checked steps the CPU runs eagerly: nothing is refused.
      EXPECT_EQ(error, "");
    }
  }
}

TEST(StepGraph, RefusesMemoryUseThatChangesBetweenSteps) {
  const std::string data = test::synthetic_data(kData, 96);
  EnvVar hook("MESHTRAIN_TEST_ALLOC_AT_STEP", "3");
  Config c = graphed(test::moe_mla(test::tiny_config(data, "graph-alloc")));
  const std::string error = train_error(c);
  EXPECT_NE(error.find("step 3 cannot be captured"), std::string::npos) << error;
  EXPECT_NE(error.find("memory use differs from the step before"), std::string::npos) << error;
}

}  // namespace
