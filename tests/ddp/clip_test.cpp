// Gradient clipping by global norm (--clip-grad; kit/sharding/clip.h) under DDP and ZeRO-1/2/3,
// against one process that clips the same averaged gradient with torch::nn::utils::clip_grad_norm_.
//
// The reference trains rank 0's initial weights on the whole global batch: with equal shares of
// the batch, its mean loss is the mean of the ranks' losses and its gradient the ranks' average.
// Each step it clips, then steps torch::optim::AdamW. The distributed runs (common/bench/
// zero_runs.h: N in-process ranks) must report the same global norm before clipping at every
// step, and reach the same losses and weights. The norm is set well below the gradient's, so
// every step clips; AdamW's eps of 1e-3 makes its first update nearly linear in the gradient, so
// a gradient scaled by another factor moves the weights visibly. A rank that clips its shard by
// its own norm instead of the global one fails here (the norms at once, the weights after it).
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kit/sharding/clip.h"             // clip_shard_grads_, check_max_grad_norm
#include "kit/runtime/process_group.h"  // local_groups
#include "kit/sharding/sharding.h"      // ShardLayout
#include "kit/models/transformer_lm.h"  // TransformerLM, lm_loss
#include "kit/sharding/zero.h"          // ZeroOptimizer
#include "kit/sharding/zero3.h"         // FullyShardedModel
#include "tiny_lm.h"                    // kit_test::tiny_lm (tests/support)
#include "zero_runs.h"                  // kit_bench::train, batch, unit_weights, on_every_rank

namespace {

constexpr int64_t kVocab = 61, kSeqLen = 8, kGlobalBatch = 8, kSteps = 4;
constexpr double kMaxNorm = 0.05;

kit_bench::Setup clipped() {
  kit_bench::Setup s;
  s.model = kit_test::tiny_lm(kVocab, kSeqLen);
  s.global_batch = kGlobalBatch;
  s.steps = kSteps;
  s.max_grad_norm = kMaxNorm;
  return s;
}

struct Reference {
  std::vector<double> losses, norms;
  std::vector<torch::Tensor> weights;  // per unit, after the last step
};

// One process, the whole global batch, clip_grad_norm_ then AdamW.
Reference reference(const kit_bench::Setup& s) {
  torch::manual_seed(1);  // rank 0's weights (zero_runs.h seeds rank 0 with 1)
  kit::TransformerLM model(s.model);
  torch::optim::AdamW optimizer(model->parameters(), kit_bench::adamw());
  Reference ref;
  for (int64_t k = 0; k < s.steps; ++k) {
    auto [input, target] = kit_bench::batch(s, k, 1, 0);
    optimizer.zero_grad();
    auto loss = kit::lm_loss(model->forward(input), target);
    loss.backward();
    ref.norms.push_back(torch::nn::utils::clip_grad_norm_(model->parameters(), s.max_grad_norm));
    optimizer.step();
    ref.losses.push_back(loss.item<double>());
  }
  ref.weights = kit_bench::unit_weights(model);
  return ref;
}

double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-12);
}

class Clip : public ::testing::TestWithParam<int> {};  // the stage (0: DDP)

TEST_P(Clip, EqualsOneProcessClipGradNorm) {
  const int stage = GetParam(), n = 2;
  const auto s = clipped();
  const Reference ref = reference(s);
  std::vector<std::string> errors;
  const auto runs = kit_bench::train(s, stage, n, &errors);
  for (int r = 0; r < n; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  double worst_norm = 0, worst_loss = 0, worst_weight = 0;
  for (int64_t k = 0; k < kSteps; ++k) {
    ASSERT_GT(ref.norms[k], 2 * kMaxNorm) << "step " << k + 1 << " must clip";
    double mean_loss = 0;
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(runs[r].grad_norms.size(), static_cast<size_t>(kSteps)) << "rank " << r;
      const double d = std::abs(runs[r].grad_norms[k] - ref.norms[k]) / ref.norms[k];
      worst_norm = std::max(worst_norm, d);
      EXPECT_LE(d, 1e-5) << "rank " << r << ", step " << k + 1 << ": global norm "
                         << runs[r].grad_norms[k] << ", one process " << ref.norms[k];
      mean_loss += runs[r].losses[k] / n;
    }
    const double d = std::abs(mean_loss - ref.losses[k]) / ref.losses[k];
    worst_loss = std::max(worst_loss, d);
    EXPECT_LE(d, 1e-5) << "step " << k + 1 << ": loss " << mean_loss << ", one process "
                       << ref.losses[k];
  }
  if (stage < 3)  // ZeRO-3 holds no whole model; its last losses say the weights agreed
    for (int r = 0; r < n; ++r)
      for (size_t u = 0; u < ref.weights.size(); ++u) {
        const double d = relative(runs[r].weights[u], ref.weights[u]);
        worst_weight = std::max(worst_weight, d);
        EXPECT_LE(d, 1e-5) << "rank " << r << " unit " << u;
      }
  std::printf("stage %d: largest relative difference to one process: norm %.2e, loss %.2e, "
              "weights %.2e\n", stage, worst_norm, worst_loss, worst_weight);
}

INSTANTIATE_TEST_SUITE_P(Stages, Clip, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) {
                           return info.param == 0 ? std::string("DDP")
                                                  : "ZeRO" + std::to_string(info.param);
                         });

// clip_shard_grads_ alone: a gradient of 11 elements cut into 2 shards of 6 (one padding zero),
// each rank scaling its shard, equals clip_grad_norm_ on the whole; below max_norm, untouched.
TEST(ClipShardGrads, TheShardsTogetherAreTheWholeClipped) {
  const int n = 2;
  auto whole = torch::randn({11}, at::detail::createCPUGenerator(5));
  const double norm = whole.norm().item<double>();
  for (double max_norm : {0.3 * norm, 2 * norm}) {
    auto param = torch::zeros({11}, torch::requires_grad());
    param.mutable_grad() = whole.clone();
    const double want_norm = torch::nn::utils::clip_grad_norm_({param}, max_norm);
    auto groups = kit::ProcessGroup::local_groups(n);
    std::vector<torch::Tensor> shards(n);
    std::vector<double> norms(n);
    auto errors = kit_bench::on_every_rank(n, [&](int r) {
      kit::ShardLayout layout({whole}, n, r);
      shards[r] = layout.own(layout.flatten({whole})).clone();
      norms[r] = kit::clip_shard_grads_({shards[r]}, max_norm, *groups[r]).item<double>();
    });
    for (int r = 0; r < n; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
    auto together = torch::cat(shards).narrow(0, 0, 11);
    for (int r = 0; r < n; ++r) EXPECT_NEAR(norms[r], want_norm, 1e-6 * want_norm) << "rank " << r;
    EXPECT_LE(relative(together, param.grad()), 1e-6) << "max_norm " << max_norm;
    if (max_norm > norm) EXPECT_TRUE(torch::equal(together, whole)) << "below max_norm: unchanged";
  }
}

TEST(ClipBadInput, NegativeMaxGradNormIsOneLine) {
  auto groups = kit::ProcessGroup::local_groups(1);
  kit::TransformerLM model(kit_test::tiny_lm(kVocab, kSeqLen));
  kit::ZeroOptions o{1, kit_bench::adamw(), groups[0].get()};
  o.max_grad_norm = -1;
  try {
    kit::ZeroOptimizer zero(model, o);
    FAIL() << "a negative max_grad_norm was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "ZeroOptimizer: max_grad_norm must be > 0 (or 0: no clipping), got -1.000000");
  }
}

}  // namespace
