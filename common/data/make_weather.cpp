// make_weather: writes small weather fields in the layout of NERSC's ERA5 tutorial data
// (kit/data/era5.h): train/<year>.h5 and valid/<year>.h5 with a dataset "fields" of float32
// [time, channel, lat, lon], and stats/global_means.npy, stats/global_stds.npy ([1, C, 1, 1],
// float32, the training files' per-channel mean and standard deviation).
//
// Exercise 06 must train without ERA5 (40 years on a 0.25-degree grid), so this writes a stand-in
// whose dynamics a small ViT learns in a short CPU run: every channel is a smooth pattern (a few
// low waves in longitude and latitude, drawn anew for each file, a "year") carried eastward by a
// wind that is strongest at the equator and nil at the poles, u(row) = 1.5 sin(pi (row + 0.5) /
// lat) grid points per time step, and channel c a little faster (+0.25 c): the next step is each
// row moved east by its own fractional amount. Channels have ERA5's names and the order of NERSC's
// 20 (u10, v10, t2m, sp, msl, t850, ...): channel 0 is u10, whose RMSE the course reports; their
// offsets and spreads are of the real variables' order (t2m around 278 K, sp around 98000 Pa), so
// that the per-channel normalisation matters as it does on the real data.
//
// Determinism: splitmix64 and the same arithmetic everywhere; the same arguments give the same
// values.
//
// Usage: make_weather --out DIR [--channels C] [--lat H] [--lon W] [--steps T]
//                     [--train-files N] [--valid-files M] [--seed S]
//   defaults: 4 channels on 32 x 64, 40 steps per file, 2 training files, 1 validation file.
//
// HDF5's C API, no LibTorch.
#include <hdf5.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "splitmix.h"  // Rng

namespace {

// NERSC's 20 channels (FourCastNet's order), with an offset and a spread of each variable's order.
struct Variable {
  const char* name;
  double mean, spread;
};
const Variable kVariables[] = {
    {"u10", 0.0, 5.0},        {"v10", 0.0, 4.0},       {"t2m", 278.0, 20.0},
    {"sp", 97000.0, 9000.0},  {"msl", 101000.0, 1000.0}, {"t850", 275.0, 15.0},
    {"u1000", 0.0, 6.0},      {"v1000", 0.0, 5.0},     {"z1000", 900.0, 900.0},
    {"u850", 1.0, 8.0},       {"v850", 0.0, 6.0},      {"z850", 13500.0, 600.0},
    {"u500", 6.0, 11.0},      {"v500", 0.0, 9.0},      {"z500", 55000.0, 2800.0},
    {"t500", 253.0, 13.0},    {"z50", 200000.0, 5000.0}, {"r500", 50.0, 30.0},
    {"r850", 70.0, 25.0},     {"tcwv", 20.0, 16.0}};
constexpr int kKnown = sizeof kVariables / sizeof kVariables[0];

struct Args {
  std::string out;
  int channels = 4, lat = 32, lon = 64, steps = 40, train_files = 2, valid_files = 1;
  uint64_t seed = 7;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "make_weather: " << why
            << "\nusage: make_weather --out DIR [--channels C] [--lat H] [--lon W] [--steps T] "
               "[--train-files N] [--valid-files M] [--seed S]\n";
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + " needs a value");
    const std::string value = argv[++i];
    auto number = [&](int lo) {
      char* end = nullptr;
      const long v = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || v < lo || v > 1000000)
        usage(flag + " " + value + ": a whole number of at least " + std::to_string(lo));
      return static_cast<int>(v);
    };
    if (flag == "--out") a.out = value;
    else if (flag == "--channels") a.channels = number(1);
    else if (flag == "--lat") a.lat = number(2);
    else if (flag == "--lon") a.lon = number(2);
    else if (flag == "--steps") a.steps = number(2);
    else if (flag == "--train-files") a.train_files = number(1);
    else if (flag == "--valid-files") a.valid_files = number(1);
    else if (flag == "--seed") a.seed = static_cast<uint64_t>(number(0));
    else usage("unknown flag " + flag);
  }
  if (a.out.empty()) usage("--out is required");
  return a;
}

// One file's fields, float [steps, channels, lat, lon], from its own random waves.
std::vector<float> fields(const Args& a, Rng& rng) {
  constexpr int kWaves = 4;
  const double pi = std::acos(-1.0);
  std::vector<float> out(static_cast<size_t>(a.steps) * a.channels * a.lat * a.lon);
  for (int c = 0; c < a.channels; ++c) {
    const Variable v = c < kKnown ? kVariables[c] : Variable{"extra", 0.0, 1.0};
    double zonal[kWaves], meridional[kWaves], phase[kWaves], amplitude[kWaves];
    for (int k = 0; k < kWaves; ++k) {
      zonal[k] = 1 + rng.below(3);       // 1..3 waves around the globe
      meridional[k] = rng.below(3);      // 0..2 half waves from pole to pole
      phase[k] = 2 * pi * rng.uniform();
      amplitude[k] = 0.5 + rng.uniform();
    }
    double norm = 0;
    for (double x : amplitude) norm += x * x / 2;
    norm = std::sqrt(norm);  // each wave's variance is a^2/2 (about 1/4 more in latitude)
    for (int t = 0; t < a.steps; ++t)
      for (int y = 0; y < a.lat; ++y) {
        const double wind = 1.5 * std::sin(pi * (y + 0.5) / a.lat) + 0.25 * c;  // points per step
        for (int x = 0; x < a.lon; ++x) {
          const double moved = x - wind * t;  // the pattern came from further west
          double g = 0;
          for (int k = 0; k < kWaves; ++k)
            g += amplitude[k] * std::cos(2 * pi * zonal[k] * moved / a.lon + phase[k]) *
                 std::cos(pi * meridional[k] * (y + 0.5) / a.lat);
          out[((static_cast<size_t>(t) * a.channels + c) * a.lat + y) * a.lon + x] =
              static_cast<float>(v.mean + v.spread * g / norm);
        }
      }
  }
  return out;
}

[[noreturn]] void fail(const std::string& what) {
  std::cerr << "make_weather: " << what << "\n";
  std::exit(1);
}

void write_h5(const std::string& path, const Args& a, const std::vector<float>& values) {
  const hsize_t dims[4] = {static_cast<hsize_t>(a.steps), static_cast<hsize_t>(a.channels),
                           static_cast<hsize_t>(a.lat), static_cast<hsize_t>(a.lon)};
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file < 0) fail("cannot create " + path);
  const hid_t space = H5Screate_simple(4, dims, nullptr);
  const hid_t set = H5Dcreate2(file, "fields", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT,
                               H5P_DEFAULT);
  const bool ok = set >= 0 && H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                       values.data()) >= 0;
  if (set >= 0) H5Dclose(set);
  H5Sclose(space);
  if (H5Fclose(file) < 0 || !ok) fail("cannot write " + path);
}

// NumPy's .npy format 1.0: float32, little-endian, C order, shape (1, C, 1, 1).
void write_npy(const std::string& path, const std::vector<double>& values) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, " +
                       std::to_string(values.size()) + ", 1, 1), }";
  // Magic (6) + version (2) + length (2) + header + '\n', padded with spaces to a multiple of 64.
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  const uint16_t n = static_cast<uint16_t>(header.size());
  const unsigned char len[2] = {static_cast<unsigned char>(n & 0xff), static_cast<unsigned char>(n >> 8)};
  f.write(reinterpret_cast<const char*>(len), 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (double v : values) {
    const float x = static_cast<float>(v);
    f.write(reinterpret_cast<const char*>(&x), 4);  // this program runs on little-endian hosts
  }
  if (!f) fail("cannot write " + path);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const char* d : {"train", "valid", "stats"}) fs::create_directories(fs::path(a.out) / d, ec);
  if (ec) fail("cannot create " + a.out + ": " + ec.message());
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  Rng rng(a.seed);
  // The training files' sums, per channel, for the statistics.
  std::vector<double> sum(a.channels, 0.0), squares(a.channels, 0.0);
  const size_t plane = static_cast<size_t>(a.lat) * a.lon;
  int year = 2001;
  for (int f = 0; f < a.train_files + a.valid_files; ++f, ++year) {
    const bool train = f < a.train_files;
    const std::vector<float> v = fields(a, rng);
    write_h5((fs::path(a.out) / (train ? "train" : "valid") / (std::to_string(year) + ".h5")).string(),
             a, v);
    if (!train) continue;
    for (size_t i = 0; i < v.size(); ++i) {
      const int c = static_cast<int>((i / plane) % a.channels);
      sum[c] += v[i];
      squares[c] += static_cast<double>(v[i]) * v[i];
    }
  }
  const double count = static_cast<double>(a.train_files) * a.steps * plane;
  std::vector<double> mean(a.channels), sd(a.channels);
  for (int c = 0; c < a.channels; ++c) {
    mean[c] = sum[c] / count;
    sd[c] = std::sqrt(std::max(squares[c] / count - mean[c] * mean[c], 1e-12));
  }
  // The marker the build waits for (common/data/CMakeLists.txt) is written last.
  write_npy((fs::path(a.out) / "stats" / "global_stds.npy").string(), sd);
  write_npy((fs::path(a.out) / "stats" / "global_means.npy").string(), mean);
  std::cout << "make_weather: " << a.train_files << " training and " << a.valid_files
            << " validation files of " << a.steps << " x " << a.channels << " x " << a.lat << " x "
            << a.lon << " in " << a.out << "\n";
  return 0;
}
