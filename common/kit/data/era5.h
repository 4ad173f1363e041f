// kit/data/era5.h — weather fields in the layout of NERSC's ERA5 tutorial: one sample is the
// atmosphere at one time step (the input) and dt steps later (the target).
//
// A data folder holds, as NERSC's "Deep Learning at Scale" course keeps its downsampled ERA5:
//   train/*.h5, valid/*.h5   one HDF5 file per year, each with one dataset "fields":
//                            float [time, channel, lat, lon] (6-hourly steps; channel 0 is u10,
//                            the 10 m eastward wind, whose error is the course's figure of merit)
//   stats/global_means.npy   the per-channel mean over the training years, shape [1, C, 1, 1]
//   stats/global_stds.npy    the per-channel standard deviation, the same shape
// Files are read in the order of their names; each contributes (its time steps - dt) samples.
// Every sample is normalised per channel, (x - mean) / std, input and target alike.
// common/data/make_weather.cpp writes small fields in this layout (build/data/era5); the real
// data: exercise 06's page (exercises/06-weather-vit-one-device/README.md).
//
// Read with HDF5's C API (libhdf5-dev on Debian, the site's HDF5 module on a cluster; without
// HDF5 this file's functions are not built, and neither is exercise 06). Only the hyperslab of
// one time step is read per field, so a year of real ERA5 (tens of GB) is never loaded whole.
// get() is const and may be called from the loader's worker threads at once: the HDF5 calls take
// turns under one lock (the C library is re-entrant only when built thread-safe, as Debian's is
// and many sites' are not), the checks and the normalising run in parallel.
//
//   kit::FieldStats stats = kit::load_field_stats(dir);
//   kit::Era5Dataset train(dir, "train", stats);
//   auto [input, target] = train.get(0);   // float [C, lat, lon] each
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "kit/data/data_error.h"  // DataError: a file of another layout, NaNs, a missing folder

namespace kit {

// The per-channel statistics the fields are normalised with: float [C, 1, 1] each.
struct FieldStats {
  torch::Tensor mean, std;
  int64_t channels() const { return mean.size(0); }
};

// stats/global_means.npy and stats/global_stds.npy of `dir` (.npy: little-endian float32 or
// float64, C order, C values in any shape of ones and C). A missing file, another format, a
// standard deviation that is not positive: DataError, one line naming the file.
FieldStats load_field_stats(const std::string& dir);

struct Era5Options {
  int64_t dt = 1;      // the target is this many time steps after the input
  int64_t limit = -1;  // the first N samples only (NERSC's limit_nsamples; -1: all)
  int64_t lat = 0, lon = 0;  // the top-left lat x lon of each field (0: the file's whole grid)
};

struct Era5Example {
  torch::Tensor input;   // float [C, lat, lon], normalised
  torch::Tensor target;  // the same, dt steps later
};

class Era5Dataset {
 public:
  // split: a folder of `dir` ("train", "valid"). Opens every *.h5 file there and checks its
  // layout: a dataset "fields" of 4 dimensions, floating point, with stats.channels() channels,
  // more than dt time steps and at least lat x lon points; one DataError line otherwise.
  Era5Dataset(const std::string& dir, const std::string& split, const FieldStats& stats,
              Era5Options options = {});

  size_t size() const { return size_; }
  // Sample i: reads two time steps of one file. A field holding NaN or infinity is a DataError
  // naming the file, the time step and the channel (a damaged file, not a training problem).
  Era5Example get(size_t index) const;
  const std::string& name() const { return name_; }  // the split
  int64_t channels() const { return channels_; }
  int64_t lat() const { return lat_; }
  int64_t lon() const { return lon_; }
  const std::vector<std::string>& files() const { return files_; }

 private:
  struct Files;  // the open HDF5 files (era5.cpp)
  std::shared_ptr<Files> open_;
  std::vector<std::string> files_;
  std::vector<int64_t> first_;  // the first sample of each file, and the total at the end
  std::string name_;
  torch::Tensor mean_, std_;
  int64_t channels_ = 0, lat_ = 0, lon_ = 0, dt_ = 1;
  size_t size_ = 0;
};

// The weights of each latitude row for an area-true mean over the globe: cos(latitude), scaled
// to a mean of 1, for `rows` rows from 90 N down to 90 S (latitude 90 - 180 j / (rows - 1), the
// convention of FourCastNet's and NERSC's metrics). float [rows, 1].
torch::Tensor latitude_weights(int64_t rows);

// The latitude-weighted RMSE of `channel` of prediction against target (both [B, C, lat, lon],
// normalised units), per sample: sqrt of the weighted mean of the squared error over the grid.
// float64 [B], on the inputs' device; the mean over samples is the figure NERSC reports.
torch::Tensor weighted_rmse(const torch::Tensor& prediction, const torch::Tensor& target,
                            int64_t channel);

}  // namespace kit
