// ZeRO-3 on the summariser's encoder-decoder (kit/seq2seq/model.h: Seq2Seq::units(),
// forward_chain(); kit/sharding/zero3.h: a unit that reuses an earlier one's parameters, and
// FullParams). The model is no plain chain: the decoder's layers read the encoder's output, and one
// embedding matrix serves three places. Checked here:
//   - its chain of units computes forward() bit for bit, dropout's draws included;
//   - N in-process ranks (threads, each with its own model and ProcessGroup) trained under
//     FullyShardedModel give DDP's losses and weights (to float tolerance: a reduce-scatter per use
//     of the tied embedding, which DDP sums in one all-reduce), with and without recomputation;
//   - FullParams lets the model's own greedy_decode run on the sharded model, and empties the
//     parameters again after (outside it, greedy_decode refuses in one line);
//   - a unit that says it reuses parameters that are not exactly an earlier unit's is one line.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kit/ddp/ddp.h"                // DistributedDataParallel: the reference
#include "kit/runtime/process_group.h"  // local_groups
#include "kit/seq2seq/model.h"          // Seq2Seq, seq2seq_loss
#include "kit/sharding/zero3.h"         // FullyShardedModel
#include "seq2seq_runs.h"               // kit_bench::seq2seq_options, seq2seq_batch
#include "zero_runs.h"                  // kit_bench::on_every_rank, adamw

namespace {

kit::Seq2SeqOptions options(double dropout = 0.0) {
  return kit_bench::seq2seq_options(2, dropout);
}
using Batch = kit_bench::Seq2SeqBatch;
Batch batch(uint64_t seed, int64_t rows) { return kit_bench::seq2seq_batch(seed, rows); }

// The units run one after the other, unsharded: what FullyShardedModel's forward computes.
torch::Tensor run_units(kit::Seq2Seq& model, const torch::Tensor& x) {
  torch::Tensor y = x;
  for (auto& u : model->units()) y = u.run(y);
  return y;
}

double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-12);
}

TEST(Zero3Seq2Seq, TheChainOfUnitsIsForwardBitForBit) {
  for (double dropout : {0.0, 0.3}) {
    kit::Seq2Seq model(options(dropout));
    model->train();
    const Batch b = batch(11, 4);
    torch::manual_seed(42);
    auto want = model->forward(b.src, b.tgt_in);
    torch::manual_seed(42);
    auto got = model->forward_chain([&](const torch::Tensor& x) { return run_units(model, x); },
                                    b.src, b.tgt_in);
    EXPECT_TRUE(torch::equal(got, want)) << "dropout " << dropout;
  }
  // Three units reuse the embedding: the documents', the summaries' and the output projection.
  kit::Seq2Seq model(options());
  int reused = 0;
  for (auto& u : model->units()) reused += u.reuse;
  EXPECT_EQ(model->units().size(), 1u + 2 + 1 + 1 + 2 + 1 + 1);
  EXPECT_EQ(reused, 2);
}

struct TrainRun {
  std::vector<std::vector<double>> losses;  // per rank, per step
  std::vector<torch::Tensor> weights;       // rank 0: every parameter, flattened, in model order
  std::vector<std::string> names;           // their names
  std::vector<std::string> errors;
};

constexpr int64_t kSteps = 3, kRows = 4;

// N ranks train from rank 0's weights on their own rows of the same batches: under DDP and
// torch::optim::AdamW, or under FullyShardedModel with the model's units.
TrainRun train(bool zero3, int n, bool recompute = false) {
  auto groups = kit::ProcessGroup::local_groups(n, std::chrono::seconds(30));
  std::vector<kit::Seq2Seq> models;
  for (int r = 0; r < n; ++r) {
    auto o = options();
    o.seed = r == 0 ? 5 : 50 + r;  // the others' weights differ: rank 0's must reach them
    models.emplace_back(o);
  }
  TrainRun out;
  out.losses.resize(n);
  out.errors = kit_bench::on_every_rank(n, [&](int r) {
    kit::Seq2Seq& model = models[r];
    std::unique_ptr<kit::FullyShardedModel> sharded;
    std::unique_ptr<kit::DistributedDataParallel> ddp;
    std::unique_ptr<torch::optim::AdamW> adamw;
    if (zero3) {
      sharded = std::make_unique<kit::FullyShardedModel>(
          model, model->units(), kit::ZeroOptions{3, kit_bench::adamw(), groups[r].get()},
          kit::FullyShardedOptions{recompute});
    } else {
      kit::DDPOptions d;
      d.group = groups[r].get();
      ddp = std::make_unique<kit::DistributedDataParallel>(model, d);
      adamw = std::make_unique<torch::optim::AdamW>(model->parameters(), kit_bench::adamw());
    }
    model->train();
    for (int64_t k = 0; k < kSteps; ++k) {
      const Batch all = batch(100 + k, kRows * n);
      const Batch b{all.src.narrow(0, r * kRows, kRows), all.tgt_in.narrow(0, r * kRows, kRows),
                    all.tgt_out.narrow(0, r * kRows, kRows)};
      auto logits = zero3 ? model->forward_chain(
                                [&](const torch::Tensor& x) { return sharded->forward(x); },
                                b.src, b.tgt_in)
                          : ddp->forward_with([&] { return model->forward(b.src, b.tgt_in); });
      auto loss = kit::seq2seq_loss(logits, b.tgt_out, 0);
      loss.backward();
      if (zero3) {
        sharded->step();
        sharded->zero_grad();
      } else {
        adamw->step();
        adamw->zero_grad();
      }
      out.losses[r].push_back(loss.item<double>());
    }
    auto weights = [&] {
      for (auto& p : model->named_parameters()) {
        out.weights.push_back(p.value().detach().reshape(-1).clone());
        out.names.push_back(p.key());
      }
    };
    if (!zero3) {
      if (r == 0) weights();
      return;
    }
    auto full = sharded->full_params();  // every rank: the gathers
    if (r == 0) weights();
  });
  return out;
}

class Zero3Seq2SeqTraining : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(Zero3Seq2SeqTraining, MatchesDDP) {
  const auto [n, recompute] = GetParam();
  const TrainRun ddp = train(false, n), zero = train(true, n, recompute);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(ddp.errors[r], "") << "rank " << r;
    ASSERT_EQ(zero.errors[r], "") << "rank " << r;
  }
  EXPECT_GT(std::abs(ddp.losses[0].front() - ddp.losses[0].back()), 1e-3) << "training must move";
  for (int r = 0; r < n; ++r)
    for (int64_t k = 0; k < kSteps; ++k)
      EXPECT_NEAR(zero.losses[r][k], ddp.losses[r][k], 1e-5 * std::abs(ddp.losses[r][k]))
          << "rank " << r << ", step " << k + 1;
  ASSERT_EQ(zero.weights.size(), ddp.weights.size());
  ASSERT_EQ(zero.names, ddp.names);
  for (size_t i = 0; i < ddp.weights.size(); ++i) {
    torch::Tensor a = zero.weights[i], b = ddp.weights[i];
    // The attention's key bias (the middle third of in_proj_bias) has a gradient of zero but for
    // rounding: softmax ignores what adds the same to every score of a query. AdamW divides that
    // rounding by its own square root, so those elements follow no reference, DDP's included
    // (kit/models/transformer_lm.h holds them at zero for the same reason). The rest must agree.
    if (ddp.names[i].ends_with("in_proj_bias")) {
      const int64_t d = b.numel() / 3;
      a = torch::cat({a.narrow(0, 0, d), a.narrow(0, 2 * d, d)});
      b = torch::cat({b.narrow(0, 0, d), b.narrow(0, 2 * d, d)});
    }
    EXPECT_LE(relative(a, b), 1e-5) << ddp.names[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Zero3Seq2SeqTraining,
                         ::testing::Values(std::make_tuple(1, false), std::make_tuple(2, false),
                                           std::make_tuple(2, true)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks" +
                                  (std::get<1>(info.param) ? "_Recompute" : "");
                         });

// The model's own methods on the sharded model, inside FullParams: the unsharded model's result;
// before and after it the parameters are empty (0 elements).
TEST(Zero3Seq2Seq, FullParamsRunsTheModelsOwnDecoding) {
  auto groups = kit::ProcessGroup::local_groups(1);
  kit::Seq2Seq model(options()), twin(options());
  model->eval();
  twin->eval();
  kit::FullyShardedModel sharded(model, model->units(),
                                 kit::ZeroOptions{3, kit_bench::adamw(), groups[0].get()});
  const Batch b = batch(7, 3);
  for (auto& p : model->parameters()) EXPECT_EQ(p.numel(), 0);
  {
    auto full = sharded.full_params();
    EXPECT_TRUE(torch::equal(model->greedy_decode(b.src, 6), twin->greedy_decode(b.src, 6)));
  }
  for (auto& p : model->parameters()) EXPECT_EQ(p.numel(), 0);
  // Outside it, the model's own methods say what is missing in one line.
  try {
    model->greedy_decode(b.src, 6);
    ADD_FAILURE() << "decoded without weights";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("Seq2Seq::greedy_decode: the model's weights are not "
                                          "here", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("full_params()"), std::string::npos) << e.what();
  }
  // The chain under no-grad (evaluation): the unsharded model's logits.
  torch::NoGradGuard no_grad;
  auto logits = model->forward_chain([&](const torch::Tensor& x) { return sharded.forward(x); },
                                     b.src, b.tgt_in);
  EXPECT_TRUE(torch::equal(logits, twin->forward(b.src, b.tgt_in)));
}

TEST(Zero3Seq2Seq, AReuseOfOtherParametersIsOneLine) {
  auto groups = kit::ProcessGroup::local_groups(1);
  kit::Seq2Seq model(options());
  auto units = kit::sharded_units(model->units());
  units.back().params.push_back(model->transformer()->encoder.ptr()->parameters().front());
  const int line = __LINE__ + 1;
  kit::ZeroOptions o{3, kit_bench::adamw(), groups[0].get()};
  try {
    kit::FullyShardedModel z(model, units, o);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "FullyShardedModel: unit '" + units.back().name + "' reuses parameters that are not "
              "exactly those of one earlier unit (zero3_seq2seq_test.cpp:" +
                  std::to_string(line) + ")");
  }
  for (auto& p : model->parameters()) EXPECT_GT(p.numel(), 0) << "the model as it was";
}

}  // namespace
