// Architecture presets: Jaxformer's model as the keys' defaults (architecture.h).
#include "architecture.h"

namespace meshtrain::schema {

namespace {

const nlohmann::json* model_section(const nlohmann::json& j) {
  if (!j.is_object()) return nullptr;
  auto it = j.find("model_config");
  return it != j.end() && it->is_object() ? &*it : nullptr;
}

}  // namespace

Architecture resolve_architecture(const nlohmann::json& j) {
  const nlohmann::json* m = model_section(j);
  if (!m) return Architecture::Meshtrain;
  auto a = m->find("architecture");
  if (a != m->end() && a->is_string()) {
    const std::optional<Architecture> given = parse_choice<Architecture>(a->get<std::string>());
    if (given && *given != Architecture::Auto) return *given;
  }
  const bool jaxformer_layout = m->contains("latent_dim") && !m->contains("attention") && !m->contains("ffn");
  return jaxformer_layout ? Architecture::Jaxformer : Architecture::Meshtrain;
}

void apply_architecture(const nlohmann::json& j, Architecture arch, ModelConfig& m) {
  // Only Jaxformer is written back: a meshtrain file keeps the value it had
  // ("auto" by default), so config_from_json(to_json(c)) reproduces any c.
  if (arch != Architecture::Jaxformer) return;
  m.architecture = arch;
  const nlohmann::json* given = model_section(j);
  auto unset = [&](const char* key) { return !given || !given->contains(key); };
  // Each value is what Jaxformer's model.py / utils.py do (docs/JAXFORMER.md).
  if (unset("attention")) m.attention = AttentionKind::Mla;                    // MLA in every layer
  if (unset("ffn")) m.ffn = m.n_experts > 0 ? FfnKind::Moe : FfnKind::Dense;   // MoE when the file has experts
  if (unset("moe_layers")) m.moe_layers = MoeLayers::LastInBlock;              // use_moe = (i == layers - 1)
  if (unset("mla_last_layer_no_rope")) m.mla_last_layer_no_rope = true;        // dhR = 0 in that layer
  if (unset("mla_rope_input")) m.mla_rope_input = MlaRopeInput::JointLatent;   // Dense(dhR) reads the 2*latent output
  if (unset("linear_bias")) m.linear_bias = true;                              // its Dense has kernel + bias
  if (unset("norm_bias")) m.norm_bias = true;                                  // its RMSNorm has gamma + beta
  if (unset("router_score")) m.router_score = RouterScore::Sigmoid;            // NoisyKGate: sigmoid, top-k renormalised
  if (unset("shared_expert")) m.shared_expert = SharedExpert::LinearDiscarded; // MoE returns expert_outputs only
  if (unset("capacity_factor")) m.capacity_factor = 1.0;                       // modelConfig's default
  if (unset("tie_embeddings")) m.tie_embeddings = true;                        // Embed.attend as the head
  if (unset("mlp_hidden")) m.mlp_hidden = 0;                                   // 4 * model_dimension, experts too
  if (unset("active_params_scope")) m.active_params_scope = ActiveParamsScope::Layers; // its 343,321,728 active
}

}  // namespace meshtrain::schema
