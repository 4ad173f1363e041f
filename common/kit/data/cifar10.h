// kit/data/cifar10.h — CIFAR-10 in its binary format: read the files, hand out normalised images.
//
// The "binary version" of CIFAR-10 is six files of fixed-size records, one record per image:
//   1 byte   the class, 0..9
//   3072     the pixels: 1024 red, then 1024 green, then 1024 blue, each a 32x32 image row by row
// data_batch_1.bin .. data_batch_5.bin hold the 50,000 training images (10,000 each) and
// test_batch.bin the 10,000 test images. common/data/download_cifar10.sh fetches them on a login
// node; common/data/make_images.cpp writes a small generated set in the same format for tests.
//
//   kit::Cifar10Dataset train = kit::load_cifar10(dir, kit::Cifar10Split::train);
//   train.set_augment(/*seed=*/42);        // random crop + flip, the same on every rank
//   auto [image, label] = train.get(0);    // float [3,32,32] normalised, int64 scalar
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

#include "kit/data/data_error.h"  // DataError, thrown for missing or damaged files

namespace kit {

enum class Cifar10Split { train, test };

// The sizes of the format. A record that is one byte longer (3074) is CIFAR-100's, whose records
// carry two labels: the reader says so rather than reading shifted images.
struct Cifar10Format {
  static constexpr int64_t kClasses = 10;
  static constexpr int64_t kChannels = 3;
  static constexpr int64_t kSide = 32;
  static constexpr int64_t kImageBytes = kChannels * kSide * kSide;  // 3072
  static constexpr int64_t kRecordBytes = 1 + kImageBytes;           // 3073
  static constexpr int64_t kImagesPerFile = 10000;                   // the real data set's files
  static constexpr int kTrainFiles = 5;
};

// The files of a split inside `dir`, in reading order.
std::vector<std::string> cifar10_files(const std::string& dir, Cifar10Split split);

// One example, as the DataLoader stacks it into a batch.
struct Cifar10Example {
  torch::Tensor input;   // float [3,32,32], per channel (x / 255 - mean) / std
  torch::Tensor target;  // int64 scalar, 0..9
};

// The images of one split, kept as bytes (150 MB as floats would be 600 MB per process).
// get() is const and thread-safe, so the loader's workers may call it at the same time.
class Cifar10Dataset {
 public:
  // images: uint8 [N,3,32,32]; labels: int64 [N] in 0..9. name: "train" or "test".
  Cifar10Dataset(torch::Tensor images, torch::Tensor labels, std::string name);

  size_t size() const { return static_cast<size_t>(labels_.size(0)); }
  Cifar10Example get(size_t index) const;
  const std::string& name() const { return name_; }

  // Training augmentation: a random crop of the image padded by 4 pixels on each side, and a
  // horizontal flip half of the time. The choices for image i depend only on (seed, epoch, i),
  // never on the rank, the number of ranks or the loader's workers: an N-rank run and a
  // one-process run see exactly the same images. Off until set_augment() is called.
  // The draw: r = m(m(m(seed) ^ epoch) ^ i), m = splitmix64; the image moves by dy = r mod 9 - 4
  // rows and dx = (r / 9) mod 9 - 4 columns, and is flipped when bit 32 of r is set. Unlike
  // torchvision's RandomCrop(32, padding=4) before Normalize, whose border is black, the border
  // here is zero after normalising: the mean colour (no dark frame to learn). Checked against a
  // reference by tests/oracle/oracle_kit.py.
  void set_augment(uint64_t seed);
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  bool augmenting() const { return augment_; }

  // The raw data, for tests and statistics.
  const torch::Tensor& images() const { return images_; }
  const torch::Tensor& labels() const { return labels_; }

  // The per-channel mean and standard deviation of the real training set (pixel values / 255).
  // Fixed numbers rather than statistics of whatever was loaded, so that every rank, every
  // --train-images limit and the generated set are normalised the same way.
  static constexpr float kMean[3] = {0.4914f, 0.4822f, 0.4465f};
  static constexpr float kStd[3] = {0.2470f, 0.2435f, 0.2616f};
  static constexpr int64_t kPad = 4;

 private:
  torch::Tensor images_, labels_;
  torch::Tensor mean_, std_;  // kMean and kStd as [3,1,1] tensors, made once, not per image
  std::string name_;
  bool augment_ = false;
  uint64_t seed_ = 0;
  int64_t epoch_ = 0;
};

// Reads a split from `dir` (train: data_batch_1..5.bin, test: test_batch.bin). limit >= 0 keeps
// only the first `limit` images (short runs); the files are still all checked.
//
// Throws DataError (one line naming the file and the expected size) when a file is missing, its
// size is not a whole number of 3073-byte records, a training file is shorter than the others
// (a truncated copy), or a label is not in 0..9.
Cifar10Dataset load_cifar10(const std::string& dir, Cifar10Split split, int64_t limit = -1);

}  // namespace kit
