// CIFAR-10 reading and augmentation: see cifar10.h for what the functions promise.
#include "kit/data/cifar10.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <torch/torch.h>

namespace fs = std::filesystem;

namespace kit {

namespace {

using F = Cifar10Format;

const char* const kCifarDownloadHint =
    "compute nodes have no internet: run common/data/download_cifar10.sh on the login node";

// "30730000 bytes (10000 images of 3073 bytes)": sizes in messages always say what they count.
std::string bytes_of(int64_t images) {
  return std::to_string(images * F::kRecordBytes) + " bytes (" + std::to_string(images) +
         " images of " + std::to_string(F::kRecordBytes) + " bytes)";
}

// The file's size after checking that it exists and holds whole records.
int64_t checked_size(const fs::path& path) {
  std::error_code ec;
  const std::string where = path.string();
  if (!fs::exists(path, ec))
    throw DataError("CIFAR-10 not found: " + where + " is missing (" + kCifarDownloadHint + ")");
  if (!fs::is_regular_file(path, ec))
    throw DataError(where + " is not a regular file (a directory or a device?)");
  const auto size = static_cast<int64_t>(fs::file_size(path, ec));
  if (ec) throw DataError("cannot read the size of " + where + ": " + ec.message());
  if (size == 0)
    throw DataError(where + " is empty (0 bytes), expected " + bytes_of(F::kImagesPerFile) +
                    ": an interrupted download? " + kCifarDownloadHint);
  if (size % (F::kRecordBytes + 1) == 0 && size % F::kRecordBytes != 0)
    throw DataError(where + " has records of " + std::to_string(F::kRecordBytes + 1) +
                    " bytes (CIFAR-100's format, two labels per image), expected " +
                    std::to_string(F::kRecordBytes) + "-byte CIFAR-10 records");
  if (size % F::kRecordBytes != 0)
    throw DataError(where + " is " + std::to_string(size) + " bytes, expected a whole number " +
                    "of " + std::to_string(F::kRecordBytes) + "-byte records (" +
                    bytes_of(F::kImagesPerFile) + " for the real data set): a truncated or " +
                    "damaged copy, or not 32x32 RGB images with 10 classes");
  return size;
}

// Appends the first `records` records of `path` to labels / pixels, checking every label.
void read_records(const fs::path& path, int64_t records, std::vector<int64_t>& labels,
                  std::vector<uint8_t>& pixels) {
  const std::string where = path.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError("cannot open " + where + ": " + std::strerror(errno));
  std::vector<char> bytes(static_cast<size_t>(records * F::kRecordBytes));
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (in.gcount() != static_cast<std::streamsize>(bytes.size()))
    throw DataError("cannot read " + where + ": it ended after " + std::to_string(in.gcount()) +
                    " bytes, expected at least " + bytes_of(records));
  for (int64_t r = 0; r < records; ++r) {
    const char* record = bytes.data() + r * F::kRecordBytes;
    const auto label = static_cast<unsigned char>(record[0]);
    if (label >= F::kClasses)
      throw DataError(where + ": image " + std::to_string(r) + " (byte " +
                      std::to_string(r * F::kRecordBytes) + ") has class " +
                      std::to_string(label) + ", expected 0.." + std::to_string(F::kClasses - 1) +
                      " in records of " + std::to_string(F::kRecordBytes) +
                      " bytes: not CIFAR-10, or a damaged copy");
    labels.push_back(label);
    pixels.insert(pixels.end(), record + 1, record + F::kRecordBytes);
  }
}

// splitmix64: the augmentation's random numbers, a pure function of its input.
uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<std::string> cifar10_files(const std::string& dir, Cifar10Split split) {
  std::vector<std::string> files;
  if (split == Cifar10Split::test) {
    files.push_back((fs::path(dir) / "test_batch.bin").string());
  } else {
    for (int k = 1; k <= F::kTrainFiles; ++k)
      files.push_back((fs::path(dir) / ("data_batch_" + std::to_string(k) + ".bin")).string());
  }
  return files;
}

Cifar10Dataset load_cifar10(const std::string& dir, Cifar10Split split, int64_t limit) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw DataError("CIFAR-10 not found: the directory " + dir + " does not exist (" +
                    kCifarDownloadHint + ")");
  const std::vector<std::string> files = cifar10_files(dir, split);
  // Sizes first, of every file: a truncated data_batch_5.bin is reported at once, even when
  // `limit` means it would not be read.
  std::vector<int64_t> sizes;
  for (const std::string& file : files) sizes.push_back(checked_size(file));
  // The training files of one set are all the same size (10,000 images each in the real one), so
  // a file cut at a record boundary shows up as shorter than the largest.
  const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
  for (size_t k = 0; k < files.size(); ++k)
    if (sizes[k] != largest)
      throw DataError(files[k] + " is " + std::to_string(sizes[k]) + " bytes, expected " +
                      bytes_of(largest / F::kRecordBytes) + " like the other training files: " +
                      "a truncated copy? " + kCifarDownloadHint);

  std::vector<int64_t> labels;
  std::vector<uint8_t> pixels;
  for (size_t k = 0; k < files.size(); ++k) {
    const int64_t have = static_cast<int64_t>(labels.size());
    if (limit >= 0 && have >= limit) break;
    int64_t records = sizes[k] / F::kRecordBytes;
    if (limit >= 0) records = std::min(records, limit - have);
    read_records(files[k], records, labels, pixels);
  }
  const auto n = static_cast<int64_t>(labels.size());
  if (n == 0) throw DataError("load_cifar10: limit 0 leaves no images of " + dir);
  torch::Tensor images =
      torch::from_blob(pixels.data(), {n, F::kChannels, F::kSide, F::kSide}, torch::kUInt8)
          .clone();
  torch::Tensor targets = torch::from_blob(labels.data(), {n}, torch::kInt64).clone();
  return Cifar10Dataset(std::move(images), std::move(targets),
                        split == Cifar10Split::train ? "train" : "test");
}

Cifar10Dataset::Cifar10Dataset(torch::Tensor images, torch::Tensor labels, std::string name)
    : images_(std::move(images)), labels_(std::move(labels)), name_(std::move(name)) {
  TORCH_CHECK(images_.dim() == 4 && images_.size(1) == F::kChannels &&
                  images_.size(2) == F::kSide && images_.size(3) == F::kSide &&
                  images_.scalar_type() == torch::kUInt8,
              "Cifar10Dataset: images must be uint8 [N,3,32,32], got ", images_.sizes());
  TORCH_CHECK(labels_.dim() == 1 && labels_.size(0) == images_.size(0) &&
                  labels_.scalar_type() == torch::kInt64,
              "Cifar10Dataset: labels must be int64 [N] with N = ", images_.size(0));
  mean_ = torch::tensor({kMean[0], kMean[1], kMean[2]}).view({3, 1, 1});
  std_ = torch::tensor({kStd[0], kStd[1], kStd[2]}).view({3, 1, 1});
}

void Cifar10Dataset::set_augment(uint64_t seed) {
  augment_ = true;
  seed_ = seed;
}

Cifar10Example Cifar10Dataset::get(size_t index) const {
  TORCH_CHECK(index < size(), "Cifar10Dataset(", name_, "): index ", index, " >= size ", size());
  const auto i = static_cast<int64_t>(index);
  torch::Tensor x = (images_[i].to(torch::kFloat32) / 255.0f - mean_) / std_;
  if (augment_) {
    // One random number per (seed, epoch, image) gives the shift and the flip.
    const uint64_t r = mix(mix(mix(seed_) ^ static_cast<uint64_t>(epoch_)) ^ index);
    const int64_t span = 2 * kPad + 1;
    const int64_t dy = static_cast<int64_t>(r % span) - kPad;
    const int64_t dx = static_cast<int64_t>((r / span) % span) - kPad;
    const bool flip = ((r >> 32) & 1) != 0;
    // Crop of the padded image = the image shifted by (dy, dx), the uncovered border zero. Zero
    // after normalising is the mean colour, so the border adds no bright or dark frame.
    torch::Tensor out = torch::zeros_like(x);
    const int64_t h = F::kSide - std::abs(dy), w = F::kSide - std::abs(dx);
    out.narrow(1, std::max<int64_t>(0, -dy), h)
        .narrow(2, std::max<int64_t>(0, -dx), w)
        .copy_(x.narrow(1, std::max<int64_t>(0, dy), h).narrow(2, std::max<int64_t>(0, dx), w));
    x = flip ? out.flip({2}) : out;
  }
  return {x.contiguous(), labels_[i].clone()};
}

}  // namespace kit
