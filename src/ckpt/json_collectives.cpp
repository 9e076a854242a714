#include "json_collectives.h"

#include <torch/torch.h>

#include <cstring>
#include <string>

namespace meshtrain::ckpt_comm {

namespace {

std::string dump(const nlohmann::json& j) {
  // Error messages may carry non-UTF-8 path bytes; replace them rather than throw mid-collective.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

at::Tensor to_bytes(const std::string& s) {
  at::Tensor t = at::empty({static_cast<int64_t>(s.size())}, at::kByte);
  if (!s.empty()) std::memcpy(t.data_ptr(), s.data(), s.size());
  return t;
}

}  // namespace

nlohmann::json broadcast_json(Communicator& comm, const nlohmann::json& j, int root) {
  const std::string text = comm.rank() == root ? dump(j) : std::string();
  at::Tensor len = at::tensor({static_cast<int64_t>(text.size())}, at::kLong);
  comm.broadcast(len, root);
  at::Tensor bytes = comm.rank() == root ? to_bytes(text) : at::empty({len.item<int64_t>()}, at::kByte);
  comm.broadcast(bytes, root);
  return nlohmann::json::parse(std::string(static_cast<const char*>(bytes.data_ptr()), bytes.numel()));
}

std::vector<nlohmann::json> all_gather_json(Communicator& comm, const nlohmann::json& j) {
  // Records differ in length, so pad to the longest.
  const std::string text = dump(j);
  const at::Tensor lens = comm.all_gather(at::tensor({static_cast<int64_t>(text.size())}, at::kLong));
  const int64_t longest = lens.max().item<int64_t>();
  at::Tensor padded = at::zeros({longest}, at::kByte);
  if (!text.empty()) std::memcpy(padded.data_ptr(), text.data(), text.size());
  const at::Tensor all = comm.all_gather(padded).contiguous();
  std::vector<nlohmann::json> out;
  for (int r = 0; r < comm.size(); ++r) {
    const auto* p = static_cast<const char*>(all.data_ptr()) + r * longest;
    out.push_back(nlohmann::json::parse(std::string(p, lens[r].item<int64_t>())));
  }
  return out;
}

}  // namespace meshtrain::ckpt_comm
