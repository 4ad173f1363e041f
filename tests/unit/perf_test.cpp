// Exercise 06's library on a CPU (kit/perf/, kit/data/device_batches.h, the loader's workers,
// kit/models/weather_vit.h): the gradient scaler with an injected infinite gradient, the fused
// AdamW step against torch::optim::AdamW, autocast's dtypes and its refusals, TF32's setting,
// the profiler's trace and an unwritable folder, two workers reading at once, the next batch
// fetched ahead. `ctest -L unit -R 'GradScaler|FusedAdamW|Autocast|Tf32|StepProfiler|...'`.
#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "kit/data/data_loader.h"
#include "kit/data/device_batches.h"
#include "kit/data/era5.h"
#include "kit/models/weather_vit.h"
#include "kit/perf/amp.h"
#include "kit/perf/fused_adamw.h"
#include "kit/perf/grad_scaler.h"
#include "kit/perf/profiler.h"

namespace fs = std::filesystem;

namespace {

// A tiny model with two parameters and a loss whose gradients are known: loss = sum(w * x) + b.
struct Tiny {
  torch::Tensor w = torch::tensor({1.0f, -2.0f, 3.0f}).requires_grad_();
  torch::Tensor b = torch::tensor({0.5f}).requires_grad_();
  torch::Tensor loss() const { return (w * torch::tensor({1.0f, 2.0f, 4.0f})).sum() + b.sum(); }
};

// What a function printed on stderr.
template <typename F>
std::string stderr_of(F&& f) {
  testing::internal::CaptureStderr();
  f();
  return testing::internal::GetCapturedStderr();
}

}  // namespace

// --- the gradient scaler -------------------------------------------------------------------

TEST(GradScaler, ScalesTheLossAndUnscalesTheGradientsBackExactly) {
  Tiny m;
  torch::optim::SGD sgd({m.w, m.b}, torch::optim::SGDOptions(0.1));
  kit::GradScaler scaler;  // S = 65536
  auto scaled = scaler.scale(m.loss());
  EXPECT_FLOAT_EQ(scaled.item<float>(), 65536.0f * m.loss().item<float>());
  scaled.backward();
  EXPECT_TRUE(torch::equal(m.w.grad(), 65536.0f * torch::tensor({1.0f, 2.0f, 4.0f})));
  scaler.unscale(sgd);  // before clipping: the true gradients
  EXPECT_TRUE(torch::equal(m.w.grad(), torch::tensor({1.0f, 2.0f, 4.0f})));
  EXPECT_TRUE(torch::equal(m.b.grad(), torch::tensor({1.0f})));
  EXPECT_TRUE(scaler.step(sgd));  // finite: stepped
  EXPECT_TRUE(torch::allclose(m.w, torch::tensor({0.9f, -2.2f, 2.6f})));
  scaler.update();
  EXPECT_EQ(scaler.scale_value(), 65536.0);  // one good step of 2000: no growth yet
}

TEST(GradScaler, SkipsAStepWithAnInfiniteGradientAndHalvesTheScale) {
  Tiny m;
  torch::optim::SGD sgd({m.w, m.b}, torch::optim::SGDOptions(0.1));
  kit::GradScaler scaler;
  scaler.scale(m.loss()).backward();
  {
    torch::NoGradGuard no_grad;
    m.w.grad()[1] = std::numeric_limits<float>::infinity();  // an fp16 overflow, injected
  }
  const auto w = m.w.detach().clone(), b = m.b.detach().clone();
  EXPECT_FALSE(scaler.step(sgd));  // skipped: the weights are untouched
  EXPECT_TRUE(torch::equal(m.w, w));
  EXPECT_TRUE(torch::equal(m.b, b));
  scaler.update();
  EXPECT_EQ(scaler.scale_value(), 32768.0);  // backoff_factor 0.5
  // NaN too.
  sgd.zero_grad();
  scaler.scale(m.loss()).backward();
  {
    torch::NoGradGuard no_grad;
    m.b.grad()[0] = std::nan("");
  }
  EXPECT_FALSE(scaler.step(sgd));
  scaler.update();
  EXPECT_EQ(scaler.scale_value(), 16384.0);
  EXPECT_TRUE(torch::equal(m.w, w));
}

TEST(GradScaler, GrowsTheScaleAfterGrowthIntervalFiniteSteps) {
  Tiny m;
  torch::optim::SGD sgd({m.w, m.b}, torch::optim::SGDOptions(0.0));
  kit::GradScaler scaler({.init_scale = 1024.0, .growth_interval = 3});
  std::vector<double> scales;
  for (int k = 0; k < 7; ++k) {
    sgd.zero_grad();
    scaler.scale(m.loss()).backward();
    EXPECT_TRUE(scaler.step(sgd));
    scaler.update();
    scales.push_back(scaler.scale_value());
  }
  // torch.amp.GradScaler: x growth_factor after every growth_interval finite steps in a row.
  EXPECT_EQ(scales, (std::vector<double>{1024, 1024, 2048, 2048, 2048, 4096, 4096}));
}

TEST(GradScaler, RefusesASecondUnscaleAndPassesThroughWhenDisabled) {
  Tiny m;
  torch::optim::SGD sgd({m.w, m.b}, torch::optim::SGDOptions(0.1));
  kit::GradScaler scaler;
  scaler.scale(m.loss()).backward();
  scaler.unscale(sgd);
  EXPECT_THROW(scaler.unscale(sgd), std::logic_error);  // PyTorch's RuntimeError too

  Tiny n;
  torch::optim::SGD plain({n.w, n.b}, torch::optim::SGDOptions(0.1));
  kit::GradScaler off({.enabled = false});
  auto loss = n.loss();
  EXPECT_TRUE(off.scale(loss).is_same(loss));
  off.scale(loss).backward();
  EXPECT_TRUE(off.step(plain));
  off.update();
  EXPECT_TRUE(torch::allclose(n.w, torch::tensor({0.9f, -2.2f, 2.6f})));
}

// --- the fused AdamW step ---------------------------------------------------------------------

namespace {

// The same random gradients for twenty steps on two copies of the same weights, kit::FusedAdamW
// with `fused` and torch::optim::AdamW with `plain`; the largest relative difference of the
// weights at the end.
double fused_against_torch(torch::optim::AdamWOptions fused, torch::optim::AdamWOptions plain) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> mine = {torch::randn({17, 5}), torch::randn({5}), torch::randn({3, 3, 2})};
  std::vector<torch::Tensor> theirs;
  for (auto& p : mine) {
    theirs.push_back(p.clone().requires_grad_());
    p.requires_grad_();
  }
  kit::FusedAdamW a(mine, fused);
  torch::optim::AdamW b(theirs, plain);
  for (int step = 0; step < 20; ++step) {
    for (size_t i = 0; i < mine.size(); ++i) {
      auto g = torch::randn(mine[i].sizes());
      mine[i].mutable_grad() = g.clone();
      theirs[i].mutable_grad() = g.clone();
    }
    a.step();
    b.step();
  }
  double worst = 0;
  for (size_t i = 0; i < mine.size(); ++i)
    worst = std::max(worst, ((mine[i] - theirs[i]).abs() / theirs[i].abs().clamp_min(1e-3))
                                .max().item<double>());
  return worst;
}

}  // namespace

TEST(FusedAdamW, MatchesTorchAdamW) {
  // One fused expression against ten operations: the same update to rounding (measured: 6.9e-7 and 6.8e-7 with amsgrad, torch 2.13 on this CPU).
  const auto options = torch::optim::AdamWOptions(0.01).weight_decay(0.1);
  const auto amsgrad = torch::optim::AdamWOptions(0.01).weight_decay(0.1).amsgrad(true).betas({0.8, 0.99});
  const double same = fused_against_torch(options, options);
  const double same_amsgrad = fused_against_torch(amsgrad, amsgrad);
  std::printf("FusedAdamW against torch::optim::AdamW after 20 steps: %.2g, with amsgrad %.2g\n",
              same, same_amsgrad);
  EXPECT_LT(same, 1e-5);
  EXPECT_LT(same_amsgrad, 1e-5);
  // And the comparison bites: another weight decay, or plain Adam's moments, are far outside it.
  EXPECT_GT(fused_against_torch(options, torch::optim::AdamWOptions(0.01).weight_decay(0.0)), 1e-4);
  EXPECT_GT(fused_against_torch(options, amsgrad), 1e-4);
}

TEST(FusedAdamW, LeavesParametersWithoutGradientAlone) {
  auto used = torch::ones({4}).requires_grad_(), unused = torch::ones({4}).requires_grad_();
  kit::FusedAdamW opt({used, unused}, torch::optim::AdamWOptions(0.1));
  used.mutable_grad() = torch::ones({4});
  opt.step();
  EXPECT_TRUE(torch::equal(unused, torch::ones({4})));
  EXPECT_FALSE(torch::equal(used, torch::ones({4})));
}

// --- autocast and TF32 -----------------------------------------------------------------------

TEST(Autocast, RunsLinearLayersInBf16OnTheCpuAndRestoresTheStateAfter) {
  torch::nn::Linear layer(8, 4);
  auto x = torch::randn({2, 8});
  EXPECT_EQ(layer->forward(x).scalar_type(), torch::kFloat);
  {
    kit::Autocast amp(torch::Device(torch::kCPU), kit::Precision::bf16);
    EXPECT_EQ(layer->forward(x).scalar_type(), torch::kBFloat16);
    {
      kit::Autocast inner(torch::Device(torch::kCPU), kit::Precision::fp32);  // changes nothing
      EXPECT_EQ(layer->forward(x).scalar_type(), torch::kBFloat16);
    }
    // Losses in float32, as PyTorch's autocast lists them.
    EXPECT_EQ(torch::mse_loss(layer->forward(x), torch::zeros({2, 4})).scalar_type(), torch::kFloat);
  }
  EXPECT_EQ(layer->forward(x).scalar_type(), torch::kFloat);
  EXPECT_EQ(layer->weight.scalar_type(), torch::kFloat);  // the weights stay fp32
}

TEST(Autocast, RefusesWhatTheDeviceLacksWithOneLineSayingWhatToUse) {
  const auto cpu = torch::Device(torch::kCPU), gpu = torch::Device(torch::kCUDA, 0);
  const std::string fp16_cpu = kit::precision_unsupported(kit::Precision::fp16, cpu);
  EXPECT_NE(fp16_cpu.find("use --amp bf16"), std::string::npos) << fp16_cpu;
  const std::string bf16_v100 = kit::precision_unsupported(kit::Precision::bf16, gpu, 70);
  EXPECT_NE(bf16_v100.find("7.0"), std::string::npos) << bf16_v100;
  EXPECT_NE(bf16_v100.find("use --amp fp16"), std::string::npos) << bf16_v100;
  EXPECT_EQ(kit::precision_unsupported(kit::Precision::bf16, gpu, 80), "");
  EXPECT_EQ(kit::precision_unsupported(kit::Precision::fp16, gpu, 70), "");
  EXPECT_EQ(kit::precision_unsupported(kit::Precision::bf16, cpu), "");
  for (const std::string& line : {fp16_cpu, bf16_v100}) EXPECT_EQ(line.find('\n'), std::string::npos);
  try {
    kit::Autocast amp(cpu, kit::Precision::fp16);
    FAIL() << "fp16 autocast on a CPU was not refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("(perf_test.cpp:"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kit::parse_precision("fp8"), std::invalid_argument);
}

TEST(Tf32, SetsAtensFloat32MatmulPrecisionAndSaysACpuHasNone) {
  const auto cpu = torch::Device(torch::kCPU);
  std::string said = stderr_of([&] { kit::set_tf32(true, cpu); });
  EXPECT_EQ(at::globalContext().float32MatmulPrecision(), at::Float32MatmulPrecision::HIGH);
  EXPECT_NE(said.find("--tf32 on a CPU"), std::string::npos) << said;
  EXPECT_EQ(std::count(said.begin(), said.end(), '\n'), 1) << said;
  said = stderr_of([&] { kit::set_tf32(false, cpu); });
  EXPECT_EQ(at::globalContext().float32MatmulPrecision(), at::Float32MatmulPrecision::HIGHEST);
  EXPECT_EQ(said, "");
}

// --- the profiler ----------------------------------------------------------------------------

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Six "training steps" of a small matmul, with the profiler's step() after each.
void six_steps(kit::StepProfiler& profiler) {
  auto a = torch::randn({32, 32});
  for (int k = 0; k < 6; ++k) {
    auto b = torch::mm(a, a).relu();
    profiler.step();
  }
}

}  // namespace

TEST(StepProfiler, WritesAChromeTraceOfTheStepsAskedForAndPrintsTheTopOperators) {
  const fs::path dir = fs::temp_directory_path() / ("kit-profile-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  testing::internal::CaptureStdout();
  {
    kit::StepProfiler profiler({.dir = dir.string(), .start = 2, .steps = 3},
                               torch::Device(torch::kCPU));
    EXPECT_EQ(profiler.trace_path(), (dir / "trace.json").string());
    six_steps(profiler);
    EXPECT_FALSE(profiler.recording());  // closed after step 4
  }
  const std::string out = testing::internal::GetCapturedStdout();
  const std::string trace = read_file(dir / "trace.json");
  EXPECT_NE(trace.find("\"traceEvents\""), std::string::npos);
  for (int k : {2, 3, 4}) EXPECT_NE(trace.find("ProfilerStep#" + std::to_string(k)), std::string::npos) << k;
  for (int k : {1, 5, 6}) EXPECT_EQ(trace.find("ProfilerStep#" + std::to_string(k) + "\""), std::string::npos) << k;
  EXPECT_NE(trace.find("aten::mm"), std::string::npos);
  EXPECT_NE(out.find("profile of steps 2-4 written to"), std::string::npos) << out;
  EXPECT_NE(out.find("top operators by self time"), std::string::npos) << out;
  EXPECT_NE(out.find("aten::mm"), std::string::npos) << out;
  fs::remove_all(dir);
}

TEST(StepProfiler, AFolderThatCannotBeWrittenIsOneLineAndTrainingGoesOn) {
  // A folder below a regular file can never be made, root or not.
  const fs::path file = fs::temp_directory_path() / ("kit-profile-file-" + std::to_string(::getpid()));
  std::ofstream(file) << "x";
  std::string said = stderr_of([&] {
    kit::StepProfiler profiler({.dir = (file / "profile").string(), .start = 1, .steps = 2},
                               torch::Device(torch::kCPU));
    EXPECT_EQ(profiler.trace_path(), "");
    six_steps(profiler);  // training goes on
    EXPECT_FALSE(profiler.recording());
  });
  EXPECT_NE(said.find("cannot be written"), std::string::npos) << said;
  EXPECT_NE(said.find("training goes on without a profile"), std::string::npos) << said;
  EXPECT_EQ(std::count(said.begin(), said.end(), '\n'), 1) << said;
  fs::remove(file);
}

// --- the loader's workers and the batches on their way -----------------------------------------

namespace {

// A dataset whose every sample takes 20 ms to read, and which notes which loader thread read it
// and when.
struct SlowDataset {
  struct Read {
    size_t index;
    int worker;
    std::chrono::steady_clock::time_point start, end;
  };
  mutable std::mutex lock;
  mutable std::vector<Read> reads;
  size_t size() const { return 16; }
  std::string name() const { return "slow"; }
  std::pair<torch::Tensor, torch::Tensor> get(size_t i) const {
    const auto start = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::lock_guard<std::mutex> guard(lock);
    reads.push_back({i, kit::loader_worker(), start, std::chrono::steady_clock::now()});
    return {torch::full({2}, static_cast<float>(i)), torch::full({}, static_cast<float>(i))};
  }
};

}  // namespace

TEST(LoaderWorkersParallel, TwoWorkersReadAtTheSameTimeNeverOnTheTrainingThread) {
  SlowDataset data;
  kit::DataLoader<SlowDataset> loader(data, 2, kit::LoaderOptions{.workers = 2});
  size_t batches = 0;
  for (kit::Batch b : loader) ++batches;
  EXPECT_EQ(batches, 8u);
  std::set<int> workers;
  bool overlapped = false;
  for (const auto& r : data.reads) {
    workers.insert(r.worker);
    for (const auto& s : data.reads)
      overlapped |= r.worker != s.worker && s.start < r.end && r.start < s.end;
  }
  EXPECT_EQ(workers, (std::set<int>{1, 2}));  // both threads, and never the training thread (0)
  EXPECT_TRUE(overlapped);  // 20 ms reads: the two threads were reading at once
  EXPECT_EQ(kit::loader_worker(), 0);
}

TEST(DeviceBatches, FetchesTheNextBatchBeforeHandingOutTheCurrentOne) {
  SlowDataset data;
  kit::DataLoader<SlowDataset> loader(data, 4);  // no workers: every read is on this thread
  size_t k = 0;
  for (kit::Batch b : kit::DeviceBatches(loader, torch::Device(torch::kCPU))) {
    // Batch k is handed out after batch k + 1 was read (while k computes, k + 1 travels).
    const size_t read = data.reads.size() / 4;
    EXPECT_EQ(read, std::min<size_t>(k + 2, 4)) << "batch " << k;
    EXPECT_EQ(b.input[0][0].item<float>(), static_cast<float>(4 * k));  // in order, each once
    ++k;
  }
  EXPECT_EQ(k, 4u);
}

TEST(DeviceBatches, PinnedMemoryChangesNothingWithoutCuda) {
  SlowDataset data;
  kit::DataLoader<SlowDataset> pinned(data, 4, kit::LoaderOptions{.pin_memory = true});
  kit::DataLoader<SlowDataset> plain(data, 4);
  auto a = (*pinned.begin()).input, b = (*plain.begin()).input;
  EXPECT_TRUE(torch::equal(a, b));
  if (!torch::cuda::is_available()) {
    EXPECT_FALSE(a.is_pinned());
  }
}

// --- the model and the metric -----------------------------------------------------------------

TEST(WeatherViT, MapsFieldsToFieldsOfTheSameShape) {
  torch::manual_seed(0);
  kit::WeatherViT model(kit::WeatherViTOptions{.channels = 3, .lat = 8, .lon = 16, .patch = 4,
                                               .embed = 16, .depth = 2, .heads = 2});
  auto x = torch::randn({2, 3, 8, 16});
  EXPECT_EQ(model->forward(x).sizes(), x.sizes());
  // The grid must be whole patches, and the heads must divide the embedding: one line each.
  EXPECT_THROW(kit::WeatherViT(kit::WeatherViTOptions{.lat = 10, .lon = 16, .patch = 4}),
               std::invalid_argument);
  EXPECT_THROW(kit::WeatherViT(kit::WeatherViTOptions{.lat = 8, .lon = 16, .patch = 4,
                                                      .embed = 10, .heads = 4}),
               std::invalid_argument);
}

TEST(WeatherViT, HasNerscsParameterCountAtNerscsShape) {
  // 20 channels on 360 x 720, patch 8, embed 384, depth 12, 8 heads, MLP x4: the patch
  // embedding 20*8*8*384 + 384, the position embedding 45*90*384, per block 2 layer norms
  // (4*384), qkv 384*1152 + 1152, proj 384*384 + 384, fc1 384*1536 + 1536, fc2 1536*384 + 384,
  // the final norm 2*384, the head 384*20*64 (no bias).
  const int64_t e = 384, block = 4 * e + (e * 3 * e + 3 * e) + (e * e + e) + (e * 4 * e + 4 * e) +
                                 (4 * e * e + e);
  const int64_t expected = (20 * 64 * e + e) + 45 * 90 * e + 12 * block + 2 * e + e * 20 * 64;
  kit::WeatherViT model{kit::WeatherViTOptions{}};
  int64_t n = 0;
  for (const auto& p : model->parameters()) n += p.numel();
  EXPECT_EQ(n, expected);
}

TEST(Era5Metric, LatitudeWeightsAndTheWeightedRmse) {
  // 3 rows: latitudes 90, 0, -90; cos = 0, 1, 0; mean 1/3: weights 0, 3, 0.
  auto w = kit::latitude_weights(3);
  EXPECT_TRUE(torch::allclose(w.flatten(), torch::tensor({0.0f, 3.0f, 0.0f}), 1e-6, 1e-6));
  // An error of 2 on the equator row only, of 2 columns: weighted mean of squares = 3*4*2/6 = 4.
  auto target = torch::zeros({1, 2, 3, 2});
  auto prediction = target.clone();
  prediction[0][0][1] = 2.0f;
  prediction[0][1][0] = 7.0f;  // channel 1, at the pole: not u10, and weightless anyway
  auto rmse = kit::weighted_rmse(prediction, target, 0);
  EXPECT_NEAR(rmse.item<double>(), 2.0, 1e-12);
}
