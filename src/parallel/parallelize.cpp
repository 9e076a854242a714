// parallelize(): the one place parallelism is applied (see parallelize.h).
#include "meshtrain/parallel/parallelize.h"

#include <torch/torch.h>

#include "meshtrain/core/check.h"
#include "meshtrain/parallel/data_parallel.h"
#include "meshtrain/parallel/expert_parallel.h"
#include "meshtrain/parallel/tensor_parallel.h"

namespace meshtrain {

std::vector<StageRange> partition_stages(int64_t n_layers, int pp, int64_t v, bool v_shape) {
  MT_CHECK(pp >= 1 && pp <= n_layers, "n_device_axis: pp=", pp, " needs at least one layer per stage but the model has ",
           n_layers, " layers (model_config.blocks * layers_per_block)");
  MT_CHECK(v >= 1, "virtual_stages must be >= 1, got ", v);
  MT_CHECK(v == 1 || n_layers % (pp * v) == 0, "virtual_stages=", v, " with pp=", pp, " needs the model's ", n_layers,
           " layers (model_config.blocks * layers_per_block) to be a multiple of pp * virtual_stages = ", pp * v);
  const int64_t n_virtual = pp * v;
  std::vector<LayerSpan> spans;  // per virtual stage
  int64_t first = 0;
  for (int64_t k = 0; k < n_virtual; ++k) {
    const int64_t n = n_layers / n_virtual + (k < n_layers % n_virtual ? 1 : 0);
    spans.push_back({first, first + n});
    first += n;
  }
  MT_ASSERT(!v_shape || v == 2, "the V layout has two chunks a stage, got ", v);
  std::vector<StageRange> out;
  for (int s = 0; s < pp; ++s) {
    StageRange r;
    r.first_layer = spans[static_cast<size_t>(s)].first;
    r.end_layer = spans[static_cast<size_t>(s)].end;
    for (int64_t c = 1; c < v; ++c)
      r.later_chunks.push_back(spans[static_cast<size_t>(v_shape ? 2 * pp - 1 - s : c * pp + s)]);
    r.has_embedding = s == 0;
    r.has_head = v_shape ? s == 0 : s == pp - 1;
    r.v_shape = v_shape;
    out.push_back(r);
  }
  return out;
}

int64_t virtual_stages(const Config& cfg, int64_t pp) {
  if (pp == 1) return 1;
  if (cfg.pipeline_schedule == PipelineSchedule::Zbv) return 2;
  return cfg.pipeline_schedule == PipelineSchedule::Interleaved ? cfg.virtual_stages : 1;
}

ParallelModel::~ParallelModel() = default;

std::unique_ptr<ParallelModel> build_parallel_model(const Config& cfg, Mesh& mesh, bool meta) {
  auto owned = std::make_unique<ParallelModel>();
  ParallelModel& pm = *owned;
  const bool v_shape = cfg.pipeline_schedule == PipelineSchedule::Zbv && mesh.shape().pp > 1;
  pm.range = partition_stages(cfg.model.n_layers(), mesh.shape().pp, virtual_stages(cfg, mesh.shape().pp),
                              v_shape)[mesh.coord().pp];
  MT_CHECK(!meta || mesh.shape().tp == 1, "the meta device models one unsharded rank (tp = 1), got tp = ",
           mesh.shape().tp);
  pm.factory = meta ? std::make_unique<MetaLayerFactory>() : make_layer_factory(cfg, mesh);
  pm.factory->set_seed(cfg.seed);
  // One precision policy on every device (model/mixed_precision.h).
  pm.factory->set_precision(std::make_shared<MixedPrecision>(
      PrecisionPolicy::from_model_dtype(cfg.model.model_dtype, cfg.model.fp8_recipe)));
  // FP8 under context parallelism: scale groups spanning tokens take their
  // amax over every chunk of the sequences (model/fp8_linear.h).
  if (cfg.model.fp8_recipe != Fp8Recipe::None && mesh.shape().cp > 1) {
    Communicator* cp = &mesh.cp();
    pm.factory->precision()->set_fp8_token_reduce([cp](at::Tensor& amax) { cp->all_reduce(amax, ReduceOp::Max); });
  }
  // Zero-bubble schedules defer the weight-gradient GEMMs of a backward (B)
  // to a pass of their own (W): the layers take them from mixed_matmul.h.
  if (mesh.shape().pp > 1 && (cfg.pipeline_schedule == PipelineSchedule::ZbH1 ||
                              cfg.pipeline_schedule == PipelineSchedule::Zbv))
    pm.factory->precision()->set_split_backward(true);
  // Expert parallelism: MoE layers keep their share of the experts and reach
  // the others through the ep group.
  MT_CHECK(mesh.shape().ep == cfg.device.expert_parallel, "the mesh has expert_parallel ", mesh.shape().ep,
           " but device_config.expert_parallel is ", cfg.device.expert_parallel);
  if (mesh.shape().ep > 1) pm.factory->set_token_dispatcher(make_all_to_all_dispatcher(mesh.ep()));
  pm.model = std::make_shared<Transformer>(cfg.model, *pm.factory, pm.range);
  // After tp (the factory) and before dp, as torchtitan orders them.
  pm.model->set_activation_checkpointing(cfg.activation_checkpointing);
  const auto& layouts = pm.factory->layouts();
  for (const auto& item : pm.model->named_parameters()) {
    ParamInfo p;
    p.path = item.key();
    p.tensor = item.value();
    // Every parameter is made by the factory, which records its facts
    // (model/layers.h ParamLayout): nothing here is read from its name.
    const auto it = layouts.find(p.path);
    MT_ASSERT(it != layouts.end(), "parameter ", p.path,
              " was not created through the LayerFactory: its layout (tp split, sequence-parallel gradient) is unknown");
    p.layout = it->second;
    // Norm weights (1-D) get no weight decay, as in GPT-2/Megatron.
    p.decay = p.tensor.dim() >= 2;
    // Under sequence parallelism these see only this rank's sequence shard.
    p.sequence_parallel_grad = pm.factory->sequence_parallel() && p.layout.reads_sequence_shard;
    pm.params.push_back(std::move(p));
  }
  return owned;
}

std::unique_ptr<ParallelModel> parallelize(const Config& cfg, Mesh& mesh, const at::Device& device, bool meta) {
  // 1-3: tp through the layer factory, this rank's pipeline stage(s), and
  // activation recomputation in the blocks (activation_checkpointing).
  std::unique_ptr<ParallelModel> pm = build_parallel_model(cfg, mesh, meta);
  // 4: the device; the parameter list follows the moved tensors.
  pm->model->to(device);
  for (auto& p : pm->params) p.tensor = pm->model->named_parameters()[p.path];
  // 5: the data-parallel strategy over what this rank holds.
  pm->data_parallel = make_data_parallel(*pm, mesh, cfg);
  return pm;
}

}  // namespace meshtrain
