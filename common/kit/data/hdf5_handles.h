// kit/data/hdf5_handles.h — what the kit's HDF5 readers (era5.cpp, xsum.cpp) share: one lock for
// every HDF5 call, and a handle that closes itself. Included only by .cpp files that CMake builds
// where HDF5 was found (common/CMakeLists.txt); no header of the kit includes it.
//
// The lock: HDF5's C library is re-entrant only when built thread-safe, as Debian's is and many
// sites' are not, and loader worker threads read at once. One lock for both readers (an inline
// function's static is one object in the whole library), so that an exercise reading two data
// sets never runs two HDF5 calls at a time.
#pragma once

#include <hdf5.h>

#include <mutex>
#include <utility>

namespace kit {

inline std::mutex& hdf5_lock() {
  static std::mutex m;
  return m;
}

struct Hid {  // closes an HDF5 handle with the given function
  hid_t id = -1;
  herr_t (*close)(hid_t) = nullptr;
  Hid(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  Hid(Hid&& o) noexcept : id(std::exchange(o.id, -1)), close(o.close) {}
  Hid& operator=(Hid&& o) noexcept {  // the old handle goes to o, which closes it
    std::swap(id, o.id);
    std::swap(close, o.close);
    return *this;
  }
  ~Hid() {
    if (id >= 0) close(id);
  }
};

}  // namespace kit
