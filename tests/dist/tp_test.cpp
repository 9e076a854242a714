// Tensor parallelism: the autograd collectives against their closed forms, the
// Megatron layers against the unsharded ones (outputs and gradients), whole
// models on tp meshes against one process, and the tp traffic of a step
// against the Megatron formula.
#include <gtest/gtest.h>

#include <functional>

#include "meshtrain/model/transformer.h"
#include "meshtrain/parallel/mappings.h"
#include "meshtrain/parallel/tensor_parallel.h"
#include "parity.h"

using namespace meshtrain;

namespace {

const std::string kData = test::scratch_dir("tp-data");

int world_size() { return test_runtime().size(); }

// A deterministic tensor that differs per rank (the closed forms below
// recompute every rank's value locally).
at::Tensor ranked(at::IntArrayRef shape, int rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + rank);
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat));
}

at::Tensor cat_ranks(at::IntArrayRef shape, int n, int64_t dim) {
  std::vector<at::Tensor> parts;
  for (int r = 0; r < n; ++r) parts.push_back(ranked(shape, r));
  return at::cat(parts, dim);
}

at::Tensor sum_ranks(at::IntArrayRef shape, int n) {
  at::Tensor s = at::zeros(shape);
  for (int r = 0; r < n; ++r) s += ranked(shape, r);
  return s;
}

at::Tensor own_chunk(const at::Tensor& t, int64_t dim, int rank, int n) { return t.chunk(n, dim)[rank]; }

void expect_close(const at::Tensor& want, const at::Tensor& got, double tol, const std::string& what) {
  ASSERT_EQ(want.sizes(), got.sizes()) << what;
  const double err = (want - got).abs().max().item<double>();
  EXPECT_LE(err, tol) << what << ": max abs error " << err;
}

struct TpMesh {
  Mesh mesh{test_runtime(), MeshShape{1, 1, world_size()}};
  Communicator& tp() { return mesh.tp(); }
  int rank() { return mesh.coord().tp; }
  int n() { return mesh.shape().tp; }
};

// Runs `op` on this rank's x with upstream gradient g (both rank-dependent via
// their seeds) and returns (y, dx).
std::pair<at::Tensor, at::Tensor> run_mapping(const std::function<at::Tensor(const at::Tensor&)>& op, at::Tensor x,
                                              const at::Tensor& g) {
  x = x.clone().requires_grad_(true);
  at::Tensor y = op(x);
  y.backward(g);
  return {y.detach(), x.grad()};
}

}  // namespace

// ---- mappings -------------------------------------------------------------

TEST(Mappings, CopyAndReduce) {
  TpMesh m;
  const int r = m.rank(), n = m.n();
  const std::vector<int64_t> s{2, 4, 3};
  auto [y, dx] = run_mapping([&](const at::Tensor& x) { return copy_to_tp(x, m.tp()); }, ranked(s, r),
                             ranked(s, r + 10));
  expect_close(ranked(s, r), y, 0, "copy_to_tp fwd");
  at::Tensor gsum = at::zeros(s);
  for (int q = 0; q < n; ++q) gsum += ranked(s, q + 10);
  expect_close(gsum, dx, 1e-6, "copy_to_tp bwd");

  std::tie(y, dx) = run_mapping([&](const at::Tensor& x) { return reduce_from_tp(x, m.tp()); }, ranked(s, r),
                                ranked(s, r + 10));
  expect_close(sum_ranks(s, n), y, 1e-6, "reduce_from_tp fwd");
  expect_close(ranked(s, r + 10), dx, 0, "reduce_from_tp bwd");
}

TEST(Mappings, ScatterAndGatherAlongADim) {
  TpMesh m;
  const int r = m.rank(), n = m.n();
  const std::vector<int64_t> full{2, 4 * n, 3}, part{2, 4, 3};
  // scatter: x replicated; the gradient of each chunk comes from its owner.
  auto [y, dx] = run_mapping([&](const at::Tensor& x) { return scatter_to_tp(x, m.tp(), 1); }, ranked(full, 0),
                             ranked(part, r + 10));
  expect_close(own_chunk(ranked(full, 0), 1, r, n), y, 0, "scatter_to_tp fwd");
  std::vector<at::Tensor> gs;
  for (int q = 0; q < n; ++q) gs.push_back(ranked(part, q + 10));
  expect_close(at::cat(gs, 1), dx, 0, "scatter_to_tp bwd");

  std::tie(y, dx) = run_mapping([&](const at::Tensor& x) { return gather_from_tp(x, m.tp(), -1); }, ranked(part, r),
                                ranked({2, 4, 3 * n}, 20));
  expect_close(cat_ranks(part, n, -1), y, 0, "gather_from_tp fwd");
  expect_close(own_chunk(ranked({2, 4, 3 * n}, 20), -1, r, n), dx, 0, "gather_from_tp bwd");
}

TEST(Mappings, SequenceParallelPairs) {
  TpMesh m;
  const int r = m.rank(), n = m.n();
  const std::vector<int64_t> shard{2, 3, 5}, full{2, 3 * n, 5};
  // gather_from_sequence: partial gradients are summed, each rank keeps its chunk.
  auto [y, dx] = run_mapping([&](const at::Tensor& x) { return gather_from_sequence(x, m.tp()); }, ranked(shard, r),
                             ranked(full, r + 10));
  expect_close(cat_ranks(shard, n, 1), y, 0, "gather_from_sequence fwd");
  at::Tensor gsum = at::zeros(full);
  for (int q = 0; q < n; ++q) gsum += ranked(full, q + 10);
  expect_close(own_chunk(gsum, 1, r, n), dx, 1e-6, "gather_from_sequence bwd");

  std::tie(y, dx) = run_mapping([&](const at::Tensor& x) { return reduce_scatter_to_sequence(x, m.tp()); },
                                ranked(full, r), ranked(shard, r + 10));
  expect_close(own_chunk(sum_ranks(full, n), 1, r, n), y, 1e-6, "reduce_scatter_to_sequence fwd");
  std::vector<at::Tensor> gs;
  for (int q = 0; q < n; ++q) gs.push_back(ranked(shard, q + 10));
  expect_close(at::cat(gs, 1), dx, 0, "reduce_scatter_to_sequence bwd");

  // Replicated compute: the full gradient is the same everywhere; keep own chunk.
  std::tie(y, dx) = run_mapping([&](const at::Tensor& x) { return gather_sequence_replicated(x, m.tp()); },
                                ranked(shard, r), ranked(full, 30));
  expect_close(cat_ranks(shard, n, 1), y, 0, "gather_sequence_replicated fwd");
  expect_close(own_chunk(ranked(full, 30), 1, r, n), dx, 0, "gather_sequence_replicated bwd");

  std::tie(y, dx) = run_mapping([&](const at::Tensor& x) { return scatter_sequence(x, m.tp()); }, ranked(full, 0),
                                ranked(shard, r + 10));
  expect_close(own_chunk(ranked(full, 0), 1, r, n), y, 0, "scatter_sequence fwd");
  expect_close(at::cat(gs, 1), dx, 0, "scatter_sequence bwd");
}

// ---- layers vs the unsharded factory ----------------------------------------

namespace {

struct Factories {
  TpMesh m;
  LayerFactory plain;
  std::unique_ptr<LayerFactory> tp;
  explicit Factories(bool sp = false) {
    Config cfg;
    cfg.device.n_device_axis = {1, 1, m.n()};
    cfg.sequence_parallel = sp;
    tp = make_layer_factory(cfg, m.mesh);
    plain.set_seed(7);
    tp->set_seed(7);
  }
};

at::Tensor weight_of(torch::nn::Module& mod) { return mod.named_parameters()["weight"]; }

// Shards of a gradient, concatenated in tp rank order.
at::Tensor gather_grad(Communicator& tp, const at::Tensor& g, int64_t dim) { return tp.all_gather(g, dim); }

}  // namespace

TEST(TensorParallelLayers, ColumnAndRowMatchUnsharded) {
  Factories f;
  const int r = f.m.rank(), n = f.m.n();
  const int64_t in = 8, out = 4 * n;
  // Column: replicated input, output features split.
  auto pc = f.plain.column("l.w_in", in, out, 0.1);
  auto tc = f.tp->column("l.w_in", in, out, 0.1);
  at::Tensor x = ranked({2, 3, in}, 0);
  at::Tensor xp = x.clone().requires_grad_(true), xt = x.clone().requires_grad_(true);
  at::Tensor R = ranked({2, 3, out}, 1);
  at::Tensor yp = pc->forward(xp), yt = tc->forward(xt);
  expect_close(own_chunk(yp.detach(), -1, r, n), yt.detach(), 1e-6, "column fwd");
  (yp * R).sum().backward();
  (yt * own_chunk(R, -1, r, n)).sum().backward();
  expect_close(xp.grad(), xt.grad(), 1e-6, "column dx");
  expect_close(weight_of(*pc).grad(), gather_grad(f.m.tp(), weight_of(*tc).grad(), 0), 1e-6, "column dW");
  EXPECT_EQ(f.tp->layouts().at("l.w_in.weight").split_dim, 0);
  EXPECT_EQ(f.tp->layouts().at("l.w_in.weight").global_shape, (std::vector<int64_t>{out, in}));

  // Row: input features split, output summed.
  auto pr = f.plain.row("l.w_out", out, in, 0.1);
  auto tr = f.tp->row("l.w_out", out, in, 0.1);
  at::Tensor h = ranked({2, 3, out}, 2);
  at::Tensor hp = h.clone().requires_grad_(true), ht = own_chunk(h, -1, r, n).clone().requires_grad_(true);
  at::Tensor R2 = ranked({2, 3, in}, 3);
  yp = pr->forward(hp);
  yt = tr->forward(ht);
  expect_close(yp.detach(), yt.detach(), 1e-6, "row fwd");
  (yp * R2).sum().backward();
  (yt * R2).sum().backward();
  expect_close(own_chunk(hp.grad(), -1, r, n), ht.grad(), 1e-6, "row dx");
  expect_close(weight_of(*pr).grad(), gather_grad(f.m.tp(), weight_of(*tr).grad(), 1), 1e-6, "row dW");
  EXPECT_EQ(f.tp->layouts().at("l.w_out.weight").split_dim, 1);

  // param(): the chunk of the same global draw.
  at::Tensor pp = f.plain.param("l.experts.w_in", {3, out, in}, 1, 0.1);
  at::Tensor tp = f.tp->param("l.experts.w_in", {3, out, in}, 1, 0.1);
  expect_close(own_chunk(pp, 1, r, n), tp, 0, "param chunk");
  EXPECT_EQ(f.tp->layouts().at("l.experts.w_in").global_shape, (std::vector<int64_t>{3, out, in}));
}

TEST(TensorParallelLayers, VocabParallelEmbeddingMatchesUnsharded) {
  for (bool sp : {false, true}) {
    Factories f(sp);
    const int r = f.m.rank(), n = f.m.n();
    const int64_t V = 4 * n + 3, d = 8, T = 2 * n;  // V not a multiple of tp: padded
    auto pe = f.plain.embedding("embed", V, d, 0.1);
    auto te = f.tp->embedding("embed", V, d, 0.1);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
    at::Tensor tokens = at::randint(0, V, {3, T}, gen, at::kLong);
    tokens[0][0] = V - 1;
    at::Tensor R = ranked({3, T, d}, 4);
    at::Tensor yp = pe->forward(tokens), yt = te->forward(tokens);
    const at::Tensor want = sp ? own_chunk(yp.detach(), 1, r, n) : yp.detach();
    expect_close(want, yt.detach(), 1e-6, sp ? "embedding fwd (sp)" : "embedding fwd");
    (yp * R).sum().backward();
    (yt * (sp ? own_chunk(R, 1, r, n) : R)).sum().backward();
    const at::Tensor g = gather_grad(f.m.tp(), te->weight().grad(), 0);
    const int64_t padded = (V + n - 1) / n * n;
    ASSERT_EQ(g.size(0), padded);
    expect_close(pe->weight().grad(), g.narrow(0, 0, V), 1e-6, "embedding dW");
    EXPECT_EQ(g.narrow(0, V, padded - V).abs().sum().item<double>(), 0.0) << "padded rows get no gradient";
    EXPECT_EQ(f.tp->layouts().at("embed.weight").global_shape, (std::vector<int64_t>{padded, d}));
  }
}

TEST(TensorParallelLayers, VocabParallelCrossEntropyMatchesUnsharded) {
  for (bool tied : {false, true}) {
    for (bool sp : {false, true}) {
      Factories f(sp);
      const int r = f.m.rank(), n = f.m.n();
      const int64_t V = 4 * n + 3, d = 8, T = 2 * n;
      const std::string tag = std::string(tied ? "tied" : "untied") + (sp ? " sp" : "");
      auto pe = f.plain.embedding("embed", V, d, 1.0);
      auto te = f.tp->embedding("embed", V, d, 1.0);
      auto ph = f.plain.head("head", d, V, 1.0, tied ? pe : nullptr);
      auto th = f.tp->head("head", d, V, 1.0, tied ? te : nullptr);
      auto gen = at::make_generator<at::CPUGeneratorImpl>(6);
      at::Tensor targets = at::randint(0, V, {3, T}, gen, at::kLong);
      at::Tensor h = ranked({3, T, d}, 0);
      at::Tensor hp = h.clone().requires_grad_(true);
      at::Tensor ht = (sp ? own_chunk(h, 1, r, n) : h).clone().requires_grad_(true);

      // logits(): exactly the real vocabulary, equal to the unsharded ones.
      const at::Tensor lt = th->logits(ht).detach();
      ASSERT_EQ(lt.size(-1), V) << tag;
      const at::Tensor lp = ph->logits(hp).detach();
      expect_close(lp, lt, 1e-5, tag + " logits");
      const at::Tensor ce = at::cross_entropy_loss(lp.reshape({-1, V}), targets.reshape({-1}), {},
                                                   at::Reduction::None)
                                .view(targets.sizes());

      at::Tensor R = ranked({3, T}, 7);
      at::Tensor losses_p = ph->token_losses(hp, targets), losses_t = th->token_losses(ht, targets);
      expect_close(ce, losses_t.detach(), 1e-5, tag + " CE vs at::cross_entropy");
      expect_close(losses_p.detach(), losses_t.detach(), 1e-5, tag + " CE");
      (losses_p * R).sum().backward();
      (losses_t * R).sum().backward();
      // fp32 round-off of the chunked reductions: a few ulps of the largest
      // values (|dh| up to ~20, ulp 1.9e-6; the summation order is MKL's, by CPU).
      expect_close(sp ? own_chunk(hp.grad(), 1, r, n) : hp.grad(), ht.grad(), 6e-6, tag + " dh");
      const at::Tensor wp = tied ? pe->weight() : weight_of(*ph);
      const at::Tensor wt = tied ? te->weight() : weight_of(*th);
      const at::Tensor g = gather_grad(f.m.tp(), wt.grad(), 0);
      expect_close(wp.grad(), g.narrow(0, 0, V), 6e-6, tag + " dW");  // likewise (the padded GEMM groups its sums its own way)
      EXPECT_EQ(g.narrow(0, V, g.size(0) - V).abs().sum().item<double>(), 0.0) << tag << " padding gets no gradient";
    }
  }
}

// ---- whole models on tp meshes vs one process --------------------------------

namespace {

void expect_same(const test::Curve& ref, const test::Curve& got, double tol, const std::string& what) {
  test::expect_same_curve(ref, got, tol, what);
}

// Trains cfg on (1,1,n) and, with four ranks, (2,1,2); compares with one process.
void expect_parity(Config cfg, const std::string& what) {
  const int n = world_size();
  const auto ref = test::single_process_losses(cfg);
  expect_same(ref, test::train_losses(test::with_mesh(cfg, 1, 1, n)), 1e-5, what + " (1,1," + std::to_string(n) + ")");
  if (n == 4) expect_same(ref, test::train_losses(test::with_mesh(cfg, 2, 1, 2)), 1e-5, what + " (2,1,2)");
  EXPECT_LT(ref.back(), ref.front()) << what << " learns";
}


}  // namespace

TEST(TensorParallelModel, DenseTiedSameLossesAsOneProcess) {
  Config cfg = test::tiny_config(test::synthetic_data(kData, 96), "tp-tied");
  cfg.model.tie_embeddings = true;
  expect_parity(cfg, "tied");
  cfg.sequence_parallel = true;
  cfg.name = "tp-tied-sp";
  expect_parity(cfg, "tied sp");
}

TEST(TensorParallelModel, DenseUntiedPaddedVocabSameLossesAsOneProcess) {
  // 95 tokens: the vocabulary is padded on every tp > 1.
  Config cfg = test::tiny_config(test::synthetic_data(kData + "-95", 95), "tp-untied");
  cfg.model.vocab_size = 95;
  cfg.model.tie_embeddings = false;
  expect_parity(cfg, "untied");
  cfg.sequence_parallel = true;
  cfg.name = "tp-untied-sp";
  expect_parity(cfg, "untied sp");
}

TEST(TensorParallelModel, MoeMlaSameLossesAsOneProcess) {
  Config cfg = test::moe_mla(test::tiny_config(test::synthetic_data(kData, 96), "tp-moe-mla"));
  expect_parity(cfg, "moe+mla");
}

TEST(TensorParallelModel, MoeSequenceParallelSameLossesAsOneProcess) {
  Config cfg = test::moe_mla(test::tiny_config(test::synthetic_data(kData, 96), "tp-moe-sp"));
  cfg.model.attention = AttentionKind::Mha;
  cfg.sequence_parallel = true;
  expect_parity(cfg, "moe sp");
}

TEST(TensorParallelModel, MlaSequenceParallelSameLossesAsOneProcess) {
  Config cfg = test::moe_mla(test::tiny_config(test::synthetic_data(kData, 96), "tp-mla-sp"));
  cfg.sequence_parallel = true;
  expect_parity(cfg, "moe+mla sp");
}

// Jaxformer's architecture: biases on every linear (column biases split, row
// biases added after the sum), biased norms, rope projections from the joint
// latent, one MoE layer per block with the linear shared expert.
TEST(TensorParallelModel, JaxformerSameLossesAsOneProcess) {
  Config cfg = test::jaxformer(test::tiny_config(test::synthetic_data(kData, 96), "tp-jaxformer"));
  expect_parity(cfg, "jaxformer");
  cfg.sequence_parallel = true;
  cfg.name = "tp-jaxformer-sp";
  expect_parity(cfg, "jaxformer sp");
}

// Parameters replicated over tp (norms, MLA down-projections and rope key, the
// router) must get the same gradient on every tp rank, or the copies drift
// apart. Adam hides a wrong gradient scale from loss parity, so this checks
// the copies directly after training.
TEST(TensorParallelModel, LlamaOptionsSameLossesAsOneProcess) {
  // 2 kv heads: column-split over tp 2, replicated over tp 4.
  Config cfg = test::llama(test::tiny_config(test::synthetic_data(kData, 96), "tp-llama"));
  expect_parity(cfg, "swiglu+gqa");
  cfg.sequence_parallel = true;
  cfg.name = "tp-llama-sp";
  expect_parity(cfg, "swiglu+gqa sp");
}

TEST(TensorParallelModel, DeepSeekV3OptionsSameLossesAsOneProcess) {
  Config cfg = test::deepseek_v3(test::tiny_config(test::synthetic_data(kData, 96), "tp-v3"));
  expect_parity(cfg, "v3");
  cfg.sequence_parallel = true;
  cfg.name = "tp-v3-sp";
  expect_parity(cfg, "v3 sp");
}

TEST(TensorParallelModel, ReplicatedParametersStayIdenticalOverTp) {
  for (int variant = 0; variant < 4; ++variant) {
    const bool sp = variant % 2 == 1, jax = variant >= 2;  // jax: Jaxformer's biases and shared projection
    const std::string name = std::string(jax ? "tp-rep-jax" : "tp-rep") + (sp ? "-sp" : "");
    Config cfg = test::tiny_config(test::synthetic_data(kData, 96), name);
    cfg = jax ? test::jaxformer(cfg) : test::moe_mla(cfg);
    cfg.sequence_parallel = sp;
    cfg.training_steps = 6;
    SessionOptions o;
    o.fresh = true;
    o.quiet = true;
    Trainer t(test::with_mesh(cfg, 1, 1, world_size()), test_runtime(), o);
    t.train();
    int checked = 0;
    for (auto& p : t.model().params) {
      if (p.layout.split_dim >= 0) continue;
      at::Tensor mine = p.tensor.detach().clone();
      at::Tensor root = mine.clone();
      t.mesh().tp().broadcast(root, 0);
      EXPECT_LE((mine - root).abs().max().item<double>(), 1e-7) << p.path << " (" << name << ")";
      ++checked;
    }
    EXPECT_GT(checked, 10);
  }
}

// ---- traffic -------------------------------------------------------------

// Bytes on the tp communicator in one train_step of the dense model (pp = dp
// = 1, one round), counted as comm.h counts them (all-reduce: the tensor,
// all-gather: its output, reduce-scatter: its input). A = B*T*d*4, L layers.
//
// Without sequence parallelism (all-reduces):
//   forward : embedding exit 1 + per layer (attention wo, MLP w_out) 2L      -> (1 + 2L) A
//   backward: head entry 1 + per layer (attention entry shared by wq/wk/wv,
//             MLP entry) 2L                                                   -> (1 + 2L) A
//   loss    : vocab-parallel CE, max (B*T floats) + [sum-exp, target logit]   -> 3 B*T*4
// With sequence parallelism every all-reduce above becomes a reduce-scatter
// plus an all-gather (each A) and the norm weights' gradients, computed on
// sequence shards, are summed once: 2 (2 + 4L) A + 3 B*T*4 + (2L + 1) d*4.
TEST(TensorParallelTraffic, EqualsTheMegatronFormula) {
  const int n = world_size();
  for (bool sp : {false, true}) {
    Config cfg = test::tiny_config(test::synthetic_data(kData, 96), sp ? "tp-traffic-sp" : "tp-traffic");
    cfg.sequence_parallel = sp;
    cfg = test::with_mesh(cfg, 1, 1, n);
    SessionOptions o;
    o.fresh = true;
    o.quiet = true;
    Trainer t(cfg, test_runtime(), o);
    t.train_step();  // first step allocates everything; measure the second
    t.mesh().reset_bytes();
    t.train_step();
    const int64_t B = cfg.data.train_batch_size, T = cfg.data.T, d = cfg.model.model_dimension;
    const int64_t L = cfg.model.n_layers();
    const int64_t A = B * T * d * 4, ce = 3 * B * T * 4;
    const int64_t want = sp ? 2 * (2 + 4 * L) * A + ce + (2 * L + 1) * d * 4 : 2 * (1 + 2 * L) * A + ce;
    EXPECT_EQ(t.mesh().tp().bytes_moved(), want) << (sp ? "sp" : "no sp");
    std::string ops;
    for (const auto& [op, b] : t.mesh().tp().bytes_by_op()) ops += op + "=" + std::to_string(b) + " ";
    SCOPED_TRACE(ops);
    EXPECT_EQ(t.mesh().dp().bytes_moved() + t.mesh().pp().bytes_moved(), 0);
  }
}

// ---- dropout masks ----------------------------------------------------------

// Every tp rank's mask of one draw, stacked [n, ...] (rank order).
at::Tensor masks_over_tp(Communicator& tp, const at::Tensor& mask) { return tp.all_gather(mask.unsqueeze(0), 0); }

// Megatron's model-parallel RNG: inside tp-sharded regions (attention heads,
// sequence-parallel shards) each tp rank draws its own mask; on replicated
// activations all draw the same, and the shared stream stays in step.
TEST(TensorParallelDropout, ShardedRegionsDrawPerRankMasksReplicatedOnesShareThem) {
  TpMesh m;
  const at::Device cpu(at::kCPU);
  const auto drop = [] { return at::dropout(at::ones({16, 64}), 0.5, true); };
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "no sequence parallelism");
    Config cfg = test::tiny_config(kData, "tp-dropout");
    cfg.sequence_parallel = sp;
    const auto factory = make_layer_factory(test::with_mesh(cfg, 1, 1, m.n()), m.mesh);
    const auto rng = factory->dropout_rng();
    torch::manual_seed(11);
    const at::Tensor heads = rng->sharded(cpu, drop);
    const at::Tensor stream = rng->stream(cpu, drop);
    const at::Tensor after = drop();  // the shared stream, after both
    const at::Tensor all_heads = masks_over_tp(m.tp(), heads);
    const at::Tensor all_stream = masks_over_tp(m.tp(), stream);
    const at::Tensor all_after = masks_over_tp(m.tp(), after);
    for (int r = 1; r < m.n(); ++r) {
      EXPECT_FALSE(at::equal(all_heads[r], all_heads[0])) << "rank " << r << " drew rank 0's head mask";
      EXPECT_EQ(at::equal(all_stream[r], all_stream[0]), !sp) << "stream mask of rank " << r;
      EXPECT_TRUE(at::equal(all_after[r], all_after[0])) << "the shared stream drifted on rank " << r;
    }
    // Each mask is a real dropout mask (about half dropped), reproducible from the seed.
    EXPECT_NEAR(heads.eq(0).to(at::kDouble).mean().item<double>(), 0.5, 0.1);
    torch::manual_seed(11);
    EXPECT_TRUE(at::equal(rng->sharded(cpu, drop), heads));
    EXPECT_TRUE(at::equal(rng->stream(cpu, drop), stream));
    EXPECT_TRUE(at::equal(drop(), after));
  }
}

// A whole tp model with dropout in training (attention dropout forked per
// rank, residual dropout shared): the residual stream stays identical on
// every tp rank, so the replicas never drift, and it is reproducible.
TEST(TensorParallelDropout, ModelStreamStaysReplicatedWithDropout) {
  TpMesh m;
  Config cfg = test::tiny_config(kData, "tp-dropout-model");
  cfg.model.dropout_rate = 0.2;
  const auto factory = make_layer_factory(test::with_mesh(cfg, 1, 1, m.n()), m.mesh);
  factory->set_seed(cfg.seed);
  Transformer model(cfg.model, *factory);
  model.train();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto tokens = at::randint(cfg.model.vocab_size, {2, cfg.model.T}, gen, at::TensorOptions().dtype(at::kLong));
  ForwardAux aux;
  torch::manual_seed(3);
  const at::Tensor h = model.forward_layers(model.embed(tokens), &aux).detach();
  const at::Tensor all = masks_over_tp(m.tp(), h);
  for (int r = 1; r < m.n(); ++r) EXPECT_TRUE(at::equal(all[r], all[0])) << "tp rank " << r << "'s stream";
  torch::manual_seed(3);
  EXPECT_TRUE(at::equal(model.forward_layers(model.embed(tokens), &aux).detach(), h)) << "not reproducible";
}
