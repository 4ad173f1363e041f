// kit/train/weather_args.h — WeatherArgs and parse_weather_args(): the flags of exercise 06's
// trainer (the weather ViT on one device). The flag parser is kit/train/args.h's; the defaults are
// NERSC's single-GPU configuration (batch 16, lr 5e-4, the model's shape), the smaller shapes that
// suit a CPU are flags.
#pragma once

#include <cstdint>
#include <string>

#include "kit/perf/amp.h"  // Precision

namespace kit {

struct WeatherArgs {
  std::string data_dir;         // NERSC's layout: train/, valid/, stats/ (kit/data/era5.h)
  std::string out_dir = ".";    // model-final.pt, metrics.csv
  int64_t epochs = 1;
  int64_t max_steps = 0;        // > 0: stop each epoch after this many steps
  int64_t batch_size = 16;
  double lr = 5e-4;             // AdamW, constant
  double weight_decay = 0.01;   // AdamW's default
  double clip_grad = 0;         // > 0: clip the gradients' global norm to this (0: off)
  uint64_t seed = 42;
  int64_t train_samples = -1, valid_samples = -1;  // the first N of each split (-1: all)
  int64_t lat = 0, lon = 0;     // the top-left part of each field (0: the whole grid)
  // The model (kit/models/weather_vit.h): NERSC's shape by default.
  int64_t patch_size = 8, embed_dim = 384, depth = 12, heads = 8;
  // Exercise 06's optimisations, one flag each (its TODOs).
  int64_t workers = 0;          // loader threads (0: batches made on the training thread)
  Precision amp = Precision::fp32;
  bool tf32 = false;
  bool fused_adamw = false;
  std::string profile_dir;      // "": no profile
  int64_t profile_start = 3, profile_steps = 3;
};

// Like kit::parse_args: the data folder defaults to $KIT_DATA_DIR, then to the fields the build
// generated; --name value or --name=value, --help; one line and exit 2 on a bad command line (an
// unknown --amp, --workers < 0, a --profile-steps below 1).
WeatherArgs parse_weather_args(int argc, char** argv);

}  // namespace kit
