#include "meshtrain/model/recompute.h"

#include <torch/torch.h>

#include <optional>

#include "meshtrain/core/check.h"

namespace meshtrain {

namespace {

// Generator states of the devices a segment may draw dropout masks on.
struct RngStates {
  at::Tensor cpu;
  std::optional<at::Generator> cuda_gen;
  at::Tensor cuda;

  static RngStates capture(const at::Tensor& x) {
    RngStates s;
    s.cpu = at::detail::getDefaultCPUGenerator().get_state();
    if (x.is_cuda()) {
      s.cuda_gen = at::globalContext().defaultGenerator(x.device());
      s.cuda = s.cuda_gen->get_state();
    }
    return s;
  }
  void restore() const {
    at::Generator gen = at::detail::getDefaultCPUGenerator();  // a handle: shares the default's state
    gen.set_state(cpu);
    if (cuda_gen) {
      at::Generator g = *cuda_gen;
      g.set_state(cuda);
    }
  }
};

// What backward needs besides the input: the segment and the forward's RNG.
// A CustomClassHolder so it can ride in the autograd context's saved_data.
struct Recompute : torch::CustomClassHolder {
  Segment fn;
  RngStates rng;
  bool has_aux = false, has_z = false;  // which MoE losses the segment adds (set by forward)
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  // Outputs: {hidden, aux_loss, z_loss}; the two losses are zeros when the
  // segment adds none (dense layers), and then receive no gradient.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                c10::intrusive_ptr<Recompute> rec, ForwardAux* stats) {
    ForwardAux local;
    at::Tensor y = rec->fn(x, &local);
    ctx->save_for_backward({x});
    rec->has_aux = local.aux_loss.defined();
    rec->has_z = local.z_loss.defined();
    ctx->saved_data["recompute"] = at::IValue::make_capsule(rec);
    for (auto& e : local.expert_tokens) stats->expert_tokens.push_back(e);
    if (local.dropped.defined())
      stats->dropped = stats->dropped.defined() ? stats->dropped + local.dropped : local.dropped;
    if (local.assigned.defined())
      stats->assigned = stats->assigned.defined() ? stats->assigned + local.assigned : local.assigned;
    const auto zero = at::zeros({}, x.options().dtype(at::kFloat));
    return {y, local.aux_loss.defined() ? local.aux_loss : zero, local.z_loss.defined() ? local.z_loss : zero.clone()};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables().at(0);
    auto rec = c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());

    at::Tensor xi = x.detach().requires_grad_(true);
    {
      // Replay the forward's masks, then give the generators back their
      // present state so later draws do not repeat.
      const RngStates now = RngStates::capture(x);
      rec->rng.restore();
      at::AutoGradMode enable(true);
      ForwardAux local;
      at::Tensor y = rec->fn(xi, &local);
      now.restore();
      std::vector<at::Tensor> roots, root_grads;
      auto add = [&](const at::Tensor& out, const at::Tensor& g) {
        if (out.defined() && out.requires_grad() && g.defined()) {
          roots.push_back(out);
          root_grads.push_back(g);
        }
      };
      add(y, grads.at(0));
      if (rec->has_aux) add(local.aux_loss, grads.at(1));
      if (rec->has_z) add(local.z_loss, grads.at(2));
      // Parameter gradients accumulate into .grad() here (a reentrant
      // backward, as torch.utils.checkpoint's reentrant variant).
      if (!roots.empty()) torch::autograd::backward(roots, root_grads);
    }
    return {xi.grad(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor recompute_in_backward(const Segment& fn, const at::Tensor& x, ForwardAux* aux) {
  ForwardAux sink;  // the caller does not collect MoE terms
  if (aux == nullptr) aux = &sink;
  if (!at::GradMode::is_enabled() || !x.requires_grad()) return fn(x, aux);
  auto rec = c10::make_intrusive<Recompute>();
  rec->fn = fn;
  rec->rng = RngStates::capture(x);
  auto out = CheckpointFunction::apply(x, rec, aux);
  if (rec->has_aux) aux->add_aux(out.at(1));
  if (rec->has_z) aux->add_z(out.at(2));
  return out.at(0);
}

}  // namespace meshtrain
