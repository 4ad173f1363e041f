// kit/data/era5.cpp — weather fields in NERSC's layout, read with HDF5's C API (see era5.h).
// Built only where CMake found HDF5 (common/CMakeLists.txt).
#include "kit/data/era5.h"

#include <hdf5.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <utility>

#include "kit/check/observe.h"         // the samples read, and on which thread
#include "kit/data/hdf5_handles.h"     // hdf5_lock(), Hid (shared with the XSum reader)
#include "kit/data/loader_workers.h"   // loader_worker(): which worker thread reads

namespace kit {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& what) { throw DataError("era5: " + what); }

// A .npy file (NumPy's format 1.0-3.0): magic, version, header length, a Python dict literal
// {'descr': '<f4', 'fortran_order': False, 'shape': (1, 20, 1, 1), }, then the values.
std::vector<double> read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read " + path + " (the per-channel statistics: see kit/data/era5.h)");
  char magic[8] = {};
  in.read(magic, 8);
  if (!in || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    fail(path + " is not a .npy file (NumPy's format)");
  uint32_t header_len = 0;
  unsigned char len[4] = {};
  const int width = magic[6] == 1 ? 2 : 4;  // format 1.0: 2 bytes, 2.0 and 3.0: 4
  in.read(reinterpret_cast<char*>(len), width);
  for (int i = width - 1; i >= 0; --i) header_len = header_len * 256 + len[i];
  std::string header(header_len, '\0');
  in.read(header.data(), header_len);
  std::smatch m;
  if (!std::regex_search(header, m, std::regex(R"('descr'\s*:\s*'([<>|=])([fi])(\d)')")))
    fail(path + ": no dtype in the .npy header");
  const char order = m[1].str()[0], kind = m[2].str()[0];
  const int size = std::stoi(m[3]);
  if (kind != 'f' || (size != 4 && size != 8) || order == '>')
    fail(path + " holds " + m[1].str() + m[2].str() + m[3].str() +
         " values: little-endian float32 or float64 expected");
  if (std::regex_search(header, std::regex(R"('fortran_order'\s*:\s*True)")))
    fail(path + " is in Fortran order: C order expected");
  if (!std::regex_search(header, m, std::regex(R"('shape'\s*:\s*\(([^)]*)\))")))
    fail(path + ": no shape in the .npy header");
  int64_t count = 1;
  const std::string dims = m[1].str();
  const std::regex number(R"(\d+)");
  for (std::sregex_iterator it(dims.begin(), dims.end(), number), end; it != end; ++it)
    count *= std::stoll(it->str());
  std::vector<double> values(static_cast<size_t>(count));
  for (auto& v : values) {
    if (size == 4) {
      float f;
      in.read(reinterpret_cast<char*>(&f), 4);
      v = f;
    } else {
      in.read(reinterpret_cast<char*>(&v), 8);
    }
  }
  if (!in) fail(path + " is shorter than its header says (" + std::to_string(count) + " values)");
  return values;
}

}  // namespace

struct Era5Dataset::Files {
  std::vector<Hid> file, fields;  // each file, and its dataset "fields"
};

FieldStats load_field_stats(const std::string& dir) {
  const std::string mean_path = dir + "/stats/global_means.npy";
  const std::string std_path = dir + "/stats/global_stds.npy";
  std::vector<double> mean = read_npy(mean_path), sd = read_npy(std_path);
  if (mean.empty() || mean.size() != sd.size())
    fail(mean_path + " holds " + std::to_string(mean.size()) + " channels, " + std_path + " " +
         std::to_string(sd.size()) + ": one mean and one standard deviation per channel");
  for (size_t c = 0; c < sd.size(); ++c)
    if (!(sd[c] > 0) || !std::isfinite(sd[c]) || !std::isfinite(mean[c]))
      fail(std_path + ": channel " + std::to_string(c) + " has standard deviation " +
           std::to_string(sd[c]) + " (mean " + std::to_string(mean[c]) +
           "): every channel needs a finite mean and a positive standard deviation");
  const auto n = static_cast<int64_t>(mean.size());
  auto as_tensor = [n](const std::vector<double>& v) {
    return torch::tensor(v, torch::kDouble).to(torch::kFloat).view({n, 1, 1});
  };
  return {as_tensor(mean), as_tensor(sd)};
}

Era5Dataset::Era5Dataset(const std::string& dir, const std::string& split, const FieldStats& stats,
                         Era5Options options)
    : open_(std::make_shared<Files>()), name_(split), mean_(stats.mean), std_(stats.std),
      channels_(stats.channels()), dt_(options.dt) {
  const fs::path folder = fs::path(dir) / split;
  std::error_code ec;
  if (!fs::is_directory(folder, ec))
    fail("no folder " + folder.string() + " (the layout: kit/data/era5.h; the generated data: " +
         "make_weather, built by the `weather` target)");
  for (const auto& e : fs::directory_iterator(folder, ec))
    if (e.path().extension() == ".h5") files_.push_back(e.path().string());
  std::sort(files_.begin(), files_.end());
  if (files_.empty()) fail("no *.h5 file in " + folder.string());
  if (dt_ < 1) fail("dt must be 1 or more, got " + std::to_string(dt_));

  std::lock_guard<std::mutex> lock(hdf5_lock());
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors as one line of ours, not HDF5's stack
  int64_t total = 0;
  for (const std::string& path : files_) {
    Hid file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (file.id < 0)
      fail("cannot open " + path + " as an HDF5 file (damaged, or not HDF5; on a Lustre file "
           "system HDF5_USE_FILE_LOCKING=FALSE may be needed)");
    if (H5Lexists(file.id, "fields", H5P_DEFAULT) <= 0)
      fail(path + " has no dataset \"fields\": the layout is one dataset \"fields\" of "
           "[time, channel, lat, lon]");
    Hid fields(H5Dopen2(file.id, "fields", H5P_DEFAULT), H5Dclose);
    Hid type(H5Dget_type(fields.id), H5Tclose);
    Hid space(H5Dget_space(fields.id), H5Sclose);
    if (fields.id < 0 || type.id < 0 || space.id < 0) fail("cannot read \"fields\" of " + path);
    if (H5Tget_class(type.id) != H5T_FLOAT)
      fail(path + ": \"fields\" does not hold floating-point values");
    const int rank = H5Sget_simple_extent_ndims(space.id);
    if (rank != 4)
      fail(path + ": \"fields\" has " + std::to_string(rank) +
           " dimensions, the layout has 4: [time, channel, lat, lon]");
    hsize_t dims[4];
    H5Sget_simple_extent_dims(space.id, dims, nullptr);
    const auto steps = static_cast<int64_t>(dims[0]), c = static_cast<int64_t>(dims[1]),
               h = static_cast<int64_t>(dims[2]), w = static_cast<int64_t>(dims[3]);
    const std::string shape = "[" + std::to_string(steps) + ", " + std::to_string(c) + ", " +
                              std::to_string(h) + ", " + std::to_string(w) + "]";
    if (c != channels_)
      fail(path + ": \"fields\" " + shape + " has " + std::to_string(c) +
           " channels, the statistics (stats/global_means.npy) " + std::to_string(channels_) +
           ": [time, channel, lat, lon] expected, with one mean per channel");
    if (lat_ == 0) {  // the first file sets the grid, unless the options crop it
      lat_ = options.lat > 0 ? options.lat : h;
      lon_ = options.lon > 0 ? options.lon : w;
    }
    if (h < lat_ || w < lon_)
      fail(path + ": \"fields\" " + shape + " has a grid smaller than " + std::to_string(lat_) +
           " x " + std::to_string(lon_) + " (lat x lon)");
    if (steps <= dt_)
      fail(path + ": \"fields\" " + shape + " has " + std::to_string(steps) +
           " time steps: a sample needs dt + 1 = " + std::to_string(dt_ + 1));
    first_.push_back(total);
    total += steps - dt_;
    open_->file.push_back(std::move(file));
    open_->fields.push_back(std::move(fields));
  }
  first_.push_back(total);
  if (options.limit >= 0) total = std::min(total, options.limit);
  size_ = static_cast<size_t>(total);
}

Era5Example Era5Dataset::get(size_t index) const {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  if (index >= size_)
    throw std::out_of_range("era5: sample " + std::to_string(index) + " of " +
                            std::to_string(size_) + " (" + name_ + ")");
  const auto i = static_cast<int64_t>(index);
  const size_t f = static_cast<size_t>(
      std::upper_bound(first_.begin(), first_.end(), i) - first_.begin() - 1);
  const int64_t t = i - first_[f];
  auto read = [&](int64_t step) {
    torch::Tensor x = torch::empty({channels_, lat_, lon_}, torch::kFloat);
    hsize_t begin[4] = {static_cast<hsize_t>(step), 0, 0, 0};
    hsize_t count[4] = {1, static_cast<hsize_t>(channels_), static_cast<hsize_t>(lat_),
                        static_cast<hsize_t>(lon_)};
    hsize_t flat[1] = {static_cast<hsize_t>(x.numel())};
    herr_t ok;
    {
      std::lock_guard<std::mutex> lock(hdf5_lock());
      Hid space(H5Dget_space(open_->fields[f].id), H5Sclose);
      Hid memory(H5Screate_simple(1, flat, nullptr), H5Sclose);
      ok = H5Sselect_hyperslab(space.id, H5S_SELECT_SET, begin, nullptr, count, nullptr);
      if (ok >= 0)  // HDF5 converts float64 files to the float32 asked for
        ok = H5Dread(open_->fields[f].id, H5T_NATIVE_FLOAT, memory.id, space.id, H5P_DEFAULT,
                     x.data_ptr<float>());
    }
    if (ok < 0) fail("cannot read time step " + std::to_string(step) + " of " + files_[f]);
    const torch::Tensor finite = torch::isfinite(x).view({channels_, -1}).all(1);
    if (!finite.all().item<bool>()) {
      const int64_t c = (~finite).nonzero()[0][0].item<int64_t>();
      fail(files_[f] + ": time step " + std::to_string(step) + ", channel " + std::to_string(c) +
           " holds NaN or infinity (a damaged file: the loss would be NaN from the first step)");
    }
    return (x - mean_) / std_;
  };
  Era5Example e{read(t), read(t + dt_)};
  const auto ns = [](clock::time_point p) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(p.time_since_epoch()).count();
  };
  observe::sample(name_, index, loader_worker(), ns(start), ns(clock::now()));
  return e;
}

torch::Tensor latitude_weights(int64_t rows) {
  auto lat = 90.0 - torch::arange(rows, torch::kDouble) * (180.0 / std::max<int64_t>(rows - 1, 1));
  auto w = torch::cos(lat * (M_PI / 180.0));
  return (w / w.mean()).to(torch::kFloat).view({rows, 1});
}

torch::Tensor weighted_rmse(const torch::Tensor& prediction, const torch::Tensor& target,
                            int64_t channel) {
  const auto p = prediction.select(1, channel).to(torch::kDouble);
  const auto t = target.select(1, channel).to(torch::kDouble);
  const auto w = latitude_weights(p.size(1)).to(p.device(), torch::kDouble);
  return ((p - t).square() * w).mean({1, 2}).sqrt();
}

}  // namespace kit
