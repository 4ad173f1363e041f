// common/data/splitmix.h — the random numbers of the data generators (make_corpus, make_images,
// make_weather): splitmix64, small, fast and the same on every platform, so that a seed makes the
// same bytes everywhere (the standard library's distributions may draw differently in each
// library). No LibTorch.
#pragma once

#include <cstdint>

struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // 0 <= result < n. The modulo bias is far too small to matter for toy data.
  uint64_t below(uint64_t n) { return next() % n; }
  int between(int lo, int hi) { return lo + static_cast<int>(below(hi - lo + 1)); }  // inclusive
  bool percent(int p) { return below(100) < static_cast<uint64_t>(p); }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};
