// make_images: writes a generated image set in the binary format of CIFAR-10.
//
// Exercise 02 trains an image classifier, and its tests and demo must run without internet, so
// they cannot use the real CIFAR-10. This program writes a stand-in with the same files
// (data_batch_1.bin .. data_batch_5.bin, test_batch.bin, batches.meta.txt) and the same records
// (1 label byte, then 32x32 red, green and blue planes), so the real reader reads both.
//
// The classes must be learnable in a few hundred steps of a small ResNet, yet not by looking at a
// single pixel: each class is a pattern (stripes in one of three directions, a checkerboard, or
// rings) drawn in its own colour over a random background, with a random phase, stripe width,
// brightness and per-pixel noise. Colour alone separates the classes roughly, and the pattern
// separates them cleanly.
//
// Determinism: splitmix64 and integer arithmetic only (no std::*_distribution, whose results
// differ between standard libraries), so the same arguments give byte-identical files everywhere.
// The training and test images come from separate streams.
//
// Usage: make_images --out DIR [--train N] [--test M] [--seed S]
//   N (default 5000) must be a multiple of 5: the five training files hold N/5 images each.
//
// Plain C++17, no LibTorch: it builds in about a second.
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "splitmix.h"  // Rng

namespace {

constexpr int kSide = 32;
constexpr int kPlane = kSide * kSide;
constexpr int kRecord = 1 + 3 * kPlane;  // 3073 bytes, as in CIFAR-10
constexpr int kClasses = 10;
constexpr int kTrainFiles = 5;

// Each class's colour (RGB) and pattern; the names go to batches.meta.txt.
struct ClassLook {
  int r, g, b, pattern;
  const char* name;
};
enum Pattern { kRows, kColumns, kDiagonal, kChecker, kRings };
const ClassLook kLooks[kClasses] = {
    {230, 40, 40, kRows, "red-rows"},          {40, 200, 40, kColumns, "green-columns"},
    {50, 80, 230, kDiagonal, "blue-diagonal"}, {230, 210, 40, kChecker, "yellow-checker"},
    {200, 60, 210, kRings, "purple-rings"},    {40, 210, 210, kRows, "cyan-rows"},
    {240, 140, 30, kColumns, "orange-columns"}, {240, 240, 240, kDiagonal, "white-diagonal"},
    {120, 70, 30, kChecker, "brown-checker"},  {150, 200, 90, kRings, "olive-rings"}};

int clamp255(int v) { return v < 0 ? 0 : (v > 255 ? 255 : v); }

// One image of class `c` in the record layout (label, then the three colour planes).
void draw(Rng& rng, int c, std::vector<unsigned char>& record) {
  const ClassLook& look = kLooks[c];
  record[0] = static_cast<unsigned char>(c);
  const int period = rng.between(4, 7);    // stripe / square width in pixels
  const int phase = rng.below(period * 2);
  const int bright = rng.between(70, 110);  // percent of the class colour
  const int cy = rng.between(8, 23), cx = rng.between(8, 23);  // centre of the rings
  const int back[3] = {rng.between(0, 110), rng.between(0, 110), rng.between(0, 110)};
  const int fore[3] = {look.r * bright / 100, look.g * bright / 100, look.b * bright / 100};
  for (int y = 0; y < kSide; ++y) {
    for (int x = 0; x < kSide; ++x) {
      int t = 0;
      switch (look.pattern) {
        case kRows: t = y + phase; break;
        case kColumns: t = x + phase; break;
        case kDiagonal: t = x + y + phase; break;
        case kChecker: t = (x + phase) / period + (y + phase) / period; t *= period; break;
        case kRings: {
          const int dy = y - cy, dx = x - cx;
          int d = 0;  // integer square root of the squared distance
          while ((d + 1) * (d + 1) <= dy * dy + dx * dx) ++d;
          t = d + phase;
          break;
        }
      }
      const bool on = (t / period) % 2 == 0;
      for (int ch = 0; ch < 3; ++ch) {
        const int noise = rng.between(-25, 25);
        record[1 + ch * kPlane + y * kSide + x] =
            static_cast<unsigned char>(clamp255((on ? fore[ch] : back[ch]) + noise));
      }
    }
  }
}

// Writes `count` images to `path`; labels cycle through the classes in a shuffled order per ten
// images, so every file is balanced.
bool write_file(const std::filesystem::path& path, Rng& rng, long count) {
  std::ofstream out(path, std::ios::binary);
  std::vector<unsigned char> record(kRecord);
  int order[kClasses];
  for (long i = 0; i < count; ++i) {
    if (i % kClasses == 0) {
      for (int k = 0; k < kClasses; ++k) order[k] = k;
      for (int k = kClasses - 1; k > 0; --k) std::swap(order[k], order[rng.below(k + 1)]);
    }
    draw(rng, order[i % kClasses], record);
    out.write(reinterpret_cast<const char*>(record.data()), kRecord);
  }
  out.flush();
  return static_cast<bool>(out);
}

[[noreturn]] void usage_error(const std::string& why) {
  std::cerr << "make_images: " << why
            << " (usage: make_images --out DIR [--train N] [--test M] [--seed S])\n";
  std::exit(2);
}

long number(const std::string& flag, const char* text) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < 0)
    usage_error(flag + " needs a number >= 0, got '" + text + "'");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_dir;
  long train = 5000, test = 1000, seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::cout << "usage: make_images --out DIR [--train N] [--test M] [--seed S]\n";
      return 0;
    }
    if (i + 1 >= argc) usage_error(flag + " needs a value");
    const char* value = argv[++i];
    if (flag == "--out") out_dir = value;
    else if (flag == "--train") train = number(flag, value);
    else if (flag == "--test") test = number(flag, value);
    else if (flag == "--seed") seed = number(flag, value);
    else usage_error("unknown flag " + flag);
  }
  if (out_dir.empty()) usage_error("--out DIR is required");
  if (train == 0 || train % kTrainFiles != 0)
    usage_error("--train must be a positive multiple of 5 (five equal training files), got " +
                std::to_string(train));
  if (test == 0) usage_error("--test must be positive");

  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) {
    std::cerr << "make_images: cannot create " << out_dir << ": " << ec.message() << "\n";
    return 1;
  }
  Rng train_rng(static_cast<uint64_t>(seed) * 2 + 1), test_rng(static_cast<uint64_t>(seed) * 2 + 2);
  train_rng.next();  // separate the two streams' first numbers from the seeds' closeness
  test_rng.next();
  bool ok = true;
  for (int k = 1; k <= kTrainFiles; ++k)
    ok = ok && write_file(fs::path(out_dir) / ("data_batch_" + std::to_string(k) + ".bin"),
                          train_rng, train / kTrainFiles);
  ok = ok && write_file(fs::path(out_dir) / "test_batch.bin", test_rng, test);
  std::ofstream meta(fs::path(out_dir) / "batches.meta.txt");
  for (const ClassLook& look : kLooks) meta << look.name << "\n";
  ok = ok && static_cast<bool>(meta.flush());
  if (!ok) {
    std::cerr << "make_images: cannot write the files in " << out_dir << "\n";
    return 1;
  }
  std::cout << "make_images: wrote " << train << " training and " << test << " test images to "
            << out_dir << "\n";
  return 0;
}
