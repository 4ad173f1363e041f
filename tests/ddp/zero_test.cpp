// ZeRO stages 1, 2 and 3 (kit/zero.h, kit/zero3.h) against DDP: N in-process ranks (threads,
// each with its own model and ProcessGroup) train the tiny Transformer with AdamW, once under
// DistributedDataParallel + torch::optim::AdamW and once sharded, from the same weights on the
// same batches. The sharded run must give the same losses and weights (to float tolerance: the
// gradients are averaged by a reduce-scatter instead of an all-reduce, which may sum in another
// order), hold the bytes the ZeRO formula says, and send the bytes the ring model says.
// The vocabulary (61 words) makes the parameter count odd: the layouts need padding.
#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kit/ddp.h"             // DistributedDataParallel: the reference
#include "kit/process_group.h"   // local_groups, CommStats
#include "kit/sharding.h"        // HeldBytes, formula_bytes, ring_bytes, check_zero_stage
#include "kit/transformer_lm.h"  // TransformerLM, lm_loss
#include "kit/zero.h"            // ZeroOptimizer: stages 1 and 2
#include "kit/zero3.h"           // FullyShardedModel: stage 3
#include "tiny_lm.h"             // kit_test::tiny_lm (tests/support)

namespace {

constexpr int64_t kVocab = 61, kSeqLen = 8, kGlobalBatch = 8, kSteps = 4;

torch::optim::AdamWOptions adamw() {
  // eps 1e-3: see tests/ddp/ddp_test.cpp (rounding noise on a mathematically zero gradient).
  return torch::optim::AdamWOptions(1e-3).weight_decay(0.01).eps(1e-3);
}

// Step k's global batch (inputs, targets), the same for every run; rank r reads its rows.
std::pair<torch::Tensor, torch::Tensor> batch(int64_t k, int n, int r) {
  auto gen = at::detail::createCPUGenerator(1000 + k);
  auto ids = torch::randint(0, kVocab, {kGlobalBatch, kSeqLen + 1}, gen, torch::kLong);
  auto mine = ids.narrow(0, r * (kGlobalBatch / n), kGlobalBatch / n);
  return {mine.narrow(1, 0, kSeqLen), mine.narrow(1, 1, kSeqLen)};
}

struct RankRun {
  std::vector<double> losses;   // this rank's, per step
  std::vector<torch::Tensor> weights;  // per unit: the full flat weights after the last step
  kit::HeldBytes held;          // after the last step
  std::map<std::string, int64_t> step_bytes;  // handed to each kind of collective in one step
  int64_t P = 0, padded = 0;
};

std::vector<std::string> on_every_rank(int n, const std::function<void(int)>& body) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// Each unit's parameters end to end (no padding): what the sharded runs are compared on.
std::vector<torch::Tensor> unit_weights(kit::TransformerLM& model) {
  std::vector<torch::Tensor> out;
  for (auto& u : model->units()) {
    std::vector<torch::Tensor> parts;
    for (auto& p : u.module->parameters()) parts.push_back(p.detach().reshape(-1));
    out.push_back(torch::cat(parts));
  }
  return out;
}

// Trains N ranks for kSteps at `stage` (0: DDP) and returns each rank's record.
std::vector<RankRun> train(int stage, int n) {
  auto groups = kit::ProcessGroup::local_groups(n, std::chrono::seconds(30));
  std::vector<kit::TransformerLM> models;
  for (int r = 0; r < n; ++r) {
    torch::manual_seed(r == 0 ? 1 : 100 + r);  // rank 0's weights must reach everybody
    models.emplace_back(kit_test::tiny_lm(kVocab, kSeqLen));
  }
  std::vector<RankRun> runs(n);
  auto errors = on_every_rank(n, [&](int r) {
    kit::ProcessGroup& g = *groups[r];
    kit::ZeroOptions o{stage, adamw(), &g};
    std::unique_ptr<kit::DistributedDataParallel> ddp;
    std::unique_ptr<torch::optim::AdamW> torch_adamw;
    std::unique_ptr<kit::ZeroOptimizer> zero;
    std::unique_ptr<kit::FullyShardedModel> zero3;
    if (stage == 0) {
      kit::DDPOptions d;
      d.group = &g;
      ddp = std::make_unique<kit::DistributedDataParallel>(models[r], d);
      torch_adamw = std::make_unique<torch::optim::AdamW>(models[r]->parameters(), adamw());
    } else if (stage < 3) {
      zero = std::make_unique<kit::ZeroOptimizer>(models[r], o);
    } else {
      zero3 = std::make_unique<kit::FullyShardedModel>(models[r], o);
    }
    for (int64_t k = 0; k < kSteps; ++k) {
      auto before = g.stats().bytes;
      auto [input, target] = batch(k, n, r);
      auto logits = zero3 ? zero3->forward(input) : models[r]->forward(input);
      auto loss = kit::lm_loss(logits, target);
      loss.backward();
      if (torch_adamw) torch_adamw->step();
      if (zero) zero->step();
      if (zero3) zero3->step();
      runs[r].losses.push_back(loss.item<double>());
      runs[r].step_bytes.clear();
      for (auto& [kind, b] : g.stats().bytes) runs[r].step_bytes[kind] = b - before[kind];
      if (k + 1 < kSteps) {  // the last step's gradients stay, for held()
        if (torch_adamw) torch_adamw->zero_grad();
        if (zero) zero->zero_grad();
        if (zero3) zero3->zero_grad();
      }
    }
    RankRun& run = runs[r];
    if (stage == 0) {
      auto params = models[r]->parameters();
      run.held.params = kit::bytes_of(params);
      std::vector<torch::Tensor> grads, state;
      for (auto& p : params) grads.push_back(p.grad());
      for (auto& [key, s] : torch_adamw->state()) {
        auto& a = static_cast<torch::optim::AdamWParamState&>(*s);
        state.push_back(a.exp_avg());
        state.push_back(a.exp_avg_sq());
      }
      run.held.grads = kit::bytes_of(grads);
      run.held.optimizer = kit::bytes_of(state);
      run.P = run.padded = kit::bytes_of(params) / 4;
    } else if (zero) {
      run.held = zero->held();
      run.P = zero->layout().numel();
      run.padded = zero->layout().padded();
    } else {
      run.held = zero3->held();
      run.P = zero3->numel();
      run.padded = zero3->padded();
    }
    if (!zero3) run.weights = unit_weights(models[r]);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return runs;
}

double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-12);
}

struct Case {
  int stage, n;
};

class Zero : public ::testing::TestWithParam<Case> {};

// Same losses, same weights as DDP, and the bytes of the ZeRO formula.
TEST_P(Zero, MatchesDDPAndHoldsTheFormulasBytes) {
  const int stage = GetParam().stage, n = GetParam().n;
  const std::vector<RankRun> ddp = train(0, n);
  const std::vector<RankRun> zero = train(stage, n);
  ASSERT_EQ(zero.size(), static_cast<size_t>(n));
  EXPECT_GT(std::abs(ddp[0].losses.front() - ddp[0].losses.back()), 1e-3) << "training must move";
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(zero[r].losses.size(), static_cast<size_t>(kSteps));
    for (int64_t k = 0; k < kSteps; ++k)
      EXPECT_NEAR(zero[r].losses[k], ddp[r].losses[k], 1e-5 * std::abs(ddp[r].losses[k]))
          << "rank " << r << ", step " << k + 1;
    // The bytes held, measured on the tensors, against the formula with this layout's padding.
    const auto want = kit::formula_bytes(stage, zero[r].P, zero[r].padded, n);
    EXPECT_EQ(zero[r].held.params, want.params) << "rank " << r;
    EXPECT_EQ(zero[r].held.grads, want.grads) << "rank " << r;
    EXPECT_EQ(zero[r].held.optimizer, want.optimizer) << "rank " << r;
    EXPECT_EQ(zero[r].P, ddp[r].P);
    const auto dp = kit::formula_bytes(0, ddp[r].P, ddp[r].P, n);
    EXPECT_EQ(ddp[r].held.params, dp.params);
    EXPECT_EQ(ddp[r].held.grads, dp.grads);
    EXPECT_EQ(ddp[r].held.optimizer, dp.optimizer);
    EXPECT_LT(zero[r].held.total(), ddp[r].held.total()) << "sharding must hold less than DDP";
    if (stage == 3) {  // one unit's full weights at a time: the largest, a Transformer block
      EXPECT_GT(zero[r].held.gathered_peak, 0);
      EXPECT_LT(zero[r].held.gathered_peak, 4 * zero[r].P);
    }
  }
  // The weights: under ZeRO-1/2 each rank's model; under ZeRO-3 nobody holds them whole, and
  // the equal losses of the last step say they agreed before it.
  if (stage < 3)
    for (int r = 0; r < n; ++r)
      for (size_t u = 0; u < ddp[0].weights.size(); ++u) {
        EXPECT_LE(relative(zero[r].weights[u], ddp[0].weights[u]), 1e-5) << "rank " << r << " unit " << u;
        EXPECT_TRUE(torch::equal(zero[r].weights[u], zero[0].weights[u])) << "rank " << r << " unit " << u;
      }
  // Bytes sent per step in a ring, against the theory: stage 1 = 1.5x DDP's, 2 = DDP's, 3 = 1.5x.
  auto sent = [&](const RankRun& run) {
    double s = 0;
    for (auto& [kind, b] : run.step_bytes) s += kit::ring_bytes(kind, static_cast<double>(b), n);
    return s;
  };
  const double ratio = sent(zero[0]) / sent(ddp[0]);
  const double expected = stage == 2 ? 1.0 : 1.5;
  EXPECT_NEAR(ratio, expected, 0.01) << "ZeRO-" << stage << " sends " << ratio << "x DDP's bytes";
}

INSTANTIATE_TEST_SUITE_P(Stages, Zero,
                         ::testing::Values(Case{1, 2}, Case{2, 2}, Case{3, 2}, Case{2, 4}, Case{3, 4}),
                         [](const auto& info) {
                           return "ZeRO" + std::to_string(info.param.stage) + "_N" +
                                  std::to_string(info.param.n);
                         });

// Bad input: one line each.
TEST(ZeroBadInput, StageOutOfRange) {
  EXPECT_EQ(kit::check_zero_stage(3), 3);
  try {
    kit::check_zero_stage(4);
    FAIL() << "stage 4 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "ZeRO stage 4 does not exist: use 0 (DDP), 1, 2 or 3");
  }
  auto groups = kit::ProcessGroup::local_groups(1);
  kit::TransformerLM model(kit_test::tiny_lm(kVocab, kSeqLen));
  EXPECT_THROW(kit::ZeroOptimizer(model, {-1, adamw(), groups[0].get()}), std::invalid_argument);
  EXPECT_THROW(kit::ZeroOptimizer(model, {3, adamw(), groups[0].get()}), std::invalid_argument);
  EXPECT_THROW(kit::FullyShardedModel(model, {2, adamw(), groups[0].get()}), std::invalid_argument);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(ZeroBadInput, DDPAndZeroOnOneModelAreRefused) {
  auto groups = kit::ProcessGroup::local_groups(1);
  kit::TransformerLM model(kit_test::tiny_lm(kVocab, kSeqLen));
  kit::DDPOptions d;
  d.group = groups[0].get();
  {
    kit::DistributedDataParallel ddp(model, d);
    EXPECT_EQ(error_of([&] { kit::ZeroOptimizer z(model, {2, adamw(), groups[0].get()}); }),
              "ZeRO-2: this model is already wrapped by DistributedDataParallel; use one of them "
              "per model, not both");
    EXPECT_NE(error_of([&] { kit::FullyShardedModel z(model, {3, adamw(), groups[0].get()}); }), "");
  }
  kit::ZeroOptimizer zero(model, {1, adamw(), groups[0].get()});  // DDP gone: the model is free
  const std::string e = error_of([&] { kit::DistributedDataParallel again(model, d); });
  EXPECT_EQ(e, "DistributedDataParallel: this model is already wrapped by ZeRO-1; use one of them "
               "per model, not both");
  EXPECT_EQ(e.find('\n'), std::string::npos);
}

// Parameters that do not divide by the ranks are padded: 7 elements on 4 ranks.
TEST(ZeroLayout, PadsToAMultipleOfTheRanks) {
  std::vector<torch::Tensor> ps{torch::arange(3, torch::kFloat), torch::arange(4, torch::kFloat).view({2, 2})};
  kit::ShardLayout l(ps, 4, 3);
  EXPECT_EQ(l.numel(), 7);
  EXPECT_EQ(l.shard(), 2);
  EXPECT_EQ(l.padded(), 8);
  auto flat = l.flatten(ps);
  EXPECT_TRUE(torch::equal(l.own(flat), torch::tensor({3.f, 0.f})));  // the last shard ends in padding
  EXPECT_TRUE(torch::equal(l.part(flat, 1), ps[1]));
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);  // the ranks are threads already
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
