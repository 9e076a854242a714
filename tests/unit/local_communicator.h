#pragma once
// A world of one process for unit tests: every collective is the identity.
#include <torch/torch.h>

#include "meshtrain/core/check.h"
#include "meshtrain/dist/comm.h"

namespace meshtrain {

class LocalCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }
  void all_reduce(at::Tensor&, ReduceOp) override {}
  at::Tensor all_gather(const at::Tensor& t, int64_t) override { return t.clone(); }
  at::Tensor reduce_scatter(const at::Tensor& t, int64_t) override { return t.clone(); }
  void broadcast(at::Tensor&, int) override {}
  at::Tensor gather(const at::Tensor& t, int) override { return t.clone(); }
  void send(const at::Tensor&, int, int) override { MT_FAIL("LocalCommunicator has no peer to send to"); }
  void recv(at::Tensor&, int, int) override { MT_FAIL("LocalCommunicator has no peer to receive from"); }
  void send_recv(const at::Tensor&, int, at::Tensor&, int, int, int) override {
    MT_FAIL("LocalCommunicator has no peer to exchange with");
  }
  at::Tensor all_to_all(const at::Tensor& t) override { return t.clone(); }
  at::Tensor all_to_all_v(const at::Tensor& t, const std::vector<int64_t>&, const std::vector<int64_t>&) override {
    return t.clone();
  }
  void barrier() override {}
};

}  // namespace meshtrain
