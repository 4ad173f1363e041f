// Exercise 06 — one device fast before many: NERSC's weather ViT, tuned step by step.
//
// As shipped this is a complete single-device trainer, the first program of NERSC's "Deep
// Learning at Scale" course in C++: a Vision Transformer (kit/models/weather_vit.h) learns to
// predict the weather fields of the next time step from the current ones (ERA5's layout:
// kit/data/era5.h), and its figure of merit is the RMSE of u10, the 10 m wind, on the validation
// fields. Scaling a slow trainer out only multiplies its waste: first make one device fast. Each
// TODO is one optimisation, switched on by its own flag, so that what it brings can be measured
// on its own (`cmake --build build --target bench-weather` prints the table):
//   TODO 1  --workers N     loader threads, pinned memory, the next batch copied while computing
//   TODO 2  --amp bf16      mixed precision: autocast (and, with --amp fp16 on a GPU, the
//                           gradient scaler fp16 needs)
//   TODO 3  --tf32          TF32 matmuls on NVIDIA GPUs from Ampere on
//   TODO 4  --fused-adamw   AdamW's update as one fused kernel
//   TODO 5  --profile-dir D a Kineto profile of a few steps: a trace and the top operators
// Until its TODO is done, a flag stops the run with one line. `./kit check 06` judges each TODO
// by what the run does (kit/check/observe.h), against the solution's run with the same flags.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <tuple>
#include <utility>

#include <torch/torch.h>          // tensors, autograd, optimizers

#include "kit/data/data_loader.h"     // DataLoader, LoaderOptions: batches, worker threads, pinned memory
#include "kit/data/device_batches.h"  // DeviceBatches: the next batch on its way to the device
#include "kit/data/era5.h"            // Era5Dataset, load_field_stats(), weighted_rmse(): the fields
#include "kit/models/weather_vit.h"   // WeatherViT: the model
#include "kit/perf/amp.h"             // Autocast, set_tf32(): mixed precision and TF32
#include "kit/perf/fused_adamw.h"     // FusedAdamW: AdamW's step in one kernel
#include "kit/perf/grad_scaler.h"     // GradScaler: fp16's loss scaling
#include "kit/perf/profiler.h"        // StepProfiler: a Kineto profile of a few steps
#include "kit/train/memory.h"         // install(): count the bytes of live CPU tensors
#include "kit/train/metrics.h"        // Metrics, device_model(), peak_tensor_bytes()
#include "kit/train/summary.h"        // StepTimer: the median step time
#include "kit/train/weather_args.h"   // WeatherArgs, parse_weather_args(): the flags

using Loader = kit::DataLoader<kit::Era5Dataset>;

// A flag whose TODO is not done yet: one line, and no training.
void not_done(bool asked, const char* flag, int todo) {
  if (!asked) return;
  std::fprintf(stderr, "error: %s: TODO %d is not done yet\n", flag, todo);
  std::exit(2);
}

// The validation loss (mean squared error over every value) and u10's RMSE (latitude-weighted,
// per sample, then the mean over the samples), over the whole split. Channel 0 is u10.
std::pair<double, double> evaluate(kit::WeatherViT& model, const Loader& loader,
                                   torch::Device device, kit::Precision amp) {
  torch::NoGradGuard no_grad;
  model->eval();
  // TODO 2: The validation forward in the same precision as training's (--amp): it is as much faster.
  double squares = 0, values = 0, rmse = 0, samples = 0;
  for (kit::Batch b : loader) {
    auto input = b.input.to(device), target = b.target.to(device);
    auto prediction = model->forward(input).to(torch::kFloat);
    squares += torch::mse_loss(prediction, target, torch::Reduction::Sum).item<double>();
    values += static_cast<double>(target.numel());
    rmse += kit::weighted_rmse(prediction, target, /*channel=*/0).sum().item<double>();
    samples += static_cast<double>(target.size(0));
  }
  return {squares / values, rmse / samples};
}

int main(int argc, char** argv) {
  kit::WeatherArgs args = kit::parse_weather_args(argc, argv);
  torch::manual_seed(args.seed);
  const torch::Device device =
      torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  std::printf("training on %s (%s)\n", device.str().c_str(), kit::device_model(device).c_str());
  kit::memory::install();  // the peak of live CPU tensors (on a GPU, the allocator counts)

  // NERSC's layout (kit/data/era5.h): a file of another layout, or with NaN, is one line.
  const kit::FieldStats stats = kit::load_field_stats(args.data_dir);
  kit::Era5Dataset train_data(args.data_dir, "train", stats,
                              {.limit = args.train_samples, .lat = args.lat, .lon = args.lon});
  kit::Era5Dataset valid_data(args.data_dir, "valid", stats,
                              {.limit = args.valid_samples, .lat = args.lat, .lon = args.lon});
  // TODO 1: Data loading. Give both loaders args.workers threads (LoaderOptions .workers) that read
  //         and normalise the next batches while the model computes, in pinned host memory
  //         (.pin_memory: a GPU copies from it faster, and only from it can a copy overlap its work).
  //         Then, in the training loop (second place), take the batches through kit::DeviceBatches:
  //         the next batch is copied to the device, non_blocking and on a stream of its own, while
  //         the model computes the current one.
  const kit::LoaderOptions loading{};  // every batch made on the training thread, when asked for
  not_done(args.workers > 0, "--workers", 1);
  Loader train_loader(train_data, args.batch_size, /*shuffle=*/true, loading);
  Loader valid_loader(valid_data, args.batch_size, /*shuffle=*/false, loading);

  kit::WeatherViT model(kit::WeatherViTOptions{
      .channels = train_data.channels(), .lat = train_data.lat(), .lon = train_data.lon(),
      .patch = args.patch_size, .embed = args.embed_dim, .depth = args.depth, .heads = args.heads});
  model->to(device);
  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  std::printf("WeatherViT: %ld parameters; %ld channels on %ld x %ld, %ld training and %ld "
              "validation samples\n", static_cast<long>(parameters),
              static_cast<long>(train_data.channels()), static_cast<long>(train_data.lat()),
              static_cast<long>(train_data.lon()), static_cast<long>(train_data.size()),
              static_cast<long>(valid_data.size()));

  // TODO 3: TF32: with --tf32, fp32 matmuls run in the tensor cores of an Ampere or newer GPU with a
  //         10-bit mantissa, the data left in fp32 (PyTorch's default leaves it off for matmuls).
  //         One call to kit::set_tf32 with the flag's value (kit/perf/amp.h); on a CPU it says that
  //         it changes nothing there.
  not_done(args.tf32, "--tf32", 3);

  const auto adamw = torch::optim::AdamWOptions(args.lr).weight_decay(args.weight_decay);
  // TODO 4: The fused AdamW step: with --fused-adamw, a kit::FusedAdamW with the same options in place
  //         of torch::optim::AdamW (kit/perf/fused_adamw.h): one kernel per step for every parameter
  //         instead of about ten per parameter tensor, and the same update. Without the flag,
  //         torch::optim::AdamW as before: the code below needs a torch::optim::Optimizer& named
  //         optimizer.
  not_done(args.fused_adamw, "--fused-adamw", 4);
  torch::optim::AdamW optimizer(model->parameters(), adamw);

  // TODO 2: Mixed precision, --amp bf16 (or fp16 on a GPU). Three places: here, a kit::GradScaler
  //         (kit/perf/grad_scaler.h) that is enabled for fp16 only; in the step, the forward and the
  //         loss under a kit::Autocast(device, args.amp) scope that ends before backward, and the
  //         backward and update through the scaler (scale the loss, unscale before clipping, step,
  //         update); and the same autocast in evaluate(). A precision the device lacks (fp16 on a
  //         CPU) is Autocast's one-line error.
  not_done(args.amp != kit::Precision::fp32, "--amp", 2);

  // TODO 5: Profile: with --profile-dir, a kit::StepProfiler (kit/perf/profiler.h) over steps
  //         args.profile_start .. + args.profile_steps - 1, and (second place) its step() at the end
  //         of every training step. It writes a Chrome trace, DIR/trace.json, and prints the
  //         operators that took the time; a DIR it cannot write is one line, and training goes on.
  not_done(!args.profile_dir.empty(), "--profile-dir", 5);

  kit::Metrics metrics(args.out_dir, args.batch_size, device);
  kit::StepTimer timer;
  int64_t step = 0, peak_bytes = 0;
  double valid_loss = 0, rmse = 0;
  for (int64_t epoch = 0; epoch < args.epochs; ++epoch) {
    model->train();
    auto total = torch::zeros({}, torch::TensorOptions().device(device));  // the epoch's loss sum
    int64_t steps = 0;
    // TODO 1: The training batches through kit::DeviceBatches: already on the device, the next one
    //         on its way while this one computes.
    for (kit::Batch cpu : train_loader) {
      auto input = cpu.input.to(device), target = cpu.target.to(device);
      optimizer.zero_grad();
      torch::Tensor loss;
      {  // the forward pass and the loss
        // TODO 2: This scope under autocast in args.amp's precision.
        loss = torch::mse_loss(model->forward(input), target);
      }  // backward outside autocast: each operation's backward runs in its forward's dtype
      // TODO 2: Backward, clipping and the update through the scaler (a no-op but for fp16).
      loss.backward();
      if (args.clip_grad > 0) torch::nn::utils::clip_grad_norm_(model->parameters(), args.clip_grad);
      optimizer.step();
      // TODO 5: The profiler's step(), at the end of every training step.
      total += loss.detach();
      ++steps, ++step;
      metrics.step(epoch, loss.detach(), steps);
      timer.lap();
      if (steps == args.max_steps) break;
    }
    const double train_loss = (total / static_cast<double>(steps)).item<double>();
    peak_bytes = std::max(peak_bytes, kit::peak_tensor_bytes(device));  // before end_epoch resets it
    metrics.end_epoch(epoch);
    std::tie(valid_loss, rmse) = evaluate(model, valid_loader, device, args.amp);
    std::printf("[%ld/%ld] train loss %.5f, valid loss %.5f, u10 RMSE %.5f\n",
                static_cast<long>(epoch + 1), static_cast<long>(args.epochs), train_loss,
                valid_loss, rmse);
  }
  std::printf("final valid loss %.5f, u10 RMSE %.5f\n", valid_loss, rmse);
  const double step_s = timer.median_seconds(/*skip=*/2);
  std::printf("performance: %ld steps, median step %.2f ms, %.1f samples/s, peak memory %.1f MiB "
              "(%s)\n", static_cast<long>(step), step_s * 1e3,
              step_s > 0 ? static_cast<double>(args.batch_size) / step_s : 0.0,
              static_cast<double>(peak_bytes) / (1 << 20),
              device.is_cuda() ? "GPU allocator" : "live CPU tensors");
  torch::save(model, args.out_dir + "/model-final.pt");
  return 0;
}
