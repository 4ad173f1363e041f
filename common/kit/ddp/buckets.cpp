// kit/ddp/buckets.cpp — the bucket assignment rule (see buckets.h).
#include "kit/ddp/buckets.h"

#include <numeric>
#include <stdexcept>

namespace kit {

std::vector<std::vector<size_t>> assign_buckets(const std::vector<size_t>& bytes,
                                                size_t first_bucket_bytes, size_t bucket_bytes,
                                                std::vector<size_t> order) {
  if (order.empty()) {  // the guess before the first backward: last parameter first
    order.resize(bytes.size());
    std::iota(order.rbegin(), order.rend(), size_t{0});
  }
  std::vector<bool> named(bytes.size(), false);
  for (size_t k : order) {
    if (k >= bytes.size() || named[k])
      throw std::invalid_argument("assign_buckets: the order must name every parameter once");
    named[k] = true;
  }
  if (order.size() != bytes.size())
    throw std::invalid_argument("assign_buckets: the order must name every parameter once");
  std::vector<std::vector<size_t>> buckets;
  std::vector<size_t> current;
  size_t filled = 0;
  for (size_t k : order) {
    current.push_back(k);
    filled += bytes[k];
    size_t limit = buckets.empty() ? first_bucket_bytes : bucket_bytes;
    if (filled >= limit) {  // full: close it, the next gradient starts a new bucket
      buckets.push_back(std::move(current));
      current.clear();
      filled = 0;
    }
  }
  if (!current.empty()) buckets.push_back(std::move(current));
  return buckets;
}

}  // namespace kit
