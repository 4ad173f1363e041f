// kit/buckets.cpp — the bucket assignment rule (see buckets.h).
#include "kit/buckets.h"

namespace kit {

std::vector<std::vector<size_t>> assign_buckets(const std::vector<size_t>& bytes,
                                                size_t first_bucket_bytes, size_t bucket_bytes) {
  std::vector<std::vector<size_t>> buckets;
  std::vector<size_t> current;
  size_t filled = 0;
  for (size_t k = bytes.size(); k-- > 0;) {
    size_t cap = buckets.empty() ? first_bucket_bytes : bucket_bytes;
    if (!current.empty() && filled + bytes[k] > cap) {
      buckets.push_back(std::move(current));
      current.clear();
      filled = 0;
    }
    current.push_back(k);
    filled += bytes[k];
  }
  if (!current.empty()) buckets.push_back(std::move(current));
  return buckets;
}

}  // namespace kit
