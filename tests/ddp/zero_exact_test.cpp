// ZeRO-1, -2 and -3 against DDP + torch::optim::AdamW on 2 ranks, at zero tolerance: judged only
// by their public face (the losses each rank computes and, stages 1-2, the weights at the end), so
// that it holds for any implementation of the stages. Why exact: with two ranks the average of
// the gradients, (a + b) / 2, has the same bits whether an all-reduce or a reduce-scatter makes
// it and whichever rank comes first, and ShardedAdamW does torch::optim::AdamW's element-wise
// operations in its order (kit/sharding/sharding.h). So any difference is a bug, however small: a
// weight decay moved after the update, a bias correction a step late, a sum instead of an average
// (tests/ddp/zero_test.cpp allows 1e-5, which such bugs pass; its 4 ranks need it).
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kit/train/lr_rule.h"  // scale_lr, warmup_factor: exercise 02's schedule
#include "tiny_lm.h"    // kit_test::tiny_lm (tests/support)
#include "zero_runs.h"  // kit_bench::train: N ranks at a stage (common/bench)

namespace {

class ZeroExact : public ::testing::TestWithParam<int> {};

kit_bench::Setup tiny(int64_t steps) {
  kit_bench::Setup s;
  s.model = kit_test::tiny_lm(61, 8);  // 61 words: an odd parameter count, the shards padded
  s.global_batch = 8;
  s.steps = steps;
  return s;
}

// Every rank's losses, and (stages 1-2) weights, of the run at `stage` are DDP's, bit for bit.
void expect_ddps(const kit_bench::Setup& s, int stage) {
  std::vector<std::string> errors;
  const auto ddp = kit_bench::train(s, 0, 2, &errors);
  for (int r = 0; r < 2; ++r) ASSERT_EQ(errors[r], "") << "DDP, rank " << r;
  const auto zero = kit_bench::train(s, stage, 2, &errors);
  for (int r = 0; r < 2; ++r) ASSERT_EQ(errors[r], "") << "ZeRO-" << stage << ", rank " << r;
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(zero[r].losses.size(), ddp[r].losses.size());
    for (size_t k = 0; k < ddp[r].losses.size(); ++k)
      EXPECT_EQ(zero[r].losses[k], ddp[r].losses[k]) << "rank " << r << ", step " << k + 1;
    // ZeRO-3: nobody holds the weights whole; the losses of steps 2 on are those of the updated
    // weights, so every update but the last is judged through them.
    if (stage == 3) continue;
    ASSERT_EQ(zero[r].weights.size(), ddp[r].weights.size());
    for (size_t u = 0; u < ddp[r].weights.size(); ++u)
      EXPECT_TRUE(torch::equal(zero[r].weights[u], ddp[r].weights[u]))
          << "rank " << r << ", unit " << u << ": largest difference "
          << (zero[r].weights[u] - ddp[r].weights[u]).abs().max().item<double>();
  }
}

TEST_P(ZeroExact, TwoRanksEqualDDPBitForBit) { expect_ddps(tiny(4), GetParam()); }

// A learning rate that changes from step to step, set through set_lr() (ZeRO) and torch's param
// groups (DDP): exercise 02's schedule, the rate for the global batch (the sqrt rule, 4 times the
// base batch) after a warm-up of 3 steps. The rate moves at every step of the warm-up, so a ZeRO
// step that used the rate of the constructor, or of the step before, would not be DDP's.
TEST_P(ZeroExact, TwoRanksEqualDDPBitForBitUnderAnLRSchedule) {
  auto s = tiny(5);
  const double peak = kit::scale_lr(kit_bench::adamw().lr(), kit::LrScaling::sqrt, 8, 2);
  s.lr = [peak](int64_t k) { return peak * kit::warmup_factor(k, 3); };
  expect_ddps(s, GetParam());
  // The schedule is not the constant rate: the losses part from step 2 on.
  std::vector<std::string> errors;
  const auto with = kit_bench::train(s, GetParam(), 2, &errors);
  ASSERT_EQ(errors[0], "");
  const auto without = kit_bench::train(tiny(5), GetParam(), 2, &errors);
  ASSERT_EQ(errors[0], "");
  EXPECT_EQ(with[0].losses[0], without[0].losses[0]);
  EXPECT_NE(with[0].losses[1], without[0].losses[1]);
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroExact, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "zero" + std::to_string(i.param);
                         });

}  // namespace
