// kit/train/weather_args.cpp — exercise 06's flags (see weather_args.h).
#include "kit/train/weather_args.h"

#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "kit/train/args.h"  // parse_flags(), flag_int(), flag_real(), flag_error()
#include "kit/train/default_dirs.h"  // the build's weather fields, when no folder is given

namespace kit {

WeatherArgs parse_weather_args(int argc, char** argv) {
  WeatherArgs a;
  if (const char* d = std::getenv("KIT_DATA_DIR"); d && *d) a.data_dir = d;
  else if (const char* b = default_weather_dir()) a.data_dir = b;
  auto whole = [](const char* flag, int64_t lo, int64_t& into) {
    return [flag, lo, &into](const std::string& v) { into = flag_int(flag, v, lo); };
  };
  auto text = [](std::string& into) { return [&into](const std::string& v) { into = v; }; };
  parse_flags(argc, argv, {
      {"--data-dir", "folder with train/, valid/ and stats/ (NERSC's ERA5 layout)", text(a.data_dir)},
      {"--out-dir", "where model-final.pt and metrics.csv are written", text(a.out_dir)},
      {"--epochs", "passes over the training samples", whole("--epochs", 1, a.epochs)},
      {"--max-steps", "stop each epoch after this many steps (0: no limit)", whole("--max-steps", 0, a.max_steps)},
      {"--batch-size", "samples per step", whole("--batch-size", 1, a.batch_size)},
      {"--lr", "AdamW's learning rate", [&](auto v) { a.lr = flag_real("--lr", v, 0, 10); }},
      {"--weight-decay", "AdamW's decoupled weight decay", [&](auto v) { a.weight_decay = flag_real("--weight-decay", v, 0, 10); }},
      {"--clip-grad", "clip the gradients' global norm to this (0: off)", [&](auto v) { a.clip_grad = flag_real("--clip-grad", v, 0, 1e9); }},
      {"--seed", "random seed", [&](auto v) { a.seed = static_cast<uint64_t>(flag_int("--seed", v, 0)); }},
      {"--train-samples", "use the first N training samples (-1: all)", whole("--train-samples", -1, a.train_samples)},
      {"--valid-samples", "use the first N validation samples (-1: all)", whole("--valid-samples", -1, a.valid_samples)},
      {"--lat", "rows of each field to use, from the north (0: all)", whole("--lat", 0, a.lat)},
      {"--lon", "columns of each field to use, from the west (0: all)", whole("--lon", 0, a.lon)},
      {"--patch-size", "the ViT's patch side (must divide lat and lon)", whole("--patch-size", 1, a.patch_size)},
      {"--embed-dim", "the ViT's embedding width", whole("--embed-dim", 1, a.embed_dim)},
      {"--depth", "Transformer blocks", whole("--depth", 1, a.depth)},
      {"--heads", "attention heads (must divide --embed-dim)", whole("--heads", 1, a.heads)},
      {"--workers", "TODO 1: loader threads that prepare the next batches (0: none)", whole("--workers", 0, a.workers)},
      {"--amp", "TODO 2: mixed precision: none, bf16 or fp16 (GPUs only)", [&](const std::string& v) {
         try { a.amp = parse_precision(v); } catch (const std::invalid_argument& e) { flag_error(std::string("--amp: ") + e.what()); }
       }},
      {"--tf32", "TODO 3: TF32 matmuls (NVIDIA GPUs from Ampere on)", [&](auto) { a.tf32 = true; }, true},
      {"--fused-adamw", "TODO 4: AdamW's step as one fused kernel", [&](auto) { a.fused_adamw = true; }, true},
      {"--profile-dir", "TODO 5: write a Kineto profile of a few steps here", text(a.profile_dir)},
      {"--profile-start", "the first step profiled", whole("--profile-start", 1, a.profile_start)},
      {"--profile-steps", "how many steps are profiled", whole("--profile-steps", 1, a.profile_steps)},
  });
  if (a.data_dir.empty()) flag_error("no data folder: pass --data-dir or set KIT_DATA_DIR");
  std::error_code ec;
  std::filesystem::create_directories(a.out_dir, ec);
  if (ec) flag_error("--out-dir " + a.out_dir + " cannot be created: " + ec.message());
  return a;
}

}  // namespace kit
