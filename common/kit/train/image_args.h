// kit/train/image_args.h — ImageTrainArgs and parse_image_args(): the flags of exercise 02's
// trainer (the image classifier). The flag parser is kit/train/args.h's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kit/train/args.h"     // Preset
#include "kit/train/lr_rule.h"  // LrScaling

namespace kit {

struct ImageTrainArgs {
  std::string data_dir;         // folder with data_batch_1..5.bin and test_batch.bin
  std::string out_dir = ".";    // model-best.pt, model-final.pt, metrics.csv
  int64_t epochs = 2;
  int64_t max_steps = 0;        // > 0: stop each epoch after this many steps
  int64_t batch_size = 32;      // images per optimizer step and rank (weak scaling)
  int64_t global_batch = 0;     // > 0: images per step over all ranks (strong scaling)
  int64_t accum_steps = 1;      // micro-batches per step: each of batch / accum_steps images
  int64_t eval_batch_size = 100;
  double lr = 0.05;             // tuned for one process with the batch above (SGD, momentum 0.9)
  LrScaling lr_scaling = LrScaling::none;
  int64_t warmup_steps = 0;
  int workers = 0;              // loader threads (0: batches made on the training thread)
  uint64_t seed = 42;
  int64_t width = 8, blocks = 1;  // the ResNet's size (kit/models/resnet.h)
  int64_t train_images = -1, test_images = -1;  // the first N of each split (-1: all)
  bool augment = false;         // random crops and flips of the training images
  double target_acc = 0;        // the summary's time to reach this test accuracy (0: none)
  std::string run_label, summary_csv;

  // Images per step on one rank: --global-batch / world size, else --batch-size. One line and
  // exit 2 (flag_error) when the global batch does not split evenly.
  int64_t batch_per_rank(int world_size) const;
  // The global batch --lr was tuned for: --global-batch if given (strong scaling: the rate
  // stays), else --batch-size (one process).
  int64_t lr_base_batch() const { return global_batch > 0 ? global_batch : batch_size; }
};

// Like kit::parse_args: the data folder defaults to $KIT_DATA_DIR, then to the image set the
// build generated; --name value or --name=value, --help, one line and exit 2 on a bad
// command line (an unknown --lr-scaling rule, --workers < 0, --accum-steps that does not divide
// the batch).
ImageTrainArgs parse_image_args(int argc, char** argv);

// The presets of parse_image_args() (--preset NAME, kit/train/args.h's Preset): "gpu", a step
// long enough on an A100 or H100 for the scaling lesson (how it was sized: image_args.cpp).
const std::vector<Preset>& image_presets();

}  // namespace kit
