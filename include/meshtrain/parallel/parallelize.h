#pragma once
// Where the model and the mesh meet: parallelize() builds this rank's piece of the model
// (its pipeline stage, with layers sharded over tp through the factory) and
// lists its parameters with their global layout for the optimizer, gradient
// synchronisation and checkpoints.
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/dist/mesh.h"
#include "meshtrain/model/layers.h"
#include "meshtrain/model/transformer.h"

namespace meshtrain {

struct ParamInfo {
  std::string path;    // path in model->named_parameters()
  at::Tensor tensor;   // the parameter (this rank's shard)
  ParamLayout layout;  // global shape, tp split, saved name
  bool decay = true;   // weight decay applies (matrices; not norms)
  bool sequence_parallel_grad = false;  // grad is partial over tp: layout.reads_sequence_shard under sequence parallelism
};

class DataParallel;

// This rank's piece of the model and what parallelism made of it. It cannot
// move or be copied: the data-parallel strategy (its FSDP units, its
// gradient buckets' hooks) keeps references into it, so parallelize() hands
// it out behind a pointer.
struct ParallelModel {
  ParallelModel() = default;
  ParallelModel(const ParallelModel&) = delete;
  ParallelModel& operator=(const ParallelModel&) = delete;
  ParallelModel(ParallelModel&&) = delete;
  ParallelModel& operator=(ParallelModel&&) = delete;
  ~ParallelModel();

  std::unique_ptr<LayerFactory> factory;
  std::shared_ptr<Transformer> model;
  StageRange range;
  std::vector<ParamInfo> params;
  // The one owner of the gradients after backward and of the update
  // (parallel/data_parallel.h); null before step 5 of parallelize().
  // Last: destroyed first, it unhooks the model and the parameters.
  std::unique_ptr<DataParallel> data_parallel;
};

// Layer ranges per pipeline rank. v = 1: contiguous, n_layers split as evenly
// as possible, earlier stages taking the remainder. v > 1 (the interleaved
// schedule): n_layers split evenly into pp * v virtual stages in Megatron's
// layout, chunk c of rank r being virtual stage c * pp + r (so the data
// visits every rank v times); n_layers must be a multiple of pp * v.
// v_shape (the zbv schedule, v = 2): rank r's chunks are virtual stages r
// and 2pp - 1 - r, so rank 0 holds the first and the last layers.
std::vector<StageRange> partition_stages(int64_t n_layers, int pp, int64_t v = 1, bool v_shape = false);

// Layer chunks per pipeline rank on a mesh of pp stages: virtual_stages under
// the interleaved schedule, 2 under zbv, else 1 (at pp = 1 no schedule
// applies).
int64_t virtual_stages(const Config& cfg, int64_t pp);

// meta: parameters are meta tensors, nothing drawn (the performance model; tp = 1).
// Steps 1-3 of parallelize() below, on the CPU, without data parallelism.
std::unique_ptr<ParallelModel> build_parallel_model(const Config& cfg, Mesh& mesh, bool meta = false);

// The one place parallelism is applied to a model, in a fixed order (as
// torchtitan's parallelize): 1. tp: layers built sharded through the
// LayerFactory; 2. the pipeline: this rank's stage (or interleaved chunks);
// 3. activation recomputation (activation_checkpointing, in the blocks);
// 4. the device; 5. the data-parallel strategy (make_data_parallel): the
// one owner of gradient reduction and of the update -- replicated with DDP
// buckets, ZeRO-1, or FSDP units with their layer hooks -- chosen from
// zero_stage.
std::unique_ptr<ParallelModel> parallelize(const Config& cfg, Mesh& mesh, const at::Device& device,
                                           bool meta = false);

}  // namespace meshtrain
