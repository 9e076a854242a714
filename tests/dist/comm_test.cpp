// The MPI backend's collectives against closed-form results and byte counts,
// and the Mesh's coordinates and axis communicators for every factorisation of
// the world size. Runs under mpirun -np 1, 2 and 4.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "dist_env.h"
#include "meshtrain/core/check.h"
#include "meshtrain/dist/mesh.h"

namespace meshtrain {
namespace {

// Rank r contributes (r+1) * base, so reductions have closed forms:
// sum = P(P+1)/2 * base, max = P * base, min = base.
at::Tensor contribution(int rank, at::IntArrayRef shape, at::ScalarType dtype = at::kFloat) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return (at::arange(n, at::kDouble) * (rank + 1)).reshape(shape).to(dtype);
}

int64_t tri(int p) { return int64_t{p} * (p + 1) / 2; }

class CommTest : public ::testing::Test {
 protected:
  void SetUp() override { comm = test_runtime().world(); }
  int rank() const { return comm->rank(); }
  int size() const { return comm->size(); }
  std::unique_ptr<Communicator> comm;
};

TEST_F(CommTest, WorldMatchesRuntime) {
  EXPECT_EQ(comm->rank(), test_runtime().rank());
  EXPECT_EQ(comm->size(), test_runtime().size());
  EXPECT_EQ(comm->backend(), "mpi");
  EXPECT_EQ(comm->bytes_moved(), 0);
}

// Collectives run on autograd's backward thread too (runtime.h): the Runtime
// asks for SERIALIZED and got it (OpenMPI gives what is asked; FUNNELED here
// would mean the request was lowered).
TEST_F(CommTest, MpiGivesTheThreadLevelTheBackwardThreadNeeds) {
  EXPECT_EQ(kNeededThreadLevel, ThreadLevel::Serialized);
  EXPECT_GE(static_cast<int>(test_runtime().thread_level()), static_cast<int>(ThreadLevel::Serialized))
      << thread_level_name(test_runtime().thread_level());
}

TEST_F(CommTest, TooLowAThreadLevelIsRefusedNamingBothLevels) {
  EXPECT_NO_THROW(require_thread_level(ThreadLevel::Serialized, ThreadLevel::Multiple));
  EXPECT_NO_THROW(require_thread_level(ThreadLevel::Serialized, ThreadLevel::Serialized));
  try {
    require_thread_level(ThreadLevel::Serialized, ThreadLevel::Funneled);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* part : {"MPI_THREAD_SERIALIZED", "MPI_THREAD_FUNNELED", "backward thread", "ompi_info"})
      EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
  }
}

TEST_F(CommTest, AllReduceSumMaxMinEveryDtype) {
  const int p = size();
  for (auto dtype : {at::kFloat, at::kDouble, at::kInt, at::kLong, at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(std::string("dtype ") + c10::toString(dtype));
    const at::Tensor base = contribution(0, {3, 4}, dtype);
    const std::vector<std::pair<ReduceOp, int64_t>> cases{{ReduceOp::Sum, tri(p)}, {ReduceOp::Max, p}, {ReduceOp::Min, 1}};
    for (auto [op, factor] : cases) {
      at::Tensor t = contribution(rank(), {3, 4}, dtype);
      comm->reset_bytes();
      comm->all_reduce(t, op);
      EXPECT_EQ(t.scalar_type(), dtype);
      EXPECT_TRUE(at::equal(t.to(at::kDouble), base.to(at::kDouble) * factor)) << t;
      EXPECT_EQ(comm->bytes_moved(), static_cast<int64_t>(t.nbytes()));
      EXPECT_EQ(comm->bytes_by_op().at("all_reduce"), static_cast<int64_t>(t.nbytes()));
    }
  }
}

TEST_F(CommTest, AllReduceNonContiguousWritesBackInPlace) {
  at::Tensor storage = contribution(rank(), {4, 6});
  at::Tensor view = storage.t();  // non-contiguous view into storage
  comm->all_reduce(view, ReduceOp::Sum);
  EXPECT_TRUE(at::equal(storage, contribution(0, {4, 6}) * static_cast<double>(tri(size()))));
}

TEST_F(CommTest, AllGatherAlongDim0And1) {
  const int p = size();
  for (int64_t dim : {0, 1, -1}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    at::Tensor t = contribution(rank(), {2, 3});
    std::vector<at::Tensor> parts;
    for (int r = 0; r < p; ++r) parts.push_back(contribution(r, {2, 3}));
    comm->reset_bytes();
    at::Tensor out = comm->all_gather(t, dim);
    EXPECT_TRUE(at::equal(out, at::cat(parts, dim))) << out;
    EXPECT_EQ(comm->bytes_by_op().at("all_gather"), static_cast<int64_t>(p * t.nbytes()));
    EXPECT_EQ(comm->bytes_moved(), static_cast<int64_t>(out.nbytes()));
  }
}

TEST_F(CommTest, AllGatherNonContiguousInput) {
  at::Tensor t = contribution(rank(), {3, 2}).t();
  std::vector<at::Tensor> parts;
  for (int r = 0; r < size(); ++r) parts.push_back(contribution(r, {3, 2}).t());
  EXPECT_TRUE(at::equal(comm->all_gather(t, 1), at::cat(parts, 1)));
}

TEST_F(CommTest, ReduceScatterAlongDim0And1) {
  const int p = size();
  for (int64_t dim : {0, 1}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    std::vector<int64_t> shape{2, 3};
    shape[dim] *= p;
    at::Tensor t = contribution(rank(), shape);
    comm->reset_bytes();
    at::Tensor out = comm->reduce_scatter(t, dim);
    const int64_t chunk = shape[dim] / p;
    at::Tensor expected = (contribution(0, shape) * static_cast<double>(tri(p))).narrow(dim, rank() * chunk, chunk);
    EXPECT_TRUE(at::equal(out, expected)) << out;
    EXPECT_EQ(comm->bytes_by_op().at("reduce_scatter"), static_cast<int64_t>(t.nbytes()));
  }
}

TEST_F(CommTest, ReduceScatterBFloat16KeepsDtype) {
  at::Tensor t = contribution(rank(), {size() * 2, 2}, at::kBFloat16);
  at::Tensor out = comm->reduce_scatter(t, 0);
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  at::Tensor expected = (contribution(0, {size() * 2, 2}) * static_cast<double>(tri(size()))).narrow(0, rank() * 2, 2);
  EXPECT_TRUE(at::equal(out.to(at::kFloat), expected));
}

// Tensor-parallel reductions of bf16/fp16 activations travel in their own
// dtype (Megatron's way), not upcast to fp32: the bytes handed to MPI are
// numel * 2, half of an fp32 tensor's numel * 4. An fp32 upcast would count
// (and move) numel * 4 for both.
TEST_F(CommTest, SixteenBitFloatsReduceInTheirOwnDtypeAtHalfTheBytes) {
  const int p = size();
  const int64_t rows = 4 * p, cols = 6, numel = rows * cols;
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(std::string("dtype ") + c10::toString(dtype));
    const int64_t elem = dtype == at::kFloat ? 4 : 2;
    at::Tensor t = contribution(rank(), {rows, cols}, dtype);
    comm->reset_bytes();
    comm->all_reduce(t);
    EXPECT_EQ(comm->bytes_by_op().at("all_reduce"), numel * elem);
    at::Tensor x = contribution(rank(), {rows, cols}, dtype);
    const at::Tensor out = comm->reduce_scatter(x, 0);
    EXPECT_EQ(out.scalar_type(), dtype);
    EXPECT_EQ(comm->bytes_by_op().at("reduce_scatter"), numel * elem);
    comm->all_gather(out, 0);
    EXPECT_EQ(comm->bytes_by_op().at("all_gather"), numel * elem);
    EXPECT_EQ(comm->bytes_moved(), 3 * numel * elem);
  }
}

// The bf16 sum rounds like NCCL's: with two ranks each element is the fp32
// sum of the two bf16 values rounded once to bf16 (exact in fp32 first).
TEST_F(CommTest, BFloat16SumRoundsOncePerAdd) {
  const int p = size();
  auto values = [](int r) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7 + r);
    return at::randn({257}, gen).mul_(1 + r * 1000).to(at::kBFloat16);
  };
  at::Tensor t = values(rank());
  comm->all_reduce(t);
  at::Tensor want = values(0);
  for (int r = 1; r < p; ++r) want = (want.to(at::kFloat) + values(r).to(at::kFloat)).to(at::kBFloat16);
  if (p <= 2) {
    EXPECT_TRUE(at::equal(t, want)) << (t.to(at::kFloat) - want.to(at::kFloat)).abs().max();
  } else {
    // Another order of adds: each add rounds once (2^-8 relative), p - 1 adds.
    // Bound: (p - 1) * 2^-8 * sum of |values| per element.
    at::Tensor exact = at::zeros({257}, at::kDouble), mass = at::zeros({257}, at::kDouble);
    for (int r = 0; r < p; ++r) {
      exact += values(r).to(at::kDouble);
      mass += values(r).to(at::kDouble).abs();
    }
    const at::Tensor excess = (t.to(at::kDouble) - exact).abs() - mass * ((p - 1) * std::ldexp(1.0, -8));
    EXPECT_LE(excess.max().item<double>(), 0.0);
  }
  // Max and Min pick one of the inputs exactly.
  at::Tensor m = values(rank());
  comm->all_reduce(m, ReduceOp::Max);
  at::Tensor want_max = values(0);
  for (int r = 1; r < p; ++r) want_max = at::maximum(want_max, values(r));
  EXPECT_TRUE(at::equal(m, want_max));
}

TEST_F(CommTest, ReduceScatterRejectsIndivisibleDim) {
  if (size() == 1) GTEST_SKIP() << "every dim divides by 1";
  at::Tensor t = at::ones({size() + 1, 2});
  try {
    comm->reduce_scatter(t, 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reduce_scatter"), std::string::npos) << e.what();
  }
}

// The backends' shared checks: each message names the backend, the op, the
// rank and the bad value.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST_F(CommTest, BadArgumentsNameBackendOpRankAndValue) {
  const std::string on_rank = " on rank " + std::to_string(rank());
  at::Tensor t = at::ones({2, 2});
  EXPECT_NE(error_of([&] { comm->send(t, size(), 0); })
                .find("mpi send" + on_rank + ": dst " + std::to_string(size()) + " is outside the group of size"),
            std::string::npos);
  at::Tensor undefined;
  EXPECT_NE(error_of([&] { comm->all_reduce(undefined); }).find("mpi all_reduce" + on_rank + ": undefined tensor"),
            std::string::npos);
  EXPECT_NE(error_of([&] { comm->broadcast(t, -1); }).find("mpi broadcast" + on_rank + ": root -1"),
            std::string::npos);
  if (size() == 1) return;  // every count divides by 1
  at::Tensor odd = at::ones({size() + 1, 2});
  EXPECT_NE(error_of([&] { comm->all_to_all(odd); }).find("mpi all_to_all: dim 0 of shape"), std::string::npos);
  EXPECT_NE(error_of([&] { comm->reduce_scatter(odd.t(), 1); })
                .find("mpi reduce_scatter: dim 1 of shape [2, " + std::to_string(size() + 1) +
                      "] is not divisible by the group size " + std::to_string(size())),
            std::string::npos);
}

TEST_F(CommTest, BadDimThrowsNamingTheOp) {
  at::Tensor t = at::ones({2, 2});
  try {
    comm->all_gather(t, 2);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_gather"), std::string::npos) << e.what();
  }
  EXPECT_THROW(comm->broadcast(t, size()), Error);
  EXPECT_THROW(comm->send(t, -1, 0), Error);
}

TEST_F(CommTest, BroadcastFromLastRank) {
  const int root = size() - 1;
  at::Tensor storage = rank() == root ? contribution(root, {3, 5}) : at::zeros({3, 5});
  at::Tensor view = storage.t();  // non-contiguous: the result must land in storage
  comm->reset_bytes();
  comm->broadcast(view, root);
  EXPECT_TRUE(at::equal(storage, contribution(root, {3, 5})));
  EXPECT_EQ(comm->bytes_by_op().at("broadcast"), static_cast<int64_t>(storage.nbytes()));
}

// Only the root receives (checkpoint writers): the others get nothing back
// and count only what they sent.
TEST_F(CommTest, GatherToEveryRootOnly) {
  const int p = size();
  for (int root = 0; root < p; ++root) {
    comm->reset_bytes();
    const at::Tensor t = contribution(rank(), {3, 2});
    const at::Tensor out = comm->gather(t, root);
    if (rank() == root) {
      std::vector<at::Tensor> parts;
      for (int r = 0; r < p; ++r) parts.push_back(contribution(r, {3, 2}));
      ASSERT_TRUE(out.defined());
      EXPECT_TRUE(at::equal(out, at::cat(parts, 0))) << "root " << root;
      EXPECT_EQ(comm->bytes_by_op().at("gather"), static_cast<int64_t>(p * t.nbytes()));
    } else {
      EXPECT_FALSE(out.defined()) << "rank " << rank() << " is not the root " << root;
      EXPECT_EQ(comm->bytes_by_op().at("gather"), static_cast<int64_t>(t.nbytes()));
    }
  }
  EXPECT_THROW(comm->gather(contribution(rank(), {2}), p), Error);
}

TEST_F(CommTest, SendRecvRing) {
  const int p = size();
  if (p == 1) GTEST_SKIP() << "a ring needs two ranks";
  const int next = (rank() + 1) % p, prev = (rank() + p - 1) % p;
  at::Tensor out = contribution(rank(), {4, 2});
  at::Tensor in = at::zeros({4, 2});
  comm->reset_bytes();
  // Even ranks send first, odd ranks receive first: blocking sends cannot deadlock.
  if (rank() % 2 == 0) {
    comm->send(out, next, 7);
    comm->recv(in, prev, 7);
  } else {
    comm->recv(in, prev, 7);
    comm->send(out, next, 7);
  }
  EXPECT_TRUE(at::equal(in, contribution(prev, {4, 2})));
  EXPECT_EQ(comm->bytes_by_op().at("send"), static_cast<int64_t>(out.nbytes()));
  EXPECT_EQ(comm->bytes_by_op().at("recv"), static_cast<int64_t>(in.nbytes()));
  EXPECT_EQ(comm->bytes_moved(), static_cast<int64_t>(out.nbytes() + in.nbytes()));
}

// Every rank sends and receives at once, the order no rank could take with
// blocking calls alone; large enough (8 MiB) that MPI cannot buffer the send.
TEST_F(CommTest, SendRecvRingAllAtOnce) {
  const int p = size();
  if (p == 1) GTEST_SKIP() << "a ring needs two ranks";
  const int next = (rank() + 1) % p, prev = (rank() + p - 1) % p;
  at::Tensor out = contribution(rank(), {1 << 21});
  at::Tensor in = at::zeros({1 << 21});
  comm->reset_bytes();
  comm->send_recv(out, next, in, prev, 5, 5);
  EXPECT_TRUE(at::equal(in, contribution(prev, {1 << 21})));
  EXPECT_EQ(comm->bytes_by_op().at("send"), static_cast<int64_t>(out.nbytes()));
  EXPECT_EQ(comm->bytes_by_op().at("recv"), static_cast<int64_t>(in.nbytes()));
  // Other tags for the two halves, a non-contiguous receive buffer written back.
  at::Tensor wide = at::zeros({4, 6});
  at::Tensor view = wide.narrow(1, 0, 3);
  comm->send_recv(contribution(rank(), {4, 3}), next, view, prev, 8, 8);
  EXPECT_TRUE(at::equal(wide.narrow(1, 0, 3), contribution(prev, {4, 3})));
  EXPECT_TRUE(at::equal(wide.narrow(1, 3, 3), at::zeros({4, 3})));
}

TEST_F(CommTest, RecvOfWrongSizeThrowsNamingRecv) {
  if (size() == 1) GTEST_SKIP() << "needs two ranks";
  // Rank 1 posts a bigger buffer than rank 0 sends, then a smaller one.
  if (rank() == 0) {
    comm->send(at::ones({4}), 1, 3);
    comm->send(at::ones({4}), 1, 4);
  } else if (rank() == 1) {
    at::Tensor big = at::zeros({5});
    try {
      comm->recv(big, 0, 3);
      ADD_FAILURE() << "expected a size mismatch";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("recv"), std::string::npos) << e.what();
    }
    at::Tensor small = at::zeros({3});
    try {
      comm->recv(small, 0, 4);
      ADD_FAILURE() << "expected a truncation error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("recv"), std::string::npos) << e.what();
    }
  }
  comm->barrier();
}

TEST_F(CommTest, AllToAll) {
  const int p = size();
  // Chunk j of rank r holds r*100 + 10*j + {0, 1}; rank r receives chunk r of every rank s.
  std::vector<int64_t> mine;
  for (int j = 0; j < p; ++j)
    for (int k = 0; k < 2; ++k) mine.push_back(rank() * 100 + 10 * j + k);
  std::vector<int64_t> expected;
  for (int s = 0; s < p; ++s)
    for (int k = 0; k < 2; ++k) expected.push_back(s * 100 + 10 * rank() + k);
  at::Tensor t = at::tensor(mine, at::kLong).reshape({2 * p, 1});
  comm->reset_bytes();
  at::Tensor out = comm->all_to_all(t);
  EXPECT_TRUE(at::equal(out, at::tensor(expected, at::kLong).reshape({2 * p, 1}))) << out;
  EXPECT_EQ(comm->bytes_by_op().at("all_to_all"), static_cast<int64_t>(t.nbytes()));
  // The all-to-alls time themselves (bench's all-to-all share).
  ASSERT_EQ(comm->seconds_by_op().count("all_to_all"), 1U);
  EXPECT_GT(comm->seconds_by_op().at("all_to_all"), 0.0);
}

// Uneven blocks: rank r sends (r + j) % 3 rows to rank j (zero rows too),
// each row [r, j, i]; rank r receives (s + r) % 3 rows from every rank s.
TEST_F(CommTest, AllToAllVUnevenRows) {
  const int p = size(), r = rank();
  std::vector<int64_t> send, recv, mine, expected;
  for (int j = 0; j < p; ++j) {
    send.push_back((r + j) % 3);
    recv.push_back((j + r) % 3);
    for (int i = 0; i < (r + j) % 3; ++i) mine.insert(mine.end(), {r, j, i});
    for (int i = 0; i < (j + r) % 3; ++i) expected.insert(expected.end(), {j, r, i});
  }
  const auto rows = static_cast<int64_t>(mine.size() / 3);
  at::Tensor t = at::tensor(mine, at::kLong).reshape({rows, 3}).to(at::kFloat);
  comm->reset_bytes();
  at::Tensor out = comm->all_to_all_v(t, send, recv);
  const auto got_rows = static_cast<int64_t>(expected.size() / 3);
  EXPECT_TRUE(at::equal(out, at::tensor(expected, at::kLong).reshape({got_rows, 3}).to(at::kFloat))) << out;
  EXPECT_EQ(comm->bytes_by_op().at("all_to_all_v"), static_cast<int64_t>(t.nbytes()));
  ASSERT_EQ(comm->seconds_by_op().count("all_to_all_v"), 1U);
  EXPECT_GT(comm->seconds_by_op().at("all_to_all_v"), 0.0);
  // Counts that do not add up to the rows name the op and the rank.
  std::vector<int64_t> wrong = send;
  wrong[0] += 1;
  try {
    comm->all_to_all_v(t, wrong, recv);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_to_all_v on rank " + std::to_string(r)), std::string::npos) << e.what();
  }
  EXPECT_THROW(comm->all_to_all_v(t, std::vector<int64_t>(static_cast<size_t>(p) + 1, 0), recv), Error);
}

TEST_F(CommTest, BarrierMovesNoBytes) {
  comm->reset_bytes();
  comm->barrier();
  EXPECT_EQ(comm->bytes_moved(), 0);
}

// ---- Mesh -------------------------------------------------------------------

std::vector<MeshShape> factorisations(int world) {
  std::vector<MeshShape> out;
  for (int dp = 1; dp <= world; ++dp)
    for (int pp = 1; pp <= world; ++pp)
      if (world % (dp * pp) == 0) out.push_back(MeshShape{dp, pp, world / (dp * pp)});
  return out;
}

TEST(MeshCoords, TpFastestThenDpThenPp) {
  const MeshShape s{2, 3, 2};
  EXPECT_EQ(rank_of(s, MeshCoord{0, 0, 1}), 1);
  EXPECT_EQ(rank_of(s, MeshCoord{1, 0, 0}), 2);
  EXPECT_EQ(rank_of(s, MeshCoord{0, 1, 0}), 4);
  for (int r = 0; r < s.world(); ++r) EXPECT_EQ(rank_of(s, coord_of(s, r)), r);
  EXPECT_THROW(coord_of(s, 12), Error);
  const MeshCoord outside{2, 0, 0};
  EXPECT_THROW(rank_of(s, outside), Error);
}

TEST(MeshTest, AxisCommunicatorsForEveryFactorisation) {
  Runtime& rt = test_runtime();
  for (const MeshShape& s : factorisations(rt.size())) {
    SCOPED_TRACE("mesh dp=" + std::to_string(s.dp) + " pp=" + std::to_string(s.pp) + " tp=" + std::to_string(s.tp));
    Mesh mesh(rt, s);
    const MeshCoord c = mesh.coord();
    const MeshCoord want = coord_of(s, rt.rank());
    EXPECT_EQ(mesh.rank(), rt.rank());
    EXPECT_EQ(c.dp, want.dp);
    EXPECT_EQ(c.pp, want.pp);
    EXPECT_EQ(c.tp, want.tp);
    EXPECT_EQ(mesh.cpu_world().size(), rt.size());
    EXPECT_EQ(mesh.cpu_world().rank(), rt.rank());
    EXPECT_EQ(mesh.cpu_world().backend(), "mpi");
    EXPECT_EQ(mesh.backend(), "mpi");
    EXPECT_EQ(mesh.dp().size(), s.dp);
    EXPECT_EQ(mesh.dp().rank(), c.dp);
    EXPECT_EQ(mesh.pp().size(), s.pp);
    EXPECT_EQ(mesh.pp().rank(), c.pp);
    EXPECT_EQ(mesh.tp().size(), s.tp);
    EXPECT_EQ(mesh.tp().rank(), c.tp);
    EXPECT_EQ(mesh.is_first_stage(), c.pp == 0);
    EXPECT_EQ(mesh.is_last_stage(), c.pp == s.pp - 1);
    EXPECT_EQ(mesh.bytes_moved(), 0);

    // Summing world ranks over one axis must touch exactly that axis's peers.
    int64_t tp_sum = 0, dp_sum = 0, pp_sum = 0;
    for (int t = 0; t < s.tp; ++t) tp_sum += rank_of(s, MeshCoord{c.dp, c.pp, t});
    for (int d = 0; d < s.dp; ++d) dp_sum += rank_of(s, MeshCoord{d, c.pp, c.tp});
    for (int p = 0; p < s.pp; ++p) pp_sum += rank_of(s, MeshCoord{c.dp, p, c.tp});
    at::Tensor x = at::full({1}, rt.rank(), at::kLong);
    at::Tensor y = x.clone(), z = x.clone();
    mesh.tp().all_reduce(x);
    mesh.dp().all_reduce(y);
    mesh.pp().all_reduce(z);
    EXPECT_EQ(x.item<int64_t>(), tp_sum);
    EXPECT_EQ(y.item<int64_t>(), dp_sum);
    EXPECT_EQ(z.item<int64_t>(), pp_sum);
    EXPECT_EQ(mesh.bytes_moved(), 3 * static_cast<int64_t>(x.nbytes()));
    mesh.reset_bytes();
    EXPECT_EQ(mesh.bytes_moved(), 0);
  }
}

// expert_parallel groups: ep consecutive dp ranks; expert_dp: the same dp % ep.
TEST(MeshTest, ExpertParallelGroups) {
  Runtime& rt = test_runtime();
  for (int ep = 1; ep <= rt.size(); ++ep) {
    if (rt.size() % ep != 0) continue;
    const MeshShape s{rt.size(), 1, 1, ep};
    SCOPED_TRACE("dp=" + std::to_string(s.dp) + " ep=" + std::to_string(ep));
    Mesh mesh(rt, s);
    const int dp = mesh.coord().dp;
    EXPECT_EQ(mesh.ep().size(), ep);
    EXPECT_EQ(mesh.ep().rank(), dp % ep);
    EXPECT_EQ(mesh.ep_rank(), dp % ep);
    EXPECT_EQ(mesh.expert_dp().size(), s.dp / ep);
    EXPECT_EQ(mesh.expert_dp().rank(), dp / ep);
    int64_t ep_sum = 0, edp_sum = 0;
    for (int d = 0; d < s.dp; ++d) {
      if (d / ep == dp / ep) ep_sum += d;
      if (d % ep == dp % ep) edp_sum += d;
    }
    at::Tensor x = at::full({1}, dp, at::kLong), y = x.clone();
    mesh.ep().all_reduce(x);
    mesh.expert_dp().all_reduce(y);
    EXPECT_EQ(x.item<int64_t>(), ep_sum);
    EXPECT_EQ(y.item<int64_t>(), edp_sum);
  }
  if (rt.size() > 1) {
    try {
      Mesh mesh(rt, MeshShape{rt.size(), 1, 1, rt.size() + 1});
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("expert_parallel"), std::string::npos) << e.what();
    }
  }
}

TEST(MeshTest, WrongWorldSizeNamesNDeviceAxis) {
  Runtime& rt = test_runtime();
  const MeshShape s{2, 1, rt.size()};
  try {
    Mesh mesh(rt, s);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("n_device_axis [dp,pp,tp]=[2,1," + std::to_string(rt.size()) + "]"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("needs " + std::to_string(2 * rt.size()) + " ranks but the world has " +
                       std::to_string(rt.size())),
              std::string::npos)
        << msg;
  }
  const MeshShape zero{0, 1, rt.size()};
  EXPECT_THROW(Mesh(rt, zero), Error);
}

#ifndef MESHTRAIN_HAVE_NCCL
TEST(MeshTest, NcclWithoutNcclThrows) {
  Runtime& rt = test_runtime();
  try {
    Mesh mesh(rt, MeshShape{rt.size(), 1, 1}, Backend::Nccl);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("built without NCCL"), std::string::npos) << e.what();
  }
}
#endif

}  // namespace
}  // namespace meshtrain
