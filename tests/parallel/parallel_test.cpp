// Tensor and context parallelism (kit/parallel/): the mesh's arithmetic and groups, the
// communicating operators' forward and backward, the parallel layers, and the parallel language
// model against exercise 01's kit::TransformerLM on one rank. Ranks are threads of this process on
// a local Gloo world (ProcessGroup::local_groups; the Mesh makes its groups with new_group).
//
// What "equal" means here. Tensor parallelism splits the row layers' matrix products into partial
// sums that an all-reduce adds up, and context parallelism computes the same attention in other
// batches: the same arithmetic in another order, so the results agree to float32 rounding, not bit
// for bit. kTolerance (relative) is what every comparison with tp = 1 allows; measured: see
// tests/README.md. The starting weights agree exactly (the same random numbers, sliced).
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kit/parallel/context.h"
#include "kit/parallel/mappings.h"
#include "kit/parallel/mesh.h"
#include "kit/parallel/parallel_lm.h"
#include "kit/parallel/random.h"
#include "kit/train/memory.h"  // the cap: tp = 1 out of memory where tp = 4 fits
#include "tp_runs.h"  // kit_bench::train_tp, train_reference (common/bench)

namespace {

using kit_bench::on_ranks;

constexpr double kTolerance = 1e-5;
constexpr int64_t kCapOfTheLesson = 1 << 20;  // MemoryCap.Tp1RunsOutOfMemoryWhereTp4Fits

// The smallest model with everything in it: 4 heads (tp up to 4), 2 blocks, no dropout.
kit::TransformerLMOptions tiny(int64_t seq = 8) {
  kit::TransformerLMOptions o;
  o.vocab_size = 61;
  o.d_model = 16;
  o.heads = 4;
  o.layers = 2;
  o.feedforward = 32;
  o.dropout = 0.0;
  o.max_len = seq;
  return o;
}

// n meshes of one local world, made on n threads (the groups' creation is collective).
std::vector<std::unique_ptr<kit::Mesh>> meshes(int n, kit::MeshOptions o) {
  auto world = kit::ProcessGroup::local_groups(n);
  std::vector<std::unique_ptr<kit::Mesh>> out(n);
  o.ranks_per_node = o.ranks_per_node ? o.ranks_per_node : n;
  auto errors = on_ranks(n, [&](int r) { out[r] = std::make_unique<kit::Mesh>(o, *world[r]); });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return out;
}

// The one line `make` is refused with (std::invalid_argument), or "no error".
template <class F>
std::string message(F&& make) {
  try {
    make();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

// Largest |a - b| over the largest |b|: the difference relative to the tensor's scale.
double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-12);
}

// --- The grid ------------------------------------------------------------------------------------

TEST(MeshLayout, CoordinatesAndGroupsOfTpCpDpWorkedOutByHand) {
  // tp-cp-dp over 8 ranks, 2 x 2 x 2: rank = tp + 2 cp + 4 dp.
  auto l = kit::MeshLayout::make(8, 2, 2, "tp-cp-dp");
  EXPECT_EQ(l.size("dp"), 2);
  EXPECT_EQ(l.coord(5, "tp"), 1);
  EXPECT_EQ(l.coord(5, "cp"), 0);
  EXPECT_EQ(l.coord(5, "dp"), 1);
  EXPECT_EQ(l.coord(6, "cp"), 1);
  using G = std::vector<std::vector<int>>;
  EXPECT_EQ(l.groups("tp"), (G{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.groups("cp"), (G{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.groups("dp"), (G{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.groups("dp-cp"), (G{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(l.groups("cp-dp"), l.groups("dp-cp"));
  EXPECT_EQ(l.groups("tp-cp"), (G{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(l.group_of(5, "tp"), (std::vector<int>{4, 5}));
  EXPECT_EQ(l.rank_at({1, 1, 1}), 7);
  EXPECT_EQ(l.tp_across_nodes(4), "");
  EXPECT_EQ(l.tp_across_nodes(2), "");
}

TEST(MeshLayout, TheOrderDecidesWhichRanksAreNeighbours) {
  // dp fastest: rank = dp + 2 tp on 4 ranks of tp 2: the tp groups stride over the world.
  auto l = kit::MeshLayout::make(4, 2, 1, "dp-tp-cp");
  using G = std::vector<std::vector<int>>;
  EXPECT_EQ(l.groups("tp"), (G{{0, 2}, {1, 3}}));
  EXPECT_EQ(l.groups("dp"), (G{{0, 1}, {2, 3}}));
  EXPECT_EQ(l.order(), "dp-tp-cp");
  // Two ranks per node: nodes {0, 1} and {2, 3}; the tp group 0,2 spans both.
  const std::string why = l.tp_across_nodes(2);
  EXPECT_NE(why.find("the tp group 0,2 would span nodes 0 and 1 (2 ranks per node"), std::string::npos) << why;
  EXPECT_EQ(kit::MeshLayout::make(4, 2, 1, "tp-cp-dp").tp_across_nodes(2), "");
}

TEST(MeshLayout, BadSizesAndOrdersAreOneLine) {
  EXPECT_EQ(message([] { kit::MeshLayout::make(4, 3, 1, "tp-cp-dp"); }),
            "tp x cp = 3 does not divide the 4 ranks (tp 3, cp 1): the world must be dp x cp x tp ranks");
  EXPECT_EQ(message([] { kit::MeshLayout::make(4, 2, 4, "tp-cp-dp"); }),
            "tp x cp = 8 does not divide the 4 ranks (tp 2, cp 4): the world must be dp x cp x tp ranks");
  EXPECT_EQ(message([] { kit::MeshLayout::make(4, 0, 1, "tp-cp-dp"); }), "tp and cp must be at least 1 (tp 0, cp 1)");
  for (const char* order : {"tp-dp", "tp-cp-dp-tp", "tp-cp-xp", "tp,cp,dp"})
    EXPECT_EQ(message([&] { kit::MeshLayout::make(4, 2, 1, order); }),
              "order '" + std::string(order) +
                  "' must name tp, cp and dp once each, joined by '-', fastest-varying first (e.g. tp-cp-dp)");
}

TEST(Mesh, EachRankGetsItsCoordinatesAndGroupsAndATpAllReduceStaysInItsGroup) {
  auto m = meshes(4, {.tp = 2});
  auto errors = on_ranks(4, [&](int r) {
    kit::Mesh& mesh = *m[r];
    EXPECT_EQ(mesh.tp_rank(), r % 2);
    EXPECT_EQ(mesh.dp_rank(), r / 2);
    EXPECT_EQ(mesh.cp_size(), 1);
    EXPECT_EQ(mesh.tp().ranks(), mesh.layout().group_of(r, "tp"));
    EXPECT_EQ(mesh.dp_cp().ranks(), (std::vector<int>{r % 2, r % 2 + 2}));
    EXPECT_EQ(mesh.tp_cp().ranks(), mesh.tp().ranks());
    EXPECT_EQ(mesh.tp().name(), r < 2 ? "0,1" : "2,3");
    auto x = torch::full({1}, static_cast<float>(r + 1));
    mesh.tp().all_reduce(x, kit::ReduceOp::SUM);
    EXPECT_EQ(x.item<float>(), r < 2 ? 3.0f : 7.0f);  // 1 + 2, 3 + 4
  });
  for (auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(m[3]->describe(), "rank 3 of 4: tp 1 of 2, cp 0 of 1, dp 1 of 2 (order tp-cp-dp)");
}

TEST(MeshLayout, PpLeftOutOfTheOrderIsTheSlowestOrNoDirectionAtAll) {
  using G = std::vector<std::vector<int>>;
  // pp 2 x dp 2 x tp 2 on 8 ranks, "tp-cp-dp": rank = tp + 2 dp + 4 pp; stage 0 on ranks 0..3.
  auto l = kit::MeshLayout::make(8, 2, 1, "tp-cp-dp", 2);
  EXPECT_EQ(l.order(), "tp-cp-dp-pp");
  EXPECT_EQ(l.size("dp"), 2);
  EXPECT_EQ(l.coord(6, "pp"), 1);
  EXPECT_EQ(l.coord(6, "dp"), 1);
  EXPECT_EQ(l.groups("pp"), (G{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.groups("dp"), (G{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));  // replicas of one stage
  // Named in the order, pp goes where it is named: "pp-dp" puts a pipeline's stages side by side.
  auto fast = kit::MeshLayout::make(4, 1, 1, "pp-tp-cp-dp", 2);
  EXPECT_EQ(fast.groups("pp"), (G{{0, 1}, {2, 3}}));
  // A pp of 1 left out is no direction: exercise 04's layout, order and groups.
  auto none = kit::MeshLayout::make(4, 2, 1, "tp-cp-dp");
  EXPECT_FALSE(none.has("pp"));
  EXPECT_EQ(none.order(), "tp-cp-dp");
  EXPECT_EQ(none.size("pp"), 1);
  EXPECT_EQ(none.coord(3, "pp"), 0);
  EXPECT_EQ(none.groups("pp"), (G{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(none.groups("dp-pp"), none.groups("dp"));
  EXPECT_EQ(message([] { kit::MeshLayout::make(6, 1, 1, "tp-cp-dp", 4); }),
            "pp x tp x cp = 4 does not divide the 6 ranks (tp 1, cp 1, pp 4): the world must be "
            "pp x dp x cp x tp ranks");
  EXPECT_EQ(message([] { kit::MeshLayout::make(4, 1, 1, "tp-cp-dp", 0); }),
            "tp, cp and pp must be at least 1 (tp 1, cp 1, pp 0)");
  EXPECT_EQ(message([] { kit::MeshLayout::make(4, 1, 1, "tp-pp-cp-dp-pp", 2); }),
            "order 'tp-pp-cp-dp-pp' must name tp, cp and dp once each (and pp at most once), "
            "joined by '-', fastest-varying first (e.g. tp-cp-dp)");
}

TEST(Mesh, PpGroupsJoinTheStagesOfOnePipeline) {
  auto m = meshes(4, {.pp = 2});  // dp 2 x pp 2: rank = dp + 2 pp
  auto errors = on_ranks(4, [&](int r) {
    kit::Mesh& mesh = *m[r];
    EXPECT_EQ(mesh.pp_rank(), r / 2);
    EXPECT_EQ(mesh.pp_size(), 2);
    EXPECT_EQ(mesh.pp().ranks(), (std::vector<int>{r % 2, r % 2 + 2}));
    EXPECT_EQ(mesh.dp().ranks(), (std::vector<int>{r / 2 * 2, r / 2 * 2 + 1}));
    auto x = torch::full({1}, static_cast<float>(r + 1));
    mesh.pp().all_reduce(x, kit::ReduceOp::SUM);
    EXPECT_EQ(x.item<float>(), r % 2 == 0 ? 4.0f : 6.0f);  // 1 + 3, 2 + 4
  });
  for (auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(m[3]->describe(), "rank 3 of 4: tp 0 of 1, cp 0 of 1, dp 1 of 2, pp 1 of 2 (order tp-cp-dp-pp)");
  // Without pp the pipeline is the rank alone.
  auto one = meshes(2, {});
  EXPECT_EQ(one[1]->pp().ranks(), (std::vector<int>{1}));
  EXPECT_EQ(one[1]->pp_size(), 1);
}

TEST(Mesh, BadInputIsOneLineNamingTheCaller) {
  auto world = kit::ProcessGroup::local_groups(4);
  std::vector<std::string> seen(4);
  const int line = __LINE__ + 3;
  auto errors = on_ranks(4, [&](int r) {
    try {
      kit::Mesh mesh({.tp = 3}, *world[r]);
    } catch (const std::invalid_argument& e) {
      seen[r] = e.what();
    }
  });
  EXPECT_EQ(seen[0], "kit::Mesh (parallel_test.cpp:" + std::to_string(line) +
                         "): tp x cp = 3 does not divide the 4 ranks (tp 3, cp 1): the world must be "
                         "dp x cp x tp ranks");
  // A tp group across two nodes of two ranks: refused with the reason, before any group is made.
  errors = on_ranks(4, [&](int r) {
    try {
      kit::Mesh mesh({.tp = 4, .ranks_per_node = 2}, *world[r]);
    } catch (const std::invalid_argument& e) {
      seen[r] = e.what();
    }
  });
  EXPECT_NE(seen[2].find("): the tp group 0,1,2,3 would span nodes 0 and 1 (2 ranks per node"),
            std::string::npos) << seen[2];
  EXPECT_EQ(seen[2].find('\n'), std::string::npos);
}

// --- The operators -------------------------------------------------------------------------------

// Each rank's input and upstream gradient differ (r + 1 times a pattern), so that a backward that
// sums, keeps or slices the wrong thing shows.
struct Probe {
  torch::Tensor x, out, grad;
};
Probe probe(int r, std::vector<int64_t> shape, const std::function<torch::Tensor(const torch::Tensor&)>& op,
            std::vector<int64_t> out_shape) {
  Probe p;
  p.x = (torch::arange(1, 1 + c10::multiply_integers(shape), torch::kFloat).view(shape) * (r + 1))
            .requires_grad_(true);
  p.out = op(p.x);
  auto upstream = torch::arange(1, 1 + c10::multiply_integers(out_shape), torch::kFloat).view(out_shape) *
                  (10 * (r + 1));
  (p.out * upstream).sum().backward();
  p.grad = p.x.grad();
  return p;
}

TEST(Mappings, ForwardAndBackwardOfEachOperatorOnTwoRanks) {
  auto world = kit::ProcessGroup::local_groups(2);
  std::vector<std::map<std::string, Probe>> got(2);
  auto errors = on_ranks(2, [&](int r) {
    auto& g = *world[r];
    got[r]["copy_to"] = probe(r, {2, 3}, [&](auto& x) { return kit::copy_to(x, g); }, {2, 3});
    got[r]["reduce_from"] = probe(r, {2, 3}, [&](auto& x) { return kit::reduce_from(x, g); }, {2, 3});
    got[r]["gather_from"] = probe(r, {2, 3}, [&](auto& x) { return kit::gather_from(x, g); }, {2, 6});
    got[r]["scatter_to"] = probe(r, {2, 4}, [&](auto& x) { return kit::scatter_to(x, g); }, {2, 2});
    got[r]["all_gather_along"] =
        probe(r, {2, 3}, [&](auto& x) { return kit::all_gather_along(x, 0, g); }, {4, 3});
    got[r]["reduce_scatter_along"] =
        probe(r, {4, 3}, [&](auto& x) { return kit::reduce_scatter_along(x, 0, g); }, {2, 3});
  });
  for (auto& e : errors) ASSERT_EQ(e, "");
  auto pattern = [](std::vector<int64_t> shape) {
    return torch::arange(1, 1 + c10::multiply_integers(shape), torch::kFloat).view(shape);
  };
  for (int r = 0; r < 2; ++r) {
    const float k = r + 1;
    SCOPED_TRACE("rank " + std::to_string(r));
    // copy_to: identity; backward sums the ranks' gradients (10 + 20 = 30 times the pattern).
    EXPECT_TRUE(torch::equal(got[r]["copy_to"].out, pattern({2, 3}) * k));
    EXPECT_TRUE(torch::equal(got[r]["copy_to"].grad, pattern({2, 3}) * 30));
    // reduce_from: the sum (1 + 2 = 3 times the pattern); backward: this rank's gradient.
    EXPECT_TRUE(torch::equal(got[r]["reduce_from"].out, pattern({2, 3}) * 3));
    EXPECT_TRUE(torch::equal(got[r]["reduce_from"].grad, pattern({2, 3}) * 10 * k));
    // gather_from: [x0 | x1] along the last dimension; backward: this rank's columns.
    EXPECT_TRUE(torch::equal(got[r]["gather_from"].out, torch::cat({pattern({2, 3}), pattern({2, 3}) * 2}, 1)));
    EXPECT_TRUE(torch::equal(got[r]["gather_from"].grad, (pattern({2, 6}) * 10 * k).narrow(1, 3 * r, 3)));
    // scatter_to: this rank's columns; backward: the ranks' gradients side by side.
    EXPECT_TRUE(torch::equal(got[r]["scatter_to"].out, (pattern({2, 4}) * k).narrow(1, 2 * r, 2)));
    EXPECT_TRUE(torch::equal(got[r]["scatter_to"].grad, torch::cat({pattern({2, 2}) * 10, pattern({2, 2}) * 20}, 1)));
    // all_gather_along dim 0: [x0; x1]; backward: the sum over ranks of their gradient's rows r.
    EXPECT_TRUE(torch::equal(got[r]["all_gather_along"].out, torch::cat({pattern({2, 3}), pattern({2, 3}) * 2}, 0)));
    EXPECT_TRUE(torch::equal(got[r]["all_gather_along"].grad, pattern({4, 3}).narrow(0, 2 * r, 2) * 30));
    // reduce_scatter_along dim 0: rows r of the sum; backward: the ranks' gradients stacked.
    EXPECT_TRUE(torch::equal(got[r]["reduce_scatter_along"].out, (pattern({4, 3}) * 3).narrow(0, 2 * r, 2)));
    EXPECT_TRUE(torch::equal(got[r]["reduce_scatter_along"].grad,
                             torch::cat({pattern({2, 3}) * 10, pattern({2, 3}) * 20}, 0)));
  }
}

TEST(Mappings, EachCollectiveGoesToTheGroupItIsGivenAndNamesTheCaller) {
  auto m = meshes(4, {.tp = 2});
  std::vector<int64_t> world_calls(4), tp_calls(4), dp_calls(4);
  auto errors = on_ranks(4, [&](int r) {
    auto x = torch::ones({2, 2}, torch::requires_grad());
    kit::reduce_from(kit::copy_to(x, m[r]->tp()), m[r]->tp()).sum().backward();
    tp_calls[r] = m[r]->tp().collectives();
    dp_calls[r] = m[r]->dp().collectives();
  });
  for (auto& e : errors) ASSERT_EQ(e, "");
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(tp_calls[r], 2) << "one all-reduce forward (reduce_from), one backward (copy_to)";
    EXPECT_EQ(dp_calls[r], 0);
  }
  // Refused: a size that does not split, a dimension the tensor does not have.
  auto world = kit::ProcessGroup::local_groups(2);
  std::vector<std::string> seen(2);
  const int line = __LINE__ + 3;
  errors = on_ranks(2, [&](int r) {
    try {
      kit::scatter_to(torch::ones({2, 3}), *world[r]);
    } catch (const std::invalid_argument& e) {
      seen[r] = e.what();
    }
  });
  EXPECT_EQ(seen[1], "kit::scatter_to (parallel_test.cpp:" + std::to_string(line) +
                         "): size 3 along dimension -1 does not divide by the group's 2 ranks");
}

// --- The layers ----------------------------------------------------------------------------------

TEST(Layers, ColumnThenRowOnTwoRanksIsTheWholeMLPAndItsGradientsAreTheSlices) {
  torch::manual_seed(3);
  torch::nn::Linear up(6, 8), down(8, 6);
  auto x = torch::randn({3, 6});
  auto full_x = x.clone().requires_grad_(true);
  auto full = down(torch::relu(up(full_x)));
  full.pow(2).sum().backward();
  auto world = kit::ProcessGroup::local_groups(2);
  std::vector<torch::Tensor> out(2), x_grad(2), up_grad(2), up_bias_grad(2), down_grad(2), down_bias_grad(2);
  auto errors = on_ranks(2, [&](int r) {
    kit::ColumnParallelLinear col(up, *world[r]);
    kit::RowParallelLinear row(down, *world[r]);
    EXPECT_EQ(col->weight.sizes(), (std::vector<int64_t>{4, 6}));
    EXPECT_EQ(row->weight.sizes(), (std::vector<int64_t>{6, 4}));
    auto mine = x.clone().requires_grad_(true);
    out[r] = row(torch::relu(col(mine)));
    out[r].pow(2).sum().backward();
    x_grad[r] = mine.grad();
    up_grad[r] = col->weight.grad();
    up_bias_grad[r] = col->bias.grad();
    down_grad[r] = row->weight.grad();
    down_bias_grad[r] = row->bias.grad();
    // Gathered back: the whole layers' weights, on every rank.
    EXPECT_TRUE(torch::equal(col->full_weight(), up->weight.detach()));
    EXPECT_TRUE(torch::equal(col->full_bias(), up->bias.detach()));
    EXPECT_TRUE(torch::equal(row->full_weight(), down->weight.detach()));
  });
  for (auto& e : errors) ASSERT_EQ(e, "");
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_LT(relative(out[r], full), kTolerance);
    EXPECT_LT(relative(x_grad[r], full_x.grad()), kTolerance);  // copy_to's all-reduce
    EXPECT_LT(relative(up_grad[r], up->weight.grad().narrow(0, 4 * r, 4)), kTolerance);
    EXPECT_LT(relative(up_bias_grad[r], up->bias.grad().narrow(0, 4 * r, 4)), kTolerance);
    EXPECT_LT(relative(down_grad[r], down->weight.grad().narrow(1, 4 * r, 4)), kTolerance);
    EXPECT_LT(relative(down_bias_grad[r], down->bias.grad()), kTolerance);
  }
}

// --- The model against exercise 01's on one rank -------------------------------------------------

struct Config {
  const char* name;
  int world, tp, cp;
  kit::CpSplit split;
};

void PrintTo(const Config& c, std::ostream* os) { *os << c.name; }

class ParallelLM : public ::testing::TestWithParam<Config> {};

kit_bench::TpSetup setup_of(const Config& c) {
  kit_bench::TpSetup s;
  s.model = tiny();
  s.world = c.world;
  s.tp = c.tp;
  s.cp = c.cp;
  s.split = c.split;
  s.global_batch = 4;
  s.steps = 4;
  return s;
}

TEST_P(ParallelLM, StartsFromTheWeightsOfTp1AndItsLossesAndFirstGradientsAreTp1s) {
  const auto s = setup_of(GetParam());
  const auto reference = kit_bench::train_reference(s);
  std::vector<std::string> errors;
  const auto runs = kit_bench::train_tp(s, &errors);
  for (int r = 0; r < s.world; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  // A scratch mesh of the same shape, only to ask the model which slice each parameter is.
  auto m = meshes(s.world, {.tp = s.tp, .cp = s.cp});
  double worst_loss = 0, worst_grad = 0;  // printed: the figures tests/README.md quotes
  std::set<std::string> whole;            // parameters every rank holds whole
  for (int r = 0; r < s.world; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    kit::ParallelTransformerLM slicer(s.model, *m[r], {.seed = 99});
    const auto& run = runs[r];
    // The same starting weights, bit for bit: this rank's slices of tp = 1's.
    for (auto& [name, w] : run.initial)
      EXPECT_TRUE(torch::equal(w, slicer->slice_of(name, reference.initial.at(slicer->full_name(name)))))
          << name;
    ASSERT_EQ(run.losses.size(), reference.losses.size());
    for (size_t k = 0; k < run.losses.size(); ++k) {
      worst_loss = std::max(worst_loss, relative(run.losses[k], reference.losses[k]));
      EXPECT_LT(relative(run.losses[k], reference.losses[k]), kTolerance)
          << "step " << k + 1 << ": " << run.losses[k] << " against " << reference.losses[k];
    }
    // After the first backward (DDP's average over dp x cp included): the slice of tp = 1's.
    for (auto& [name, g] : run.first_grads) {
      const auto& full = reference.first_grads.at(slicer->full_name(name));
      const auto want = slicer->slice_of(name, full);
      if (want.sizes() == full.sizes()) whole.insert(name);
      if (want.abs().max().item<double>() == 0) {  // the key bias: exactly zero on both sides
        EXPECT_EQ(g.abs().max().item<double>(), 0) << name;
        continue;
      }
      worst_grad = std::max(worst_grad, relative(g, want));
      EXPECT_LT(relative(g, want), kTolerance) << name;
    }
  }
  // The replicated weights (embedding, norms, head, the row layers' biases) get the same gradient,
  // bit for bit, on every rank of a tp group: nothing all-reduces them over tp, so any difference
  // would make the copies drift apart.
  for (int a = 0; a < s.world; ++a)
    for (int b = a + 1; b < s.world; ++b) {
      if (runs[a].dp_rank != runs[b].dp_rank || runs[a].cp_rank != runs[b].cp_rank) continue;
      for (auto& [name, g] : runs[a].first_grads)
        if (whole.count(name))
          EXPECT_TRUE(torch::equal(g, runs[b].first_grads.at(name))) << name << ", ranks " << a << " and " << b;
    }
  std::printf("%s: losses within %.1e of tp = 1's (relative), first gradients within %.1e\n",
              GetParam().name, worst_loss, worst_grad);
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, ParallelLM,
    ::testing::Values(Config{"tp2", 2, 2, 1, kit::CpSplit::contiguous},
                      Config{"tp4", 4, 4, 1, kit::CpSplit::contiguous},
                      Config{"cp2", 2, 1, 2, kit::CpSplit::contiguous},
                      Config{"cp2_zigzag", 2, 1, 2, kit::CpSplit::zigzag},
                      Config{"dp2_tp2", 4, 2, 1, kit::CpSplit::contiguous},
                      Config{"tp2_cp2_zigzag", 4, 2, 2, kit::CpSplit::zigzag}),
    [](const ::testing::TestParamInfo<Config>& i) { return std::string(i.param.name); });

TEST(ParallelLMParts, ParametersPerRankMatchTheFormula) {
  const auto o = tiny();
  torch::manual_seed(1);
  kit::TransformerLM whole(o);
  int64_t all = 0;
  for (auto& p : whole->parameters()) all += p.numel();
  // Worked out by hand for the tiny model (d 16, ff 32, vocab 61, 2 blocks): embedding 976, head
  // 1037, per block norms 64 + the row layers' biases 32, and 816 + 256 + 544 + 512 split by tp.
  EXPECT_EQ(kit::ParallelTransformerLMImpl::params_per_rank(o, 1), all);
  EXPECT_EQ(all, 976 + 1037 + 2 * (96 + 2128));
  EXPECT_EQ(kit::ParallelTransformerLMImpl::params_per_rank(o, 2), 976 + 1037 + 2 * (96 + 1064));
  for (int tp : {1, 2, 4}) {
    auto m = meshes(tp, {.tp = tp});
    for (int r = 0; r < tp; ++r) {
      kit::ParallelTransformerLM model(o, *m[r], {.seed = 1});
      int64_t held = 0;
      for (auto& p : model->parameters()) held += p.numel();
      EXPECT_EQ(held, kit::ParallelTransformerLMImpl::params_per_rank(o, tp)) << "tp " << tp << ", rank " << r;
    }
  }
}

TEST(ParallelLMParts, GatheredBackItIsTheTp1ModelAndLoadFromSlicesAnyCheckpoint) {
  const auto o = tiny();
  torch::manual_seed(5);
  kit::TransformerLM want(o);
  auto m = meshes(2, {.tp = 2});
  std::vector<kit::ParallelTransformerLM> models;
  for (int r = 0; r < 2; ++r) models.emplace_back(o, *m[r], kit::ParallelLMOptions{.seed = 5});
  std::vector<kit::TransformerLM> got;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(77);  // other weights, to be overwritten
    got.emplace_back(o);
  }
  auto errors = on_ranks(2, [&](int r) { models[r]->gather_into(got[r]); });
  for (auto& e : errors) ASSERT_EQ(e, "");
  for (int r = 0; r < 2; ++r)
    for (auto& p : want->named_parameters())
      EXPECT_TRUE(torch::equal(got[r]->named_parameters()[p.key()], p.value())) << "rank " << r << ": " << p.key();
  // load_from: another model's weights, sliced; gathered again, they are that model's.
  torch::manual_seed(8);
  kit::TransformerLM other(o);
  errors = on_ranks(2, [&](int r) {
    models[r]->load_from(other);
    models[r]->gather_into(got[r]);
  });
  for (auto& e : errors) ASSERT_EQ(e, "");
  for (auto& p : other->named_parameters())
    EXPECT_TRUE(torch::equal(got[1]->named_parameters()[p.key()], p.value())) << p.key();
}

// Megatron's count: per block two all-reduces of [batch, seq, d] in forward and two in backward
// over tp, nothing over tp anywhere else; under cp one all-gather of the keys and values per block
// in forward and one reduce-scatter of their gradient in backward.
TEST(ParallelLMParts, CollectivesPerStepAreMegatronsCountOnTheRightGroups) {
  kit_bench::TpSetup s;
  s.model = tiny();
  s.world = 4;
  s.tp = 2;
  s.cp = 2;
  s.global_batch = 4;
  s.steps = 2;
  std::vector<std::string> errors;
  const auto runs = kit_bench::train_tp(s, &errors);
  for (auto& e : errors) ASSERT_EQ(e, "");
  const int64_t L = s.model.layers, d = s.model.d_model, batch = 4, local_seq = 8 / 2;
  const int64_t activation = batch * local_seq * d * 4;  // bytes of [batch, seq / cp, d] floats
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const auto& t = runs[r].traffic;
    EXPECT_EQ(t.at("tp").calls, (std::map<std::string, int64_t>{{"all_reduce", 4 * L}}));
    EXPECT_EQ(t.at("tp").bytes.at("all_reduce"), 4 * L * activation);
    // Keys and values of this rank's heads (d / tp of each), gathered over cp; their gradient
    // reduce-scattered from the whole [batch, heads, seq, 2 head_dim] (cp times as much).
    EXPECT_EQ(t.at("cp").calls, (std::map<std::string, int64_t>{{"all_gather", L}, {"reduce_scatter", L}}));
    EXPECT_EQ(t.at("cp").bytes.at("all_gather"), L * 2 * activation / 2);
    EXPECT_EQ(t.at("cp").bytes.at("reduce_scatter"), L * 2 * activation);
    // DDP's gradient all-reduces and its buffer broadcast: on dp x cp, never on tp or cp.
    EXPECT_EQ(t.at("dp-cp").calls.count("all_gather"), 0u);
    EXPECT_GE(t.at("dp-cp").calls.at("all_reduce"), 1);
    EXPECT_EQ(t.at("tp").ranks, r < 2 ? "0,1" : "2,3");
    EXPECT_EQ(t.at("cp").ranks, r % 2 == 0 ? "0,2" : "1,3");
  }
}

// --- Dropout's two streams -----------------------------------------------------------------------

TEST(RandomStreams, ReplicatedAlikeOnTheTpRanksParallelDifferentEverywhere) {
  auto m = meshes(4, {.tp = 2});
  std::vector<torch::Tensor> rep(4), par(4);
  for (int r = 0; r < 4; ++r) {
    kit::RandomStreams s(7, *m[r]);
    rep[r] = torch::rand({8}, s.replicated());
    par[r] = torch::rand({8}, s.parallel());
  }
  EXPECT_TRUE(torch::equal(rep[0], rep[1]));   // one tp group
  EXPECT_TRUE(torch::equal(rep[2], rep[3]));
  EXPECT_FALSE(torch::equal(rep[0], rep[2]));  // other data: other masks
  for (int a = 0; a < 4; ++a)
    for (int b = a + 1; b < 4; ++b) EXPECT_FALSE(torch::equal(par[a], par[b])) << a << " " << b;
}

TEST(RandomStreams, DropoutIsTorchsDropoutDrawingFromTheGivenGenerator) {
  auto x = torch::randn({64, 32});
  auto gen = at::detail::createCPUGenerator(11);
  torch::manual_seed(11);
  auto want = torch::dropout(x, 0.3, /*train=*/true);
  EXPECT_TRUE(torch::equal(kit::dropout(x, 0.3, true, gen), want));
  EXPECT_TRUE(torch::equal(kit::dropout(x, 0.3, false, gen), x));
}

// With dropout on, the replicated regions must stay replicated: both tp ranks compute the same
// logits (a replicated stream that differed between them would make them part), while the tp = 2
// model still drops something (the loss moves from dropout 0's).
TEST(RandomStreams, WithDropoutTheTpRanksStillComputeTheSameLogits) {
  auto o = tiny();
  o.dropout = 0.3;
  auto m = meshes(2, {.tp = 2});
  std::vector<kit::ParallelTransformerLM> models;
  for (int r = 0; r < 2; ++r) models.emplace_back(o, *m[r], kit::ParallelLMOptions{.seed = 3});
  std::vector<torch::Tensor> logits(2), eval(2);
  auto tokens = torch::randint(0, o.vocab_size, {2, 8}, torch::kLong);
  auto errors = on_ranks(2, [&](int r) {
    logits[r] = models[r]->forward(tokens).detach();
    models[r]->eval();
    eval[r] = models[r]->forward(tokens).detach();
  });
  for (auto& e : errors) ASSERT_EQ(e, "");
  EXPECT_TRUE(torch::equal(logits[0], logits[1]));
  EXPECT_FALSE(torch::allclose(logits[0], eval[0]));
}

// --- Bad input -----------------------------------------------------------------------------------

TEST(ParallelLMParts, BadShapesAreOneLineNamingTheCaller) {
  auto m = meshes(2, {.tp = 2});
  auto refused = [&](kit::TransformerLMOptions o) {
    try {
      kit::ParallelTransformerLM model(o, *m[0]);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string here = "(parallel_test.cpp:" + std::to_string(__LINE__ - 6) + ")";
  auto o = tiny();
  o.heads = 1;
  EXPECT_EQ(refused(o), "ParallelTransformerLM: heads 1 does not divide by tp = 2 " + here);
  o = tiny();
  o.feedforward = 33;
  EXPECT_EQ(refused(o), "ParallelTransformerLM: feedforward 33 does not divide by tp = 2 " + here);
  // cp: the sequence must split into cp parts (2 cp for zigzag), and fit max_len.
  auto c = meshes(2, {.cp = 2});
  EXPECT_THROW(kit::cp_shard(torch::zeros({2, 7}), 1, *c[0]), std::invalid_argument);
  EXPECT_THROW(kit::cp_shard(torch::zeros({2, 6}), 1, *c[0], kit::CpSplit::zigzag), std::invalid_argument);
  try {
    kit::cp_positions(6, 2, 0, kit::CpSplit::zigzag);
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "kit::cp_positions (parallel_test.cpp:" + std::to_string(__LINE__ - 2) +
                                         "): a sequence of 6 does not split into 4 equal chunks (cp 2, zigzag: 2 cp chunks)");
  }
  kit::ParallelTransformerLM model(tiny(8), *c[1]);
  const int line = __LINE__ - 1;
  try {
    model->forward(torch::zeros({1, 5}, torch::kLong));  // 5 x cp 2 = 10 > max_len 8
    ADD_FAILURE() << "a sequence longer than max_len ran";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "ParallelTransformerLM: a sequence of 10 (5 on each of cp = 2 ranks) is "
                                     "longer than max_len 8: give the model this rank's part of each "
                                     "sequence (kit::cp_shard) (parallel_test.cpp:" + std::to_string(line) + ")");
  }
}

// --- Memory: the cap, as a GPU's ---------------------------------------------------------------

// The cap off again whatever the test does (it is the process's).
struct CapGuard {
  ~CapGuard() { kit::memory::set_cap(0); }
};

TEST(MemoryCap, AnAllocationAboveTheCapIsAGPUsOutOfMemoryErrorNamingPeakAndCap) {
  CapGuard off;
  kit::memory::Account account;
  kit::memory::Account::Charge charge(account);
  auto kept = torch::empty({1024}, torch::kFloat);  // 4096 bytes live
  kit::memory::set_cap(16384);
  auto fits = torch::empty({2048}, torch::kFloat);  // 4096 + 8192 <= 16384
  std::string what;
  try {
    auto too_much = torch::empty({4096}, torch::kFloat);  // 12288 + 16384 > 16384
  } catch (const c10::OutOfMemoryError& e) {
    what = e.what();
  }
  EXPECT_EQ(what.substr(0, what.find('\n')),
            "kit: out of memory: tried to allocate 0.02 MiB with 0.01 MiB live (peak so far 0.01 MiB), "
            "above the cap of 0.02 MiB (kit::memory::set_cap(16384))");
  EXPECT_EQ(account.live(), 12288);  // nothing was allocated for the refused tensor
  kit::memory::set_cap(0);
  auto now_fits = torch::empty({4096}, torch::kFloat);
  EXPECT_EQ(account.live(), 12288 + 16384);
}

TEST(MemoryCap, SizesAreBytesOrKMG) {
  EXPECT_EQ(kit::memory::parse_bytes("1048576"), 1048576);
  EXPECT_EQ(kit::memory::parse_bytes("512M"), 512ll << 20);
  EXPECT_EQ(kit::memory::parse_bytes("1.5G"), 3ll << 29);
  EXPECT_EQ(kit::memory::parse_bytes("64K"), 65536);
  for (const char* bad : {"", "abc", "12X", "-1M", "1.5"}) EXPECT_THROW(kit::memory::parse_bytes(bad), std::invalid_argument) << bad;
}

// NERSC's lesson in numbers: a model whose training state does not fit one rank's memory at tp = 1
// fits at tp = 4, where each rank holds a quarter of every block. The cap is between the two peaks
// (measured: tp_report's figures in common/bench/README.md).
TEST(MemoryCap, Tp1RunsOutOfMemoryWhereTp4Fits) {
  CapGuard off;
  kit_bench::TpSetup s;
  s.model = tiny();
  s.model.d_model = 64;
  s.model.feedforward = 256;
  s.steps = 1;
  std::vector<std::string> errors;
  // Uncapped first: the peaks on each side of the cap.
  s.world = s.tp = 1;
  const int64_t tp1 = kit_bench::train_tp(s, &errors)[0].peak;
  s.world = s.tp = 4;
  int64_t tp4 = 0;
  for (auto& run : kit_bench::train_tp(s, &errors)) tp4 = std::max(tp4, run.peak);
  std::printf("peak per rank: tp 1 %lld bytes, tp 4 %lld bytes; cap %lld\n", (long long)tp1,
              (long long)tp4, (long long)kCapOfTheLesson);
  EXPECT_GT(tp1, kCapOfTheLesson);
  EXPECT_LT(tp4, kCapOfTheLesson);
  kit::memory::set_cap(kCapOfTheLesson);
  s.world = s.tp = 1;
  kit_bench::train_tp(s, &errors);
  EXPECT_NE(errors[0].find("kit: out of memory: tried to allocate"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("above the cap of"), std::string::npos) << errors[0];
  s.world = s.tp = 4;
  const auto runs = kit_bench::train_tp(s, &errors);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_LE(runs[r].peak, kCapOfTheLesson);
  }
}

TEST(Context, ZigzagGivesEachRankAnEarlyAndALateChunk) {
  EXPECT_TRUE(torch::equal(kit::cp_positions(8, 2, 0, kit::CpSplit::zigzag), torch::tensor({0, 1, 6, 7}, torch::kLong)));
  EXPECT_TRUE(torch::equal(kit::cp_positions(8, 2, 1, kit::CpSplit::zigzag), torch::tensor({2, 3, 4, 5}, torch::kLong)));
  EXPECT_TRUE(torch::equal(kit::cp_positions(8, 2, 1, kit::CpSplit::contiguous), torch::tensor({4, 5, 6, 7}, torch::kLong)));
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);  // process-global: once, before any rank thread; ranks are threads
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
