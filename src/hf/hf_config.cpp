// config.json <-> model_config for the stock Llama and DeepSeek-V3 classes,
// and the list of what has no exact stock equivalent.
#include <algorithm>
#include <cmath>

#include "meshtrain/core/check.h"
#include "meshtrain/hf/hf_model.h"

namespace meshtrain {

namespace {

// Hugging Face's hidden_act for an MLP activation ("" where it has none).
std::string hf_hidden_act(MlpActivation a) {
  switch (a) {
    case MlpActivation::Gelu:
      return "gelu_pytorch_tanh";
    case MlpActivation::Swiglu:
      return "silu";
  }
  return "";
}

// meshtrain's RMSNorm epsilon (layers.h); HF configs carry theirs.
constexpr double kNormEps = 1e-6;

std::string join(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += "\n  - " + l;
  return s;
}

template <class T>
T get_or(const nlohmann::json& j, const char* key, T fallback) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? fallback : it->get<T>();
}

int64_t need_int(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  MT_CHECK(it != j.end() && it->is_number_integer(), "config.json: '", key, "' must be an integer");
  return it->get<int64_t>();
}

}  // namespace

std::vector<std::string> hf_unmappable(const ModelConfig& m) {
  std::vector<std::string> why;
  // Jaxformer's options have no counterpart in either stock class.
  if (m.linear_bias) why.push_back("linear_bias true: stock Llama / DeepSeek-V3 linear layers have no biases");
  if (m.norm_bias) why.push_back("norm_bias true: stock RMSNorms have no bias");
  if (m.attention == AttentionKind::Mha) {
    if (m.mtp_depth > 0) why.push_back("mtp_depth > 0 with attention 'mha': Llama has no multi-token prediction layers");
    if (hf_hidden_act(m.mlp_activation).empty())
      why.push_back(std::string("mlp_activation '") + choice_name(m.mlp_activation) + "': Llama has no hidden_act for it");
    if (m.ffn == FfnKind::Moe)
      why.push_back("ffn 'moe' with attention 'mha': stock Llama has no experts and DeepSeek-V3 needs attention 'mla'");
    return why;
  }
  // MLA: DeepSeek-V3.
  if (m.mlp_activation != MlpActivation::Swiglu)
    why.push_back(std::string("mlp_activation '") + choice_name(m.mlp_activation) + "' with attention 'mla': DeepSeek-V3's MLPs and experts are SwiGLU "
                  "(set model_config.mlp_activation 'swiglu')");
  if (!m.mla_latent_norm)
    why.push_back("mla_latent_norm false: DeepSeek-V3 normalises both MLA latents (q_a_layernorm, kv_a_layernorm)");
  if (m.dhR == 0) why.push_back("dhR 0: DeepSeek-V3 attention always has rope dims (qk_rope_head_dim > 0)");
  if (m.mla_rope_input != MlaRopeInput::Split)
    why.push_back(std::string("mla_rope_input '") + choice_name(m.mla_rope_input) +
                  "': DeepSeek-V3 reads the query rope from the query latent and the key rope from x ('split')");
  if (m.ffn == FfnKind::Moe) {
    if (m.router_score != RouterScore::Sigmoid)
      why.push_back(std::string("router_score '") + choice_name(m.router_score) +
                    "': DeepSeek-V3's router scores are sigmoid");
    if (m.moe_layers != MoeLayers::All && m.layers_per_block > 1)
      why.push_back(std::string("moe_layers '") + choice_name(m.moe_layers) +
                    "': DeepSeek-V3 has MoE in every layer after first_k_dense");
    if (m.n_shared > 0 && m.shared_expert != SharedExpert::Mlp)
      why.push_back(std::string("shared_expert '") + choice_name(m.shared_expert) +
                    "': DeepSeek-V3's shared experts are SwiGLU MLPs");
    if (m.n_experts / m.n_group < 2)
      why.push_back("fewer than 2 experts per group: DeepSeek-V3 scores a group by its two best experts");
  }
  return why;
}

std::string hf_model_type(const ModelConfig& m) {
  return m.attention == AttentionKind::Mla ? "deepseek_v3" : "llama";
}

nlohmann::json hf_config_json(const ModelConfig& m, int64_t eos_token_id) {
  const auto why = hf_unmappable(m);
  MT_CHECK(why.empty(), "this model has no exact stock Hugging Face equivalent:", join(why));
  nlohmann::json j;
  j["vocab_size"] = m.vocab_size;
  j["hidden_size"] = m.model_dimension;
  j["num_hidden_layers"] = m.n_layers();
  j["num_attention_heads"] = m.n_head;
  j["max_position_embeddings"] = m.T;
  j["rms_norm_eps"] = kNormEps;
  j["rope_theta"] = m.rope_theta;
  j["rope_scaling"] = nullptr;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["tie_word_embeddings"] = m.tie_embeddings;
  j["bos_token_id"] = eos_token_id;
  j["eos_token_id"] = eos_token_id;
  j["initializer_range"] = m.init_std;
  j["use_cache"] = true;
  j["torch_dtype"] = "float32";
  if (m.attention == AttentionKind::Mha) {  // Llama
    j["architectures"] = nlohmann::json::array({"LlamaForCausalLM"});
    j["model_type"] = "llama";
    j["num_key_value_heads"] = m.kv_heads();
    j["head_dim"] = m.head_dim();
    j["intermediate_size"] = m.hidden_dim();
    j["hidden_act"] = hf_hidden_act(m.mlp_activation);
    j["mlp_bias"] = !m.gated_mlp();  // the GELU MLP's constant up projection is a bias
    j["pretraining_tp"] = 1;
    return j;
  }
  j["architectures"] = nlohmann::json::array({"DeepseekV3ForCausalLM"});
  j["model_type"] = "deepseek_v3";
  j["num_key_value_heads"] = m.n_head;
  j["hidden_act"] = "silu";
  j["q_lora_rank"] = m.latent_dim;
  j["kv_lora_rank"] = m.latent_dim;
  j["qk_nope_head_dim"] = m.head_dim();
  j["v_head_dim"] = m.head_dim();
  j["qk_rope_head_dim"] = m.dhR;
  j["rope_interleave"] = true;  // the layout vLLM and llama.cpp assume; rows are permuted to it
  j["intermediate_size"] = m.dense_hidden_dim();
  const bool moe = m.ffn == FfnKind::Moe;
  // A dense model's multi-token prediction layers are dense too.
  j["first_k_dense_replace"] = moe ? m.first_k_dense : m.n_layers() + m.mtp_depth;
  // DeepSeek-V3's MTP modules: layers n_layers.. (stock transformers ignores them).
  j["num_nextn_predict_layers"] = m.mtp_depth;
  j["moe_intermediate_size"] = moe ? m.hidden_dim() : m.dense_hidden_dim();
  j["n_routed_experts"] = moe ? m.n_experts : 1;
  j["num_experts_per_tok"] = moe ? m.k : 1;
  // V3 always has a shared expert; none is exported as one whose output is 0.
  j["n_shared_experts"] = moe ? std::max<int64_t>(1, m.n_shared) : 1;
  j["n_group"] = moe ? m.n_group : 1;
  j["topk_group"] = moe ? m.topk_group : 1;
  j["norm_topk_prob"] = true;
  j["routed_scaling_factor"] = moe ? m.routed_scaling_factor : 1.0;
  return j;
}

namespace {

// The keys Llama and DeepSeek-V3 share, and what they may hold that meshtrain lacks.
void read_shared_keys(const nlohmann::json& j, ModelConfig& m, std::vector<std::string>& why) {
  m.vocab_size = need_int(j, "vocab_size");
  m.model_dimension = need_int(j, "hidden_size");
  m.n_head = need_int(j, "num_attention_heads");
  m.blocks = 1;
  m.layers_per_block = need_int(j, "num_hidden_layers");
  m.rope_theta = get_or<double>(j, "rope_theta", 10000.0);
  m.tie_embeddings = get_or<bool>(j, "tie_word_embeddings", false);
  m.mla_last_layer_no_rope = false;
  MT_CHECK(m.n_head > 0 && m.model_dimension % m.n_head == 0, "config.json: hidden_size (", m.model_dimension,
           ") must be a multiple of num_attention_heads (", m.n_head, ")");
  if (std::abs(get_or<double>(j, "rms_norm_eps", kNormEps) - kNormEps) > 1e-12)
    why.push_back("rms_norm_eps " + j.at("rms_norm_eps").dump() + " (meshtrain's RMSNorm uses 1e-6)");
  if (!j.value("rope_scaling", nlohmann::json()).is_null())
    why.push_back("rope_scaling " + j.at("rope_scaling").dump() + " (meshtrain has plain RoPE)");
  if (get_or<bool>(j, "attention_bias", false)) why.push_back("attention_bias true (meshtrain has no biases)");
  if (m.T > get_or<int64_t>(j, "max_position_embeddings", m.T))
    why.push_back("max_position_embeddings " + j.at("max_position_embeddings").dump() + " < model_config.T " +
                  std::to_string(m.T));
}

void read_llama(const nlohmann::json& j, const std::string& act, ModelConfig& m, std::vector<std::string>& why) {
  const int64_t hd = m.head_dim();
  m.attention = AttentionKind::Mha;
  m.ffn = FfnKind::Dense;
  m.n_kv_head = get_or<int64_t>(j, "num_key_value_heads", m.n_head);
  m.mlp_hidden = need_int(j, "intermediate_size");
  if (get_or<int64_t>(j, "head_dim", hd) != hd)
    why.push_back("head_dim " + j.at("head_dim").dump() + " != hidden_size / num_attention_heads = " +
                  std::to_string(hd));
  const bool bias = get_or<bool>(j, "mlp_bias", false);
  if (act == "silu" && !bias) {
    m.mlp_activation = MlpActivation::Swiglu;
  } else if (act == "gelu_pytorch_tanh" && bias) {
    m.mlp_activation = MlpActivation::Gelu;  // the tensors must show meshtrain's pattern (from_hf_tensors checks)
  } else {
    why.push_back("hidden_act '" + act + "' with mlp_bias " + (bias ? "true" : "false") +
                  " (meshtrain reads silu without bias, or gelu_pytorch_tanh with the bias of its GELU export)");
  }
}

// DeepSeek-V3's routed experts (after first_k_dense_replace dense layers).
void read_v3_experts(const nlohmann::json& j, const ModelConfig& base, ModelConfig& m, std::vector<std::string>& why) {
  m.ffn = FfnKind::Moe;
  m.dense_mlp_hidden = need_int(j, "intermediate_size");
  m.mlp_hidden = need_int(j, "moe_intermediate_size");
  m.n_experts = need_int(j, "n_routed_experts");
  m.k = need_int(j, "num_experts_per_tok");
  m.n_shared = get_or<int64_t>(j, "n_shared_experts", 0);
  m.router_score = RouterScore::Sigmoid;
  m.router_bias = true;
  // V3 checkpoints carry the bias, not how it was trained: the rate stays as configured.
  m.router_bias_update_rate = base.router_bias_update_rate;
  m.routed_scaling_factor = get_or<double>(j, "routed_scaling_factor", 1.0);
  m.n_group = get_or<int64_t>(j, "n_group", 1);
  m.topk_group = get_or<int64_t>(j, "topk_group", 1);
  if (!get_or<bool>(j, "norm_topk_prob", true))
    why.push_back("norm_topk_prob false (meshtrain normalises the chosen experts' gates)");
}

void read_deepseek_v3(const nlohmann::json& j, const std::string& act, const ModelConfig& base, ModelConfig& m,
                      std::vector<std::string>& why) {
  const int64_t hd = m.head_dim();
  m.attention = AttentionKind::Mla;
  m.mla_latent_norm = true;
  m.mlp_activation = MlpActivation::Swiglu;
  if (act != "silu") why.push_back("hidden_act '" + act + "' (DeepSeek-V3 in meshtrain is silu)");
  const auto q_rank = j.value("q_lora_rank", nlohmann::json());
  m.latent_dim = need_int(j, "kv_lora_rank");
  if (q_rank.is_null() || q_rank.get<int64_t>() != m.latent_dim)
    why.push_back("q_lora_rank " + q_rank.dump() + " != kv_lora_rank " + std::to_string(m.latent_dim) +
                  " (meshtrain's MLA shares one latent_dim)");
  m.dhR = need_int(j, "qk_rope_head_dim");
  if (m.dhR == 0) why.push_back("qk_rope_head_dim 0");
  for (const char* key : {"qk_nope_head_dim", "v_head_dim"})
    if (need_int(j, key) != hd)
      why.push_back(std::string(key) + " " + j.at(key).dump() + " != hidden_size / num_attention_heads = " +
                    std::to_string(hd));
  m.mtp_depth = get_or<int64_t>(j, "num_nextn_predict_layers", 0);
  const int64_t first_dense = get_or<int64_t>(j, "first_k_dense_replace", 0);
  if (first_dense >= m.n_layers()) {
    m.ffn = FfnKind::Dense;
    m.mlp_hidden = need_int(j, "intermediate_size");
  } else {
    m.first_k_dense = first_dense;
    read_v3_experts(j, base, m, why);
  }
}

}  // namespace

ModelConfig model_config_from_hf(const nlohmann::json& j, const ModelConfig& base) {
  // model_type names a Hugging Face class, not a meshtrain config choice.
  const std::string type = get_or<std::string>(j, "model_type", "");
  MT_CHECK(type == "llama" || type == "deepseek_v3", "config.json: model_type '", type,
           "' is not supported (meshtrain reads 'llama' and 'deepseek_v3')");
  // Training-only and run keys stay as configured.
  ModelConfig m;
  m.T = base.T;
  m.dropout_rate = base.dropout_rate;
  m.model_dtype = base.model_dtype;
  m.fp8_recipe = base.fp8_recipe;
  m.capacity_factor = base.capacity_factor;
  m.router_z_loss = base.router_z_loss;
  m.init_std = base.init_std;
  m.mtp_loss_weight = base.mtp_loss_weight;

  std::vector<std::string> why;
  read_shared_keys(j, m, why);
  const std::string act = get_or<std::string>(j, "hidden_act", "silu");
  if (type == "llama")
    read_llama(j, act, m, why);
  else
    read_deepseek_v3(j, act, base, m, why);
  MT_CHECK(why.empty(), "config.json (", type, ") has no exact meshtrain equivalent:", join(why));
  return m;
}

}  // namespace meshtrain
