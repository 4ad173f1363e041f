// kit/train/image_args.cpp — exercise 02's flags (see image_args.h).
#include "kit/train/image_args.h"

#include <cstdlib>
#include <filesystem>
#include <limits>
#include <stdexcept>

#include "kit/train/args.h"  // parse_flags(), flag_int(), flag_real(), flag_error()
#include "kit/train/default_dirs.h"  // the build's image set, when no folder is given

namespace kit {

int64_t ImageTrainArgs::batch_per_rank(int world_size) const {
  if (global_batch <= 0) return batch_size;
  if (global_batch % world_size != 0)
    flag_error("--global-batch " + std::to_string(global_batch) + " does not split evenly over " +
               std::to_string(world_size) + " ranks");
  const int64_t b = global_batch / world_size;
  if (b % accum_steps != 0)
    flag_error("--accum-steps " + std::to_string(accum_steps) + " does not divide the batch of " +
               std::to_string(b) + " images per rank");
  return b;
}

// The preset "gpu" of exercise 02: the ResNet at width 128 with 2 blocks per stage, 512 images
// per rank and step. Sized by what a step computes against what its all-reduce moves:
//   * parameters: 11.1 M (counted from the model by unit.Presets.ImageGpuSizes): the all-reduce
//     moves 44 MB of fp32 gradients, and a ring all-reduce sends 2(N-1)/N of that from each GPU,
//     78 MB on 8 GPUs: 3.1 ms at 25 GB/s per GPU (an InfiniBand HDR200 link per GPU, as on
//     JUWELS Booster);
//   * FLOPs: the convolutions' multiply-adds, 1.68 G per 32x32 image forward (counted layer by
//     layer by the same test), x 2 FLOPs x 3 for forward and backward: 10.1 GFLOP per image,
//     5.2 TFLOP per rank and step;
//   * so a step takes at least 33 ms on an A100 (156 TFLOP/s: cuDNN's convolutions run in TF32 by
//     default) and 10 ms on an H100 SXM (495 TFLOP/s dense TF32): 11x (A100) or 3x (H100) the
//     all-reduce, both at peak rates. At the defaults (width 8, 1 block, 32 images) a step is
//     0.6 GFLOP, 4 us at that peak, and the all-reduce 80 kB: latencies decide both.
// The batch norm statistics and the loader (4 worker threads) stay on the CPU side of a step.
const std::vector<Preset>& image_presets() {
  static const std::vector<Preset> presets = {
      {"gpu",
       "a step long enough on an A100 or H100 to show scaling: --width 128 --blocks 2 "
       "--batch-size 512 --eval-batch-size 500 --workers 4 (11.1 M parameters)",
       {"--width", "128", "--blocks", "2", "--batch-size", "512", "--eval-batch-size", "500",
        "--workers", "4"}},
  };
  return presets;
}

ImageTrainArgs parse_image_args(int argc, char** argv) {
  std::vector<std::string> words = with_preset(argc, argv, image_presets());
  std::vector<char*> args;
  for (std::string& w : words) args.push_back(w.data());
  argc = static_cast<int>(args.size());
  argv = args.data();
  ImageTrainArgs a;
  if (const char* d = std::getenv("KIT_DATA_DIR"); d && *d) a.data_dir = d;
  else if (const char* b = default_image_dir()) a.data_dir = b;
  auto whole = [](const char* flag, int64_t lo, int64_t& into) {
    return [flag, lo, &into](const std::string& v) { into = flag_int(flag, v, lo); };
  };
  auto text = [](std::string& into) { return [&into](const std::string& v) { into = v; }; };
  parse_flags(argc, argv, {
      {"--data-dir", "folder with data_batch_1..5.bin and test_batch.bin", text(a.data_dir)},
      {"--out-dir", "where the models and metrics.csv are written", text(a.out_dir)},
      {"--epochs", "passes over the training set", whole("--epochs", 1, a.epochs)},
      {"--max-steps", "stop each epoch after this many steps (0: no limit)", whole("--max-steps", 0, a.max_steps)},
      {"--batch-size", "images per step and rank", whole("--batch-size", 1, a.batch_size)},
      {"--global-batch", "images per step over all ranks (strong scaling; 0: --batch-size per rank)", whole("--global-batch", 0, a.global_batch)},
      {"--accum-steps", "micro-batches per step (gradient accumulation)", whole("--accum-steps", 1, a.accum_steps)},
      {"--eval-batch-size", "images per evaluation batch", whole("--eval-batch-size", 1, a.eval_batch_size)},
      {"--lr", "learning rate for one process with --batch-size (or --global-batch)", [&](auto v) { a.lr = flag_real("--lr", v, 0, 10); }},
      {"--lr-scaling", "none | linear | sqrt: the rate for the global batch", [&](const std::string& v) {
         try { a.lr_scaling = parse_lr_scaling(v); } catch (const std::invalid_argument& e) { flag_error(std::string("--lr-scaling: ") + e.what()); }
       }},
      {"--warmup-steps", "climb to the rate linearly over this many steps", whole("--warmup-steps", 0, a.warmup_steps)},
      {"--workers", "loader threads that prepare the next batches (0: none)", [&](const std::string& v) {
         const int64_t n = flag_int("--workers", v, std::numeric_limits<int64_t>::min(), 1024);
         if (n < 0) flag_error("--workers must be 0 or more, got " + v);
         a.workers = static_cast<int>(n);
       }},
      {"--seed", "random seed", [&](auto v) { a.seed = static_cast<uint64_t>(flag_int("--seed", v, 0)); }},
      {"--width", "channels of the ResNet's first stage", whole("--width", 1, a.width)},
      {"--blocks", "residual blocks per stage", whole("--blocks", 1, a.blocks)},
      {"--train-images", "use the first N training images (-1: all)", whole("--train-images", -1, a.train_images)},
      {"--test-images", "use the first N test images (-1: all)", whole("--test-images", -1, a.test_images)},
      {"--augment", "random crops and flips of the training images", [&](auto) { a.augment = true; }, true},
      {"--target-acc", "the summary's time to this test accuracy (0: none)", [&](auto v) { a.target_acc = flag_real("--target-acc", v, 0, 1); }},
      {"--run-label", "the summary row's label", text(a.run_label)},
      {"--summary-csv", "rank 0 appends one row of figures to this file", text(a.summary_csv)},
      {"--preset", "gpu: " + image_presets()[0].help + "; flags given with it win", [](auto) {}},
  });
  if (a.data_dir.empty()) flag_error("no data folder: pass --data-dir or set KIT_DATA_DIR");
  if (a.global_batch == 0 && a.batch_size % a.accum_steps != 0)
    flag_error("--accum-steps " + std::to_string(a.accum_steps) + " does not divide --batch-size " +
               std::to_string(a.batch_size));
  std::error_code ec;
  std::filesystem::create_directories(a.out_dir, ec);
  if (ec) flag_error("--out-dir " + a.out_dir + " cannot be created: " + ec.message());
  return a;
}

}  // namespace kit
