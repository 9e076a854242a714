#pragma once
// Small JSON records between ranks, as bytes in tensors: the few collectives a
// save or a resume needs work on any Communicator, and a failure travels with
// the records so no rank waits on a peer that gave up.
#include <nlohmann/json.hpp>
#include <vector>

#include "meshtrain/dist/comm.h"

namespace meshtrain::ckpt_comm {

// root's j on every rank.
nlohmann::json broadcast_json(Communicator& comm, const nlohmann::json& j, int root);
// Every rank's j on every rank, in rank order.
std::vector<nlohmann::json> all_gather_json(Communicator& comm, const nlohmann::json& j);

}  // namespace meshtrain::ckpt_comm
