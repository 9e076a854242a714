#pragma once
// Config keys with a fixed set of values are enums, parsed once when the
// config loads (src/config/, through the one table per enum below). The same
// table writes them back: the JSON a checkpoint stores, error messages,
// `plan` output. Code outside config/ compares enums, never strings, and never
// re-validates a value: the config guarantees it is one of these.
#include <array>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>

#include <nlohmann/json_fwd.hpp>

namespace meshtrain {

enum class ModelDtype { Float32, Bfloat16 };                   // model_config.model_dtype
// FP8 training of the linear layers' GEMMs on top of bfloat16 (model/fp8_linear.h):
// none | tensorwise (torchtitan's) | rowwise (torchtitan's) | blockwise (DeepSeek-V3's).
enum class Fp8Recipe { None, Tensorwise, Rowwise, Blockwise };  // model_config.fp8_recipe
enum class AttentionKind { Mha, Mla };                          // model_config.attention
enum class FfnKind { Dense, Moe };                              // model_config.ffn
enum class RouterScore { Softmax, Sigmoid };                    // model_config.router_score
enum class Architecture { Auto, Meshtrain, Jaxformer };         // model_config.architecture
enum class MlaRopeInput { Split, JointLatent };                 // model_config.mla_rope_input
enum class MoeLayers { All, LastInBlock };                      // model_config.moe_layers
enum class SharedExpert { Mlp, Linear, LinearDiscarded };       // model_config.shared_expert
enum class ActiveParamsScope { Model, Layers };                 // model_config.active_params_scope
enum class MlpActivation { Gelu, Swiglu };                      // model_config.mlp_activation
// A gated activation computes act(w_gate x) * (w_in x): the MLP and the experts
// get a third projection, w_gate (the parameter count, plan and the Hugging
// Face tensor mapping read this). Its formula: model/activation.h.
constexpr bool is_gated(MlpActivation a) { return a == MlpActivation::Swiglu; }
enum class DataFormat { Llmc, NanoGpt };                        // data_config.format
enum class DeviceChoice { Auto, Cpu, Cuda };                    // device_config.device
enum class CollectivesChoice { Auto, Nccl, Mpi };               // device_config.collectives
// zb-h1 and zbv: zero-bubble schedules (parallel/pipeline_plan.h), each
// backward split into B and W; zbv lays two chunks a stage out in a V.
enum class PipelineSchedule { Gpipe, OneFOneB, Interleaved, ZbH1, Zbv };   // pipeline_schedule
// none: keep everything; full: recompute each transformer layer from its input;
// selective: recompute only each layer's feed-forward (model/recompute.h).
enum class ActivationCheckpointing { None, Full, Selective };  // activation_checkpointing
enum class NanPolicy { Skip, Stop };                            // nan_policy
// device_config.attention_backend: the kernel CUDA's sdpa tries first.
enum class AttentionBackend { Auto, Cudnn, Flash, Efficient, Math };

template <class E>
struct Choice {
  E value;
  const char* name;  // as the config file spells it
};

// ChoiceTable<E>::entries: every value of E with its name, in the order the
// allowed values are listed in error messages.
template <class E>
struct ChoiceTable;

template <>
struct ChoiceTable<ModelDtype> {
  static constexpr std::array<Choice<ModelDtype>, 2> entries{
      {{ModelDtype::Float32, "float32"}, {ModelDtype::Bfloat16, "bfloat16"}}};
};
template <>
struct ChoiceTable<Fp8Recipe> {
  static constexpr std::array<Choice<Fp8Recipe>, 4> entries{{{Fp8Recipe::None, "none"},
                                                             {Fp8Recipe::Tensorwise, "tensorwise"},
                                                             {Fp8Recipe::Rowwise, "rowwise"},
                                                             {Fp8Recipe::Blockwise, "blockwise"}}};
};
template <>
struct ChoiceTable<AttentionKind> {
  static constexpr std::array<Choice<AttentionKind>, 2> entries{
      {{AttentionKind::Mha, "mha"}, {AttentionKind::Mla, "mla"}}};
};
template <>
struct ChoiceTable<FfnKind> {
  static constexpr std::array<Choice<FfnKind>, 2> entries{{{FfnKind::Dense, "dense"}, {FfnKind::Moe, "moe"}}};
};
template <>
struct ChoiceTable<RouterScore> {
  static constexpr std::array<Choice<RouterScore>, 2> entries{
      {{RouterScore::Softmax, "softmax"}, {RouterScore::Sigmoid, "sigmoid"}}};
};
template <>
struct ChoiceTable<Architecture> {
  static constexpr std::array<Choice<Architecture>, 3> entries{
      {{Architecture::Auto, "auto"}, {Architecture::Meshtrain, "meshtrain"}, {Architecture::Jaxformer, "jaxformer"}}};
};
template <>
struct ChoiceTable<MlaRopeInput> {
  static constexpr std::array<Choice<MlaRopeInput>, 2> entries{
      {{MlaRopeInput::Split, "split"}, {MlaRopeInput::JointLatent, "joint_latent"}}};
};
template <>
struct ChoiceTable<MoeLayers> {
  static constexpr std::array<Choice<MoeLayers>, 2> entries{
      {{MoeLayers::All, "all"}, {MoeLayers::LastInBlock, "last_in_block"}}};
};
template <>
struct ChoiceTable<SharedExpert> {
  static constexpr std::array<Choice<SharedExpert>, 3> entries{{{SharedExpert::Mlp, "mlp"},
                                                                 {SharedExpert::Linear, "linear"},
                                                                 {SharedExpert::LinearDiscarded, "linear_discarded"}}};
};
template <>
struct ChoiceTable<ActiveParamsScope> {
  static constexpr std::array<Choice<ActiveParamsScope>, 2> entries{
      {{ActiveParamsScope::Model, "model"}, {ActiveParamsScope::Layers, "layers"}}};
};
template <>
struct ChoiceTable<MlpActivation> {
  static constexpr std::array<Choice<MlpActivation>, 2> entries{
      {{MlpActivation::Gelu, "gelu"}, {MlpActivation::Swiglu, "swiglu"}}};
};
template <>
struct ChoiceTable<DataFormat> {
  static constexpr std::array<Choice<DataFormat>, 2> entries{
      {{DataFormat::Llmc, "llmc"}, {DataFormat::NanoGpt, "nanogpt"}}};
};
template <>
struct ChoiceTable<DeviceChoice> {
  static constexpr std::array<Choice<DeviceChoice>, 3> entries{
      {{DeviceChoice::Auto, "auto"}, {DeviceChoice::Cpu, "cpu"}, {DeviceChoice::Cuda, "cuda"}}};
};
template <>
struct ChoiceTable<CollectivesChoice> {
  static constexpr std::array<Choice<CollectivesChoice>, 3> entries{
      {{CollectivesChoice::Auto, "auto"}, {CollectivesChoice::Nccl, "nccl"}, {CollectivesChoice::Mpi, "mpi"}}};
};
template <>
struct ChoiceTable<PipelineSchedule> {
  static constexpr std::array<Choice<PipelineSchedule>, 5> entries{{{PipelineSchedule::Gpipe, "gpipe"},
                                                                     {PipelineSchedule::OneFOneB, "1f1b"},
                                                                     {PipelineSchedule::Interleaved, "interleaved"},
                                                                     {PipelineSchedule::ZbH1, "zb-h1"},
                                                                     {PipelineSchedule::Zbv, "zbv"}}};
};
template <>
struct ChoiceTable<ActivationCheckpointing> {
  static constexpr std::array<Choice<ActivationCheckpointing>, 3> entries{
      {{ActivationCheckpointing::None, "none"},
       {ActivationCheckpointing::Full, "full"},
       {ActivationCheckpointing::Selective, "selective"}}};
};
template <>
struct ChoiceTable<AttentionBackend> {
  static constexpr std::array<Choice<AttentionBackend>, 5> entries{{{AttentionBackend::Auto, "auto"},
                                                                    {AttentionBackend::Cudnn, "cudnn"},
                                                                    {AttentionBackend::Flash, "flash"},
                                                                    {AttentionBackend::Efficient, "efficient"},
                                                                    {AttentionBackend::Math, "math"}}};
};
template <>
struct ChoiceTable<NanPolicy> {
  static constexpr std::array<Choice<NanPolicy>, 2> entries{{{NanPolicy::Skip, "skip"}, {NanPolicy::Stop, "stop"}}};
};

template <class E, class = void>
struct is_choice : std::false_type {};
template <class E>
struct is_choice<E, std::void_t<decltype(ChoiceTable<E>::entries)>> : std::true_type {};
template <class E>
inline constexpr bool is_choice_v = is_choice<E>::value;

// The name the config file uses for v.
template <class E>
constexpr const char* choice_name(E v) {
  for (const auto& c : ChoiceTable<E>::entries)
    if (c.value == v) return c.name;
  return "?";  // unreachable: every enumerator has a row (choices_test checks)
}

// The value named s; nullopt when s names none (the caller names the key).
template <class E>
std::optional<E> parse_choice(std::string_view s) {
  for (const auto& c : ChoiceTable<E>::entries)
    if (s == c.name) return c.value;
  return std::nullopt;
}

// "mha, mla": the allowed names, for error messages.
template <class E>
std::string choice_list() {
  std::string list;
  for (const auto& c : ChoiceTable<E>::entries) list += (list.empty() ? "" : ", ") + std::string(c.name);
  return list;
}

// Messages (MT_CHECK streams its arguments) and gtest print the name.
template <class E, std::enable_if_t<is_choice_v<E>, int> = 0>
std::ostream& operator<<(std::ostream& os, E v) {
  return os << choice_name(v);
}

// JSON holds the name (found by argument lookup, so `j[key] = cfg.model.ffn`
// writes "moe", never nlohmann's default integer): checkpoints store the
// config as JSON and compare it on resume.
template <class E, std::enable_if_t<is_choice_v<E>, int> = 0>
void to_json(nlohmann::json& j, E v) {
  j = choice_name(v);
}

}  // namespace meshtrain
