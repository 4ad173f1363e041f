// kit/data/data_error.h — kit::DataError: the one exception type for bad data on disk.
#pragma once

#include <stdexcept>

namespace kit {

// Thrown for every problem with the data on disk. what() is always one line that names the file
// and says what to do, because on a cluster it ends up as the last line of a Slurm log.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace kit
