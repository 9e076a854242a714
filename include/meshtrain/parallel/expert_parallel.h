#pragma once
// Expert parallelism (device_config.expert_parallel = ep): the token
// dispatcher that sends each routed token row to the rank of the ep group
// (Mesh::ep()) holding its expert and brings the expert's output back, with
// uneven all-to-alls (by counts) or even ones (by capacity slots). Both
// exchanges are autograd functions whose backward is the reverse exchange.
// Expert gradients are then summed over Mesh::expert_dp() by
// parallel/data_parallel.h, everything else over dp as without ep.
#include <memory>

#include "meshtrain/dist/comm.h"
#include "meshtrain/model/token_dispatcher.h"

namespace meshtrain {

// The all-to-all dispatcher over `ep` (which must outlive the model).
std::shared_ptr<TokenDispatcher> make_all_to_all_dispatcher(Communicator& ep);

}  // namespace meshtrain
