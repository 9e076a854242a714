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
  // FSDP (zero_stage 2/3) reduces this gradient itself, during backward: the
  // step's gradient synchronisation and norm leave it alone.
  bool fsdp_reduced = false;
  // zero_stage 0 with overlap_grad_reduce: the dp sum runs during backward
  // (parallel/grad_buckets.h); synchronize_gradients only waits for it.
  bool bucket_reduced = false;
};

class Fsdp;
class GradBuckets;

struct ParallelModel {
  std::unique_ptr<LayerFactory> factory;
  std::shared_ptr<Transformer> model;
  StageRange range;
  std::vector<ParamInfo> params;
  std::shared_ptr<Fsdp> fsdp;  // zero_stage 2/3 (parallel/fsdp.h), else nullptr
  // zero_stage 0, dp > 1, overlap_grad_reduce (parallel/grad_buckets.h), else nullptr.
  // Last: destroyed first, it unhooks the parameters.
  std::shared_ptr<GradBuckets> grad_buckets;
};

// Layer ranges per pipeline rank. v = 1: contiguous, n_layers split as evenly
// as possible, earlier stages taking the remainder. v > 1 (the interleaved
// schedule): n_layers split evenly into pp * v virtual stages in Megatron's
// layout, chunk c of rank r being virtual stage c * pp + r (so the data
// visits every rank v times); n_layers must be a multiple of pp * v.
std::vector<StageRange> partition_stages(int64_t n_layers, int pp, int64_t v = 1);

// Layer chunks per pipeline rank on a mesh of pp stages: virtual_stages under
// the interleaved schedule with pp > 1, else 1 (at pp = 1 no schedule applies).
int64_t virtual_stages(const Config& cfg, int64_t pp);

// meta: parameters are meta tensors, nothing drawn (the performance model; tp = 1).
// Steps 1-3 of parallelize() below, on the CPU, without data parallelism.
ParallelModel build_parallel_model(const Config& cfg, Mesh& mesh, bool meta = false);

// The one place parallelism is applied to a model, in a fixed order (as
// torchtitan's parallelize): 1. tp: layers built sharded through the
// LayerFactory; 2. the pipeline: this rank's stage (or interleaved chunks);
// 3. activation recomputation (activation_checkpointing, in the blocks);
// 4. the device; 5. data parallelism: FSDP units and layer hooks
// (zero_stage 2/3, pm.fsdp) or DDP gradient buckets (zero_stage 0 with
// overlap_grad_reduce, pm.grad_buckets). ZeRO-1 needs nothing installed: its
// optimizer (parallel/optimizer.h, make_optimizer) owns the sharded slices.
// Fills pm in place: FSDP and the buckets keep a reference to it, so pm must
// stay where it is (never moved or copied afterwards).
void parallelize(ParallelModel& pm, const Config& cfg, Mesh& mesh, const at::Device& device, bool meta = false);
// Step 5 alone, on a model built by build_parallel_model and moved to its device.
void apply_data_parallel(ParallelModel& pm, Mesh& mesh, const Config& cfg);

}  // namespace meshtrain
