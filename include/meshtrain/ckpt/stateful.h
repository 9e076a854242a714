#pragma once
// Components own their saved state (torchtitan's Stateful): the model, the
// optimizer, the data loaders and the RNG each say what they save -- named
// tensors with their shard layout, and JSON values -- and restore themselves
// from a checkpoint. The Checkpointer (ckpt/checkpointer.h) loops over them and
// knows no model types; a new piece of state is one more component.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "meshtrain/ckpt/checkpoint.h"

namespace meshtrain {

// What one component saves. Tensor names are the component's own: the
// checkpointer prefixes them with "<component>." in the checkpoint. Values are
// taken from rank 0, so they must agree on every rank (or rank 0's must do).
struct ComponentState {
  std::vector<NamedTensor> tensors;
  nlohmann::json values = nlohmann::json::object();
};

// A component's view of a checkpoint: its tensors by the names it saved them
// under, and its values.
class ComponentReader {
 public:
  ComponentReader(const CheckpointReader& reader, std::string component, nlohmann::json values)
      : reader_(reader), component_(std::move(component)), values_(std::move(values)) {}

  const std::string& dir() const { return reader_.dir(); }
  const std::string& component() const { return component_; }
  // The name in the checkpoint: "<component>.<name>".
  std::string full_name(const std::string& name) const { return component_ + "." + name; }
  bool has(const std::string& name) const { return reader_.has(full_name(name)); }
  std::vector<int64_t> global_shape(const std::string& name) const { return reader_.global_shape(full_name(name)); }
  at::ScalarType dtype(const std::string& name) const { return reader_.dtype(full_name(name)); }
  at::Tensor read(const std::string& name, const ShardSpec& want) const { return reader_.read(full_name(name), want); }
  at::Tensor read(const std::string& name) const { return reader_.read(full_name(name)); }
  // The component's values; an empty object when the checkpoint has none.
  const nlohmann::json& values() const { return values_; }

 private:
  const CheckpointReader& reader_;
  std::string component_;
  nlohmann::json values_;
};

class Stateful {
 public:
  virtual ~Stateful() = default;
  // Collective when the state is spread over ranks (ZeRO-1 and FSDP gather
  // their moments to the writers): every rank calls it, in the same
  // component order. Tensors this rank does not write may be undefined.
  virtual ComponentState state() const = 0;
  // Restores everything state() saved, or throws naming what the checkpoint
  // lacks: a checkpoint is loaded completely or not at all (the checkpointer
  // then falls back to an older one), never half with zeros.
  virtual void load_state(const ComponentReader& in) = 0;
};

}  // namespace meshtrain
