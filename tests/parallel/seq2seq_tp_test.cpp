// Tensor parallelism on the summariser's encoder-decoder (kit/seq2seq/parallel.h): N ranks as
// threads on a local Gloo world, each with its own ParallelSeq2Seq made from the same Seq2Seq.
// Checked here:
//   - at tp 1, 2 and 4 its logits are Seq2Seq's (to float tolerance: the row layers' sums over tp
//     and the batch-first attention add in another order), padding in both inputs;
//   - after three SGD steps on its loss, the weights gathered back by write_full() are those of
//     Seq2Seq trained on the same batches (so every gradient, of the split and of the whole
//     weights, is the full model's), and every tp rank gathers exactly the same model (the
//     replicated weights stay alike without being all-reduced);
//   - clip_grad_norm_ clips by the whole model's norm, as kit::clip_grad_norm_ on Seq2Seq;
//   - with dropout, the tp ranks still hold the same replicated weights (replicated stream);
//   - what it cannot split is one line naming it and the calling line.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kit/parallel/mesh.h"          // Mesh
#include "kit/parallel/random.h"        // RandomStreams
#include "kit/runtime/process_group.h"  // local_groups
#include "kit/seq2seq/parallel.h"       // ParallelSeq2Seq
#include "kit/train/clip.h"              // clip_grad_norm_: the reference's clipping
#include "seq2seq_runs.h"                // kit_bench::seq2seq_options, seq2seq_batch
#include "tp_runs.h"                    // kit_bench::on_ranks

namespace {

kit::Seq2SeqOptions options(double dropout = 0.0) {
  return kit_bench::seq2seq_options(4, dropout);
}
using Batch = kit_bench::Seq2SeqBatch;
Batch batch(uint64_t seed, int64_t rows) { return kit_bench::seq2seq_batch(seed, rows); }

// Largest |a - b| over the largest |b|.
double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-12);
}

// A local world of n ranks and a mesh on each (made on n threads: creating groups is collective).
struct World {
  std::vector<std::shared_ptr<kit::ProcessGroup>> groups;
  std::vector<std::unique_ptr<kit::Mesh>> meshes;
};
World world(int n, kit::MeshOptions o) {
  World w;
  w.groups = kit::ProcessGroup::local_groups(n);
  w.meshes.resize(n);
  o.ranks_per_node = n;
  auto errors = kit_bench::on_ranks(n, [&](int r) {
    w.meshes[r] = std::make_unique<kit::Mesh>(o, *w.groups[r]);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return w;
}

constexpr int kSteps = 3, kRows = 4;

struct TpRun {
  std::vector<torch::Tensor> first_logits;                    // per rank
  std::vector<std::map<std::string, torch::Tensor>> trained;  // per rank: write_full()'s model
  std::vector<std::vector<double>> norms;                     // per rank: clip_grad_norm_'s
};

// Every rank trains its ParallelSeq2Seq (tp = n) with SGD on the same batches.
TpRun train_tp(int n, double dropout, double clip = 0) {
  World w = world(n, kit::MeshOptions{.tp = n});
  TpRun run;
  run.first_logits.resize(n);
  run.trained.resize(n);
  run.norms.resize(n);
  // Made here, one after the other: a Seq2Seq draws its weights from the process's generator.
  std::vector<kit::Seq2Seq> fulls, gathered;
  for (int r = 0; r < n; ++r) {
    fulls.emplace_back(options(dropout));
    auto o = options(dropout);
    o.seed = 77;  // other weights: write_full must overwrite every one
    gathered.emplace_back(o);
  }
  auto errors = kit_bench::on_ranks(n, [&](int r) {
    kit::RandomStreams streams(7, *w.meshes[r]);
    kit::ParallelSeq2Seq model(fulls[r], *w.meshes[r], streams);
    model->train();
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.5));
    for (int k = 0; k < kSteps; ++k) {
      const Batch b = batch(100 + k, kRows);
      auto logits = model->forward(b.src, b.tgt_in);
      if (k == 0) run.first_logits[r] = logits.detach().clone();
      kit::seq2seq_loss(logits, b.tgt_out, 0).backward();
      if (clip > 0) run.norms[r].push_back(model->clip_grad_norm_(clip).item<double>());
      sgd.step();
      sgd.zero_grad();
    }
    model->write_full(gathered[r]);
    for (auto& p : gathered[r]->named_parameters())
      run.trained[r][p.key()] = p.value().detach().clone();
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return run;
}

// The whole model trained as train_tp() trains the split one; its norms before clipping.
std::vector<double> train_whole(kit::Seq2Seq& ref, torch::Tensor& first_logits, double clip = 0) {
  ref->train();
  torch::optim::SGD sgd(ref->parameters(), torch::optim::SGDOptions(0.5));
  std::vector<double> norms;
  for (int k = 0; k < kSteps; ++k) {
    const Batch b = batch(100 + k, kRows);
    auto logits = ref->forward(b.src, b.tgt_in);
    if (k == 0) first_logits = logits.detach().clone();
    kit::seq2seq_loss(logits, b.tgt_out, 0).backward();
    if (clip > 0) norms.push_back(kit::clip_grad_norm_(ref->parameters(), clip).item<double>());
    sgd.step();
    sgd.zero_grad();
  }
  return norms;
}

TEST(ParallelSeq2Seq, AtTp1To4ItComputesSeq2SeqsLogitsAndTrainsItsWeights) {
  // The reference: the whole model, the same batches and steps.
  kit::Seq2Seq ref(options());
  torch::Tensor ref_logits;
  train_whole(ref, ref_logits);
  for (int n : {1, 2, 4}) {
    TpRun run = train_tp(n, 0.0);
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(run.first_logits[r].defined()) << "tp " << n << " rank " << r;
      EXPECT_LT(relative(run.first_logits[r], ref_logits), 1e-5) << "tp " << n << " rank " << r;
      ASSERT_EQ(run.trained[r].size(), ref->named_parameters().size());
      for (auto& p : ref->named_parameters()) {
        EXPECT_LT(relative(run.trained[r].at(p.key()), p.value()), 1e-5)
            << p.key() << ", tp " << n << " rank " << r;
        // Every tp rank gathers the same model, bit for bit.
        EXPECT_TRUE(torch::equal(run.trained[r].at(p.key()), run.trained[0].at(p.key())))
            << p.key() << ", tp " << n << " rank " << r << " against rank 0";
      }
    }
  }
}

TEST(ParallelSeq2Seq, ItClipsTheWholeModelsGradientNorm) {
  kit::Seq2Seq ref(options());
  torch::Tensor ref_logits;
  const std::vector<double> want = train_whole(ref, ref_logits, 0.05);
  TpRun run = train_tp(2, 0.0, 0.05);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(run.norms[r].size(), want.size());
    for (size_t k = 0; k < want.size(); ++k) {
      EXPECT_GT(want[k], 0.05) << "step " << k << ": the clipping must act";
      EXPECT_NEAR(run.norms[r][k], want[k], 1e-5 * want[k]) << "rank " << r << " step " << k;
    }
    for (auto& p : ref->named_parameters())
      EXPECT_LT(relative(run.trained[r].at(p.key()), p.value()), 1e-5) << p.key() << " rank " << r;
  }
}

TEST(ParallelSeq2Seq, WithDropoutTheTpRanksStillHoldTheSameModel) {
  TpRun run = train_tp(2, 0.3);
  for (auto& [name, value] : run.trained[0]) {
    EXPECT_TRUE(torch::isfinite(value).all().item<bool>()) << name;
    EXPECT_TRUE(torch::equal(run.trained[1].at(name), value)) << name;
  }
  // Dropout did drop: the first logits differ from a run without it.
  TpRun plain = train_tp(2, 0.0);
  EXPECT_GT(relative(run.first_logits[0], plain.first_logits[0]), 1e-3);
}

// The one line a ParallelSeq2Seq of `o` on rank 0 of an n-rank mesh is refused with.
std::string refusal(int n, kit::MeshOptions mesh_options, const kit::Seq2SeqOptions& o) {
  World w = world(n, mesh_options);
  std::vector<std::string> what(n);
  std::vector<kit::Seq2Seq> fulls;
  for (int r = 0; r < n; ++r) fulls.emplace_back(o);
  auto errors = kit_bench::on_ranks(n, [&](int r) {
    kit::RandomStreams streams(7, *w.meshes[r]);
    try {
      kit::ParallelSeq2Seq model(fulls[r], *w.meshes[r], streams);
      what[r] = "no error";
    } catch (const std::invalid_argument& e) {
      what[r] = e.what();
    }
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return what[0];
}

TEST(ParallelSeq2Seq, WhatItCannotSplitIsOneLineNamingTheCaller) {
  auto o = options();
  o.d_model = 12;  // 4 heads of 3
  const std::string heads = refusal(3, {.tp = 3}, o);
  EXPECT_EQ(heads.rfind("ParallelSeq2Seq: 4 heads do not split over tp = 3 (", 0), 0u) << heads;
  EXPECT_NE(heads.find("seq2seq_tp_test.cpp:"), std::string::npos) << heads;
  const std::string feedforward = [&] {
    auto f = options();
    f.feedforward = 21;
    return refusal(2, {.tp = 2}, f);
  }();
  EXPECT_EQ(feedforward.rfind("ParallelSeq2Seq: feedforward 21 does not split over tp = 2 (", 0),
            0u)
      << feedforward;
  const std::string cp = refusal(2, {.tp = 1, .cp = 2}, options());
  EXPECT_EQ(cp.rfind("ParallelSeq2Seq: splits the model over tp only, not over cp (2)", 0), 0u)
      << cp;
}

}  // namespace
