// The formulas the course teaches, each against numbers worked out by hand (never against the
// kit's own output): the learning-rate rules and warm-up (kit/train/lr_rule.h), the throughput
// figures of metrics.csv and of the scaling summary under a clock the test drives
// (kit/train/metrics.h, kit/train/summary.h), the bytes per rank of the ZeRO report
// (kit/sharding/sharding.h), AdamW on shards against torch::optim::AdamW at zero tolerance, and the
// loader workers' order with a batch that is slow on purpose (kit/data/loader_workers.h).
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unistd.h>  // getpid
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kit/data/loader_workers.h"  // LoaderWorkers
#include "kit/models/resnet.h"         // ResNet: the image preset's sizes
#include "kit/models/transformer_lm.h" // TransformerLM: the LM preset's sizes
#include "kit/train/args.h"           // parse_args, --preset
#include "kit/train/clip.h"           // clip_grad_norm_
#include "kit/train/image_args.h"     // parse_image_args
#include "kit/train/lr_rule.h"        // scale_lr, warmup_factor
#include "kit/train/metrics.h"        // Metrics
#include "kit/sharding/sharding.h"    // ShardLayout, ShardedAdamW, formula_bytes, ring_bytes
#include "kit/train/summary.h"        // StepTimer, append_summary

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using kit::LrScaling;

// ---- learning rate --------------------------------------------------------------------------

TEST(LrScaling, LinearMultipliesByTheRatioOfTheBatches) {
  // lr 0.1 tuned for 256 images; 4 ranks x 256 = 1024: four times the batch, four times the rate.
  EXPECT_DOUBLE_EQ(kit::scale_lr(0.1, LrScaling::linear, 1024, 256), 0.4);
  EXPECT_DOUBLE_EQ(kit::scale_lr(0.1, LrScaling::linear, 128, 256), 0.05);
  EXPECT_DOUBLE_EQ(kit::scale_lr(0.1, LrScaling::linear, 256, 256), 0.1);
}

TEST(LrScaling, SqrtMultipliesByTheRootOfTheRatioNotOfTheRate) {
  EXPECT_DOUBLE_EQ(kit::scale_lr(0.1, LrScaling::sqrt, 1024, 256), 0.2);      // sqrt(4) = 2
  EXPECT_DOUBLE_EQ(kit::scale_lr(0.003, LrScaling::sqrt, 2304, 256), 0.009);  // sqrt(9) = 3
  EXPECT_DOUBLE_EQ(kit::scale_lr(0.1, LrScaling::sqrt, 64, 256), 0.05);       // sqrt(1/4)
  EXPECT_DOUBLE_EQ(kit::scale_lr(1.0, LrScaling::sqrt, 512, 256), 1.4142135623730951);
}

TEST(LrScaling, NoneKeepsTheRate) {
  EXPECT_DOUBLE_EQ(kit::scale_lr(0.1, LrScaling::none, 1024, 256), 0.1);
  EXPECT_DOUBLE_EQ(kit::scale_lr(0.1, LrScaling::none, 64, 256), 0.1);
}

TEST(LrScaling, NamesParseAndAnUnknownOneIsRefused) {
  EXPECT_EQ(kit::parse_lr_scaling("linear"), LrScaling::linear);
  EXPECT_EQ(kit::parse_lr_scaling("sqrt"), LrScaling::sqrt);
  EXPECT_EQ(kit::parse_lr_scaling("none"), LrScaling::none);
  EXPECT_THROW(kit::parse_lr_scaling("cosine"), std::invalid_argument);
}

// Warm-up over 10 steps (step 0-based): 1/10 at the first step, 5/10 in the middle, 10/10 at the
// last step of the warm-up, then 1 for good.
TEST(Warmup, ClimbsLinearlyFromOneTenthToOneOverItsSteps) {
  EXPECT_DOUBLE_EQ(kit::warmup_factor(0, 10), 0.1);   // first: never a zero rate
  EXPECT_DOUBLE_EQ(kit::warmup_factor(1, 10), 0.2);
  EXPECT_DOUBLE_EQ(kit::warmup_factor(4, 10), 0.5);   // middle
  EXPECT_DOUBLE_EQ(kit::warmup_factor(8, 10), 0.9);
  EXPECT_DOUBLE_EQ(kit::warmup_factor(9, 10), 1.0);   // last step of the warm-up: the full rate
  EXPECT_DOUBLE_EQ(kit::warmup_factor(10, 10), 1.0);  // after it
  EXPECT_DOUBLE_EQ(kit::warmup_factor(1000, 10), 1.0);
}

TEST(Warmup, NoWarmupIsTheFullRateFromTheFirstStep) {
  EXPECT_DOUBLE_EQ(kit::warmup_factor(0, 0), 1.0);
  EXPECT_DOUBLE_EQ(kit::warmup_factor(5, 0), 1.0);
  EXPECT_DOUBLE_EQ(kit::warmup_factor(0, 1), 1.0);  // one step of warm-up: 1/1
}

// ---- throughput -----------------------------------------------------------------------------

Clock::time_point at(double seconds) {
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(seconds)));
}

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream in(line);
  for (std::string cell; std::getline(in, cell, ',');) cells.push_back(cell);
  if (!line.empty() && line.back() == ',') cells.push_back("");
  return cells;
}

// The rows of a CSV file as column name -> cell.
std::vector<std::map<std::string, std::string>> read_csv(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  const auto header = split(line);
  std::vector<std::map<std::string, std::string>> rows;
  while (std::getline(in, line)) {
    const auto cells = split(line);
    EXPECT_EQ(cells.size(), header.size()) << line;
    std::map<std::string, std::string> row;
    for (size_t k = 0; k < header.size() && k < cells.size(); ++k) row[header[k]] = cells[k];
    rows.push_back(row);
  }
  return rows;
}

// Laps 1.0, 0.5, 2.0, 0.25 and 3.0 s apart: the median of all five is 1.0; leaving out the first
// two (1.0, 0.5), the median of 2.0, 0.25, 3.0 is 2.0.
TEST(StepTimer, MedianOfTheLapsAfterTheSkippedOnes) {
  kit::StepTimer timer;
  EXPECT_EQ(timer.median_seconds(), 0.0);
  for (double t : {10.0, 11.0, 11.5, 13.5, 13.75, 16.75}) timer.lap(at(t));
  EXPECT_EQ(timer.steps(), 5);
  EXPECT_DOUBLE_EQ(timer.median_seconds(0), 1.0);
  EXPECT_DOUBLE_EQ(timer.median_seconds(2), 2.0);
  EXPECT_DOUBLE_EQ(timer.median_seconds(5), 1.0);  // nothing left after the skip: all of them
}

// 4 ranks x 64 images, a step every 0.5 s: 512 images/s in all, 128 per rank.
TEST(Summary, TotalAndPerRankRatesFromTheStepTime) {
  TempDir dir("kit-summary");
  kit::RunSummary row;
  row.label = "hand";
  row.world_size = 4;
  row.batch_per_rank = 64;
  row.global_batch = 256;
  row.steps = 100;
  row.step_time_s = 0.5;
  row.device = "cpu";
  kit::append_summary((dir.path / "s.csv").string(), row);
  row.world_size = 8, row.global_batch = 512, row.step_time_s = 0.25;  // 2048 in all, 256 per rank
  kit::append_summary((dir.path / "s.csv").string(), row);
  const auto rows = read_csv(dir.path / "s.csv");
  ASSERT_EQ(rows.size(), 2u) << "one header, then one row per call";
  EXPECT_EQ(rows[0].at("images_per_s"), "512.00");
  EXPECT_EQ(rows[0].at("images_per_s_per_rank"), "128.00");
  EXPECT_EQ(rows[0].at("step_time_s"), "0.500000");
  EXPECT_EQ(rows[1].at("images_per_s"), "2048.00");
  EXPECT_EQ(rows[1].at("images_per_s_per_rank"), "256.00");
}

// One process (world size 1), batch 8. The clock: the Metrics are made at 0 s, steps end at
// 2, 2.5, 3 and 4 s; none of them is a tenth step, so no row is written until end_epoch(), which
// reads the four losses at once at 4 s. The rows written together share their rate, that of the
// steps after the epoch's first over the time from its end to the read: 3 x 8 / (4 - 2) = 12
// samples/s each (not 8 / (time since the previous step), 4, 16, 16, 8: on a GPU the host's
// clock at a step says when it was queued, not done). elapsed_s stays each step's own clock. The
// epoch's figure counts the same steps: 3 x 8 / (4 - 2) = 12 samples/s (not 4 x 8 / 2 = 16, and
// not 32 / 4 = 8 from the start).
TEST(MetricsRates, PerStepAndPerEpochSamplesPerSecondUnderAGivenClock) {
  TempDir dir("kit-metrics");
  std::vector<double> times{0.0, 2.0, 2.5, 3.0, 4.0, 4.0, 4.0};
  size_t next = 0;
  auto clock = [&] { return at(times.at(std::min(next++, times.size() - 1))); };
  {
    kit::Metrics metrics(dir.path.string(), 8, torch::kCPU, 0, 1e9, clock);
    metrics.data_ranks(1);  // every rank its own batch, as by default: no rate changes
    for (int k = 0; k < 4; ++k) metrics.step(0, torch::tensor(2.5f - 0.5f * k));
    EXPECT_EQ(read_csv(dir.path / "metrics.csv").size(), 0u) << "no row before the batch is written";
    metrics.end_epoch(0);
  }
  const auto rows = read_csv(dir.path / "metrics.csv");
  ASSERT_EQ(rows.size(), 5u) << "four step rows and one rank row";
  const char* loss[] = {"2.5", "2", "1.5", "1"};
  const char* elapsed[] = {"2.000", "2.500", "3.000", "4.000"};
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(rows[k].at("step"), std::to_string(k + 1));
    EXPECT_EQ(rows[k].at("loss"), loss[k]) << "step " << k + 1;
    EXPECT_EQ(rows[k].at("samples_per_s"), "12.0") << "step " << k + 1 << ": 3 steps x 8 over 2 s";
    EXPECT_EQ(rows[k].at("elapsed_s"), elapsed[k]) << "step " << k + 1;
    EXPECT_EQ(rows[k].at("ranks"), "1");
  }
  EXPECT_EQ(rows[4].at("rank"), "0");
  EXPECT_EQ(rows[4].at("step"), "4");
  EXPECT_EQ(rows[4].at("samples_per_s"), "12.0") << "3 steps x 8 samples over 2 s";
}

// data_ranks(n): only n ranks train on batches of their own (tensor or pipeline parallelism: the
// ranks of one copy of the model share theirs), and each batch counts once. n must divide the
// world size: here, one process, only 1 does; 1 changes no rate (the test above, with
// data_ranks(1)); 0, 2 and -1 are refused in one line naming the call.
TEST(MetricsRates, DataRanksMustDivideTheWorld) {
  TempDir dir("kit-metrics-share");
  kit::Metrics metrics(dir.path.string(), 8, torch::kCPU);
  for (int n : {0, 2, -1}) {
    try {
      metrics.data_ranks(n);
      ADD_FAILURE() << n << " data-parallel ranks were taken";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()), "Metrics::data_ranks: " + std::to_string(n) +
                                           " data-parallel ranks must divide the world size 1");
    }
  }
  EXPECT_NO_THROW(metrics.data_ranks(1));
}

// Rows are written at every tenth step (Checkpoints::kStopPollSteps: a signal's stop finds its
// rows in the file) and at end_epoch(). Batch 8, one process; step k ends at k s, the losses of
// steps 1..10 are read at 10.5 s, those of 11 and 12 at end_epoch(), at 13 s. The clock of the
// rates and of the step timer (rank 0's, for the scaling study) starts at step 1's end, 1 s:
// steps 2..10 took (10.5 - 1) / 9 = 1.0556 s each, 7.6 samples/s for rows 1-10; steps 11 and 12
// (13 - 10.5) / 2 = 1.25 s each, 6.4 samples/s; the timer's median 1.0556 s. A second epoch's
// first step, after a 100 s evaluation, starts the clock afresh: step 14 took 115.5 - 114 =
// 1.5 s, 5.3 samples/s for rows 13 and 14, and the evaluation counts nowhere.
TEST(MetricsRates, RowsAreWrittenAtEveryTenthStepAndAtTheEpochsEnd) {
  TempDir dir("kit-metrics-batches");
  std::vector<double> times{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10.5, 11, 12, 13, 13,
                            114, 115, 115.5, 115.5};
  size_t next = 0;
  auto clock = [&] { return at(times.at(std::min(next++, times.size() - 1))); };
  {
    kit::Metrics metrics(dir.path.string(), 8, torch::kCPU, 0, 1e9, clock);
    for (int k = 1; k <= 9; ++k) metrics.step(0, torch::tensor(static_cast<float>(k)));
    EXPECT_EQ(read_csv(dir.path / "metrics.csv").size(), 0u) << "steps 1-9: nothing written yet";
    metrics.step(0, torch::tensor(10.0f));
    EXPECT_EQ(read_csv(dir.path / "metrics.csv").size(), 10u) << "step 10 writes rows 1-10";
    metrics.step(0, torch::tensor(11.0f));
    metrics.step(0, torch::tensor(12.0f));
    metrics.end_epoch(0);
    EXPECT_NEAR(metrics.step_timer().median_seconds(0), 9.5 / 9, 1e-12);
    EXPECT_EQ(metrics.step_timer().steps(), 11);
    // Epoch 2 after a 100 s evaluation: steps at 114 and 115 s, written at 115.5 s.
    metrics.step(1, torch::tensor(13.0f));
    metrics.step(1, torch::tensor(14.0f));
    metrics.end_epoch(1);
    EXPECT_EQ(metrics.step_timer().steps(), 12) << "one more step timed: 115.5 - 114";
    EXPECT_NEAR(metrics.step_timer().median_seconds(0), 9.5 / 9, 1e-12);
  }
  const auto rows = read_csv(dir.path / "metrics.csv");
  ASSERT_EQ(rows.size(), 16u) << "12 step rows, a rank row, 2 step rows, a rank row";
  for (int k = 0; k < 12; ++k) {
    EXPECT_EQ(rows[k].at("step"), std::to_string(k + 1));
    EXPECT_EQ(rows[k].at("loss"), std::to_string(k + 1));
    EXPECT_EQ(rows[k].at("samples_per_s"), k < 10 ? "7.6" : "6.4") << "step " << k + 1;
  }
  EXPECT_EQ(rows[12].at("rank"), "0");
  EXPECT_EQ(rows[13].at("step"), "13");
  EXPECT_EQ(rows[13].at("samples_per_s"), "5.3") << "8 samples over 1.5 s, not over the evaluation";
  EXPECT_EQ(rows[14].at("samples_per_s"), "5.3");
  EXPECT_EQ(rows[15].at("rank"), "0");
  EXPECT_EQ(rows[15].at("samples_per_s"), "8.0") << "epoch 2: one step after the first, 115 - 114 s";
}

// A step timer given a lap of several steps: each took an equal part. Laps at 0 s (the start), 3 s
// (3 steps: 1 s each) and 3.5 s (1 step: 0.5 s): four steps, median of 1, 1, 1, 0.5 is 1.
TEST(StepTimer, ALapOfSeveralStepsSharesItsTime) {
  kit::StepTimer timer;
  timer.lap(at(0.0), 3);  // only starts the clock
  timer.lap(at(3.0), 3);
  timer.lap(at(3.5), 1);
  EXPECT_EQ(timer.steps(), 4);
  EXPECT_DOUBLE_EQ(timer.median_seconds(0), 1.0);
  EXPECT_DOUBLE_EQ(timer.median_seconds(3), 0.5);
  timer.lap(at(4.0), 0);  // no step: nothing, and the clock goes on from 3.5 s
  timer.lap(at(5.5), 1);
  EXPECT_EQ(timer.steps(), 5);
  EXPECT_DOUBLE_EQ(timer.median_seconds(4), 2.0);
}

// ---- clipping ---------------------------------------------------------------------------------

// kit::clip_grad_norm_ against LibTorch's torch::nn::utils::clip_grad_norm_ at zero tolerance: the
// same gradients bit for bit, the same norm, for the L2 norm, the largest magnitude (inf), p = 3
// and 0 (the count of gradients), each with a max_norm that clips and one that does not; a
// parameter without gradient is left without. The norm comes back as a 0-d tensor on the
// gradients' device, read by nobody inside the call.
TEST(ClipGradNorm, TorchsCppClipGradNormBitForBit) {
  torch::manual_seed(11);
  const std::vector<torch::Tensor> start{torch::randn({5, 7}), torch::randn({13}), torch::randn({2, 3, 4}),
                                         torch::randn({3})};
  for (double norm_type : {2.0, std::numeric_limits<double>::infinity(), 3.0, 0.0}) {
    for (double max_norm : {0.3, 1e6}) {
      std::vector<torch::Tensor> ours, theirs;
      for (size_t i = 0; i < start.size(); ++i) {
        ours.push_back(start[i].clone().requires_grad_(true));
        theirs.push_back(start[i].clone().requires_grad_(true));
        if (i == 3) continue;  // no gradient
        auto g = torch::randn(start[i].sizes()) * static_cast<double>(i + 1);
        ours.back().mutable_grad() = g.clone();
        theirs.back().mutable_grad() = g.clone();
      }
      const torch::Tensor norm = kit::clip_grad_norm_(ours, max_norm, norm_type);
      const double want = torch::nn::utils::clip_grad_norm_(theirs, max_norm, norm_type);
      const std::string what = "norm_type " + std::to_string(norm_type) + ", max_norm " + std::to_string(max_norm);
      EXPECT_EQ(norm.dim(), 0) << what;
      EXPECT_EQ(norm.item<double>(), want) << what;
      for (size_t i = 0; i < start.size(); ++i) {
        ASSERT_EQ(ours[i].grad().defined(), theirs[i].grad().defined()) << what;
        if (ours[i].grad().defined())
          EXPECT_TRUE(torch::equal(ours[i].grad(), theirs[i].grad())) << what << ", parameter " << i;
      }
    }
  }
  // Nothing to clip: a zero, as torch's (0.0 in C++, tensor(0.) in Python).
  EXPECT_EQ(kit::clip_grad_norm_({torch::zeros({2}, torch::requires_grad())}, 1.0).item<double>(), 0.0);
}

// ---- bytes per rank -------------------------------------------------------------------------

// P = 10 parameters on N = 4 ranks: shards of S = 3, padded to 12. fp32 AdamW: 4 bytes a weight,
// 4 a gradient, 8 of state. Stage 0 keeps all three whole; stage 1 shards the state (8 S = 24),
// stage 2 also the gradients (4 S = 12), stage 3 also the weights (12).
TEST(ZeroBytes, FormulaPerStageByHand) {
  std::vector<torch::Tensor> params{torch::zeros({2, 3}), torch::zeros({4})};
  kit::ShardLayout layout(params, 4, 1);
  ASSERT_EQ(layout.numel(), 10);
  ASSERT_EQ(layout.shard(), 3);
  ASSERT_EQ(layout.padded(), 12);
  EXPECT_EQ(layout.begin(), 3);
  const int64_t expected[4][3] = {{40, 40, 80}, {40, 40, 24}, {40, 12, 24}, {12, 12, 24}};
  for (int stage = 0; stage <= 3; ++stage) {
    const auto b = kit::formula_bytes(stage, 10, 12, 4);
    EXPECT_EQ(b.params, expected[stage][0]) << "stage " << stage;
    EXPECT_EQ(b.grads, expected[stage][1]) << "stage " << stage;
    EXPECT_EQ(b.optimizer, expected[stage][2]) << "stage " << stage;
    EXPECT_EQ(b.total(), expected[stage][0] + expected[stage][1] + expected[stage][2]);
  }
}

// A ring on 4 ranks: an all-reduce of 1000 bytes sends 2 x 3/4 x 1000 = 1500 per rank, a
// reduce-scatter of 1000 bytes 750, an all-gather of a 250-byte shard 3 x 250 = 750.
TEST(ZeroBytes, RingBytesPerRankByHand) {
  EXPECT_DOUBLE_EQ(kit::ring_bytes("all_reduce", 1000, 4), 1500);
  EXPECT_DOUBLE_EQ(kit::ring_bytes("reduce_scatter", 1000, 4), 750);
  EXPECT_DOUBLE_EQ(kit::ring_bytes("all_gather", 250, 4), 750);
  EXPECT_DOUBLE_EQ(kit::ring_bytes("all_reduce", 1000, 1), 0);  // alone: nothing to send
  EXPECT_DOUBLE_EQ(kit::ring_bytes("broadcast", 1000, 4), 0);
}

// ---- AdamW on shards --------------------------------------------------------------------------

// One step on one weight, by hand: w = 1, g = 0.5, lr 0.1, weight decay 0.1, betas (0.9, 0.999).
// Decay first: 1 x (1 - 0.01) = 0.99; m = 0.05, v = 0.00025; corrected m/(1-0.9) = 0.5,
// v/(1-0.999) = 0.25, sqrt 0.5; update 0.1 x 0.5 / (0.5 + 1e-8) = 0.1. So w = 0.89 (decaying after
// the update would give 0.9 x 0.99 = 0.891).
TEST(ShardedAdamW, OneStepByHand) {
  auto w = torch::ones({1});
  kit::ShardedAdamW adam(torch::optim::AdamWOptions(0.1).weight_decay(0.1), w);
  adam.update(w, torch::full({1}, 0.5f));
  EXPECT_NEAR(w.item<double>(), 0.89, 1e-6);
  EXPECT_EQ(adam.steps(), 1);
}

// Three parameters (P = 23, an odd count: the last of N = 3 shards ends in padding), five steps of
// random gradients. Each rank's ShardedAdamW updates its slice of the flat vector; put together,
// the slices must equal torch::optim::AdamW on the whole parameters bit for bit: the same
// element-wise operations in the same order (kit/sharding/sharding.h). A large rate and weight
// decay make an operation out of place (decay after the update, a bias correction off by one step)
// far larger than rounding.
TEST(ShardedAdamW, ShardsTogetherAreTorchsAdamWBitForBit) {
  constexpr int kRanks = 3, kSteps = 5;
  const auto options = torch::optim::AdamWOptions(0.05).weight_decay(0.3).betas(std::make_tuple(0.8, 0.95));
  torch::manual_seed(7);
  std::vector<torch::Tensor> reference{torch::randn({3, 4}), torch::randn({7}), torch::randn({4})};
  std::vector<torch::Tensor> ours;
  for (auto& p : reference) ours.push_back(p.clone());
  for (auto& p : reference) p.set_requires_grad(true);
  torch::optim::AdamW torch_adamw(reference, options);

  std::vector<kit::ShardLayout> layouts;
  for (int r = 0; r < kRanks; ++r) layouts.emplace_back(ours, kRanks, r);
  auto flat = layouts[0].flatten(ours);
  ASSERT_EQ(flat.numel(), 24);
  std::vector<kit::ShardedAdamW> shards;
  for (int r = 0; r < kRanks; ++r) shards.emplace_back(options, layouts[r].own(flat));

  for (int step = 1; step <= kSteps; ++step) {
    std::vector<torch::Tensor> grads;
    for (auto& p : reference) grads.push_back(torch::randn(p.sizes()) * step);
    for (size_t i = 0; i < reference.size(); ++i) reference[i].mutable_grad() = grads[i].clone();
    torch_adamw.step();
    const auto flat_grad = layouts[0].flatten(grads);
    for (int r = 0; r < kRanks; ++r) shards[r].update(layouts[r].own(flat), layouts[r].own(flat_grad));
    for (size_t i = 0; i < reference.size(); ++i)
      EXPECT_TRUE(torch::equal(layouts[0].part(flat, i), reference[i].detach()))
          << "step " << step << ", parameter " << i << ": largest difference "
          << (layouts[0].part(flat, i) - reference[i].detach()).abs().max().item<double>();
  }
  EXPECT_EQ(flat[23].item<float>(), 0.f) << "the padding stays zero";
}

// ---- loader workers -------------------------------------------------------------------------

// Batch 0 is slow on purpose: it is not finished until batch 2 has been started, which a worker
// does only after it has made batch 1 and stored it, and then 200 ms more. The training thread
// asks for batch 0 as soon as batch 2 has started, so batch 1 is always ready, and batch 0 not
// yet, when get(0) looks: a get() that hands out whichever batch is ready first fails every time,
// not only when the threads happen to run in that order (as with equally fast batches).
TEST(LoaderWorkersOrder, ASlowFirstBatchIsStillHandedOutFirst) {
  std::mutex mutex;
  std::condition_variable started;
  bool third_started = false;
  auto wait_for_third = [&] {
    std::unique_lock<std::mutex> lock(mutex);
    // A bound, so that a loader that makes one batch at a time fails instead of hanging.
    return started.wait_for(lock, std::chrono::seconds(10), [&] { return third_started; });
  };
  auto make = [&](size_t k) {
    if (k == 2) {
      std::lock_guard<std::mutex> lock(mutex);
      third_started = true;
      started.notify_all();
    }
    if (k == 0 && wait_for_third()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return kit::Batch{torch::full({1}, static_cast<int64_t>(k)), torch::full({1}, -static_cast<int64_t>(k))};
  };
  constexpr size_t kCount = 6;
  kit::LoaderWorkers workers(make, 0, kCount, /*workers=*/2, /*prefetch=*/2);
  ASSERT_TRUE(wait_for_third()) << "two workers never made batches 0 and 1 at the same time";
  for (size_t k = 0; k < kCount; ++k) {
    kit::Batch b = workers.get(k);
    EXPECT_EQ(b.input.item<int64_t>(), static_cast<int64_t>(k)) << "batch " << k;
    EXPECT_EQ(b.target.item<int64_t>(), -static_cast<int64_t>(k)) << "batch " << k;
    workers.done(k);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The GPU presets (--preset gpu): the sizes their comments state (kit/train/args.cpp,
// image_args.cpp), counted from the models themselves, and flags given with a preset win.
// ---------------------------------------------------------------------------------------------

namespace {

// argv for a parser, from words (the strings outlive the call).
struct Argv {
  std::vector<std::string> words;
  std::vector<char*> ptrs;
  explicit Argv(std::vector<std::string> w) : words(std::move(w)) {
    for (auto& s : words) ptrs.push_back(s.data());
  }
  int argc() { return static_cast<int>(ptrs.size()); }
  char** argv() { return ptrs.data(); }
};

std::string preset_out_dir() {
  return (std::filesystem::temp_directory_path() / ("kit-presets-" + std::to_string(getpid()))).string();
}

int64_t numel(const std::vector<torch::Tensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.numel();
  return n;
}

// Multiply-adds of one 32x32 image's forward through the ResNet, layer by layer: a convolution
// does k x k x in x out of them per output pixel, the head one per weight. The modules come in
// registration order; a 3x3 convolution of stride 2 (a stage's first block) halves the image,
// and its block's 1x1 shortcut works at the halved size too.
double forward_macs(torch::nn::Module& model) {
  double macs = 0;
  int64_t side = 32;
  for (const auto& m : model.modules(/*include_self=*/false)) {
    if (auto* c = m->as<torch::nn::Conv2d>()) {
      const auto w = c->weight.sizes();  // [out, in, k, k]
      if (w[2] == 3 && (*c->options.stride())[0] == 2) side /= 2;
      macs += static_cast<double>(w[0] * w[1] * w[2] * w[3] * side * side);
    } else if (auto* l = m->as<torch::nn::Linear>()) {
      macs += static_cast<double>(l->weight.numel());
    }
  }
  EXPECT_EQ(side, 8);  // the three stages: 32, 16, 8
  return macs;
}

}  // namespace

TEST(Presets, LmGpuSizes) {
  Argv a({"ex01", "--preset", "gpu", "--data-dir", "/nonexistent", "--out-dir", preset_out_dir()});
  const kit::TrainArgs args = kit::parse_args(a.argc(), a.argv());
  EXPECT_EQ(args.d_model, 512);
  EXPECT_EQ(args.layers, 6);
  EXPECT_EQ(args.batch_size, 64);
  EXPECT_EQ(args.seq_len, 256);
  // WikiText-2's vocabulary: 33,278 words.
  kit::TransformerLM model(kit::lm_options(args, 33278));
  const double params = static_cast<double>(numel(model->parameters()));
  EXPECT_NEAR(params / 1e6, 53.0, 0.05);
  // Weights of matrix products: every 2-D parameter but the embedding (a lookup).
  double matmul = 0;
  for (const auto& p : model->named_parameters())
    if (p.value().dim() == 2 && p.key().rfind("embed", 0) != 0) matmul += static_cast<double>(p.value().numel());
  EXPECT_NEAR(matmul / 1e6, 35.9, 0.05);
  // 6 FLOPs per matmul weight and token, plus the attention's 3 x 4 x seq x width per layer.
  const double per_token = 6 * matmul + 3.0 * 4 * args.seq_len * args.d_model * args.layers;
  EXPECT_NEAR(per_token / 1e6, 225, 0.5);
  const double per_step = per_token * static_cast<double>(args.batch_size * args.seq_len);
  EXPECT_NEAR(per_step / 1e12, 3.7, 0.05);
  EXPECT_NEAR(4 * params / 1e6, 212, 0.5);  // fp32 gradient bytes all-reduced per step (MB)
  // The defaults, for comparison: 28 GFLOP per step, 35 MB all-reduced.
  Argv d({"ex01", "--data-dir", "/nonexistent", "--out-dir", preset_out_dir()});
  const kit::TrainArgs defaults = kit::parse_args(d.argc(), d.argv());
  kit::TransformerLM small(kit::lm_options(defaults, 33278));
  double small_matmul = 0;
  for (const auto& p : small->named_parameters())
    if (p.value().dim() == 2 && p.key().rfind("embed", 0) != 0) small_matmul += static_cast<double>(p.value().numel());
  const double small_token = 6 * small_matmul + 3.0 * 4 * defaults.seq_len * defaults.d_model * defaults.layers;
  EXPECT_NEAR(small_token * static_cast<double>(defaults.batch_size * defaults.seq_len) / 1e9, 28, 0.5);
  EXPECT_NEAR(4 * static_cast<double>(numel(small->parameters())) / 1e6, 35, 0.5);
  std::filesystem::remove_all(preset_out_dir());
}

TEST(Presets, ImageGpuSizes) {
  Argv a({"ex02", "--preset=gpu", "--data-dir", "/nonexistent", "--out-dir", preset_out_dir()});
  const kit::ImageTrainArgs args = kit::parse_image_args(a.argc(), a.argv());
  EXPECT_EQ(args.width, 128);
  EXPECT_EQ(args.blocks, 2);
  EXPECT_EQ(args.batch_size, 512);
  EXPECT_EQ(args.workers, 4);
  kit::ResNet model(kit::ResNetOptions{.width = args.width, .blocks = args.blocks});
  const double params = static_cast<double>(numel(model->parameters()));
  EXPECT_NEAR(params / 1e6, 11.1, 0.05);
  const double macs = forward_macs(*model);
  EXPECT_NEAR(macs / 1e9, 1.68, 0.005);
  const double per_step = 2 * 3 * macs * static_cast<double>(args.batch_size);
  EXPECT_NEAR(per_step / 1e12, 5.2, 0.05);
  EXPECT_NEAR(4 * params / 1e6, 44.4, 0.05);
  // The defaults, for comparison: 0.6 GFLOP per step, 80 kB all-reduced.
  Argv d({"ex02", "--data-dir", "/nonexistent", "--out-dir", preset_out_dir()});
  const kit::ImageTrainArgs defaults = kit::parse_image_args(d.argc(), d.argv());
  kit::ResNet small(kit::ResNetOptions{.width = defaults.width, .blocks = defaults.blocks});
  EXPECT_NEAR(6 * forward_macs(*small) * static_cast<double>(defaults.batch_size) / 1e9, 0.6, 0.05);
  EXPECT_NEAR(4 * static_cast<double>(numel(small->parameters())) / 1e3, 80, 2);
  std::filesystem::remove_all(preset_out_dir());
}

TEST(Presets, FlagsGivenWithAPresetWinWhereverTheyStand) {
  for (auto words : {std::vector<std::string>{"ex01", "--preset", "gpu", "--batch-size", "8"},
                     std::vector<std::string>{"ex01", "--batch-size", "8", "--preset", "gpu"}}) {
    words.insert(words.end(), {"--data-dir", "/nonexistent", "--out-dir", preset_out_dir()});
    Argv a(words);
    const kit::TrainArgs args = kit::parse_args(a.argc(), a.argv());
    EXPECT_EQ(args.batch_size, 8);
    EXPECT_EQ(args.d_model, 512);  // the rest is the preset's
  }
  std::filesystem::remove_all(preset_out_dir());
}

TEST(Presets, AnUnknownPresetIsOneLineAndExitTwo) {
  Argv a({"ex01", "--preset", "tpu", "--data-dir", "/nonexistent"});
  EXPECT_EXIT(kit::parse_args(a.argc(), a.argv()), ::testing::ExitedWithCode(2),
              "--preset tpu is not a preset \\(known: gpu\\)");
}
