// kit/buckets.h — assign_buckets(): which gradients travel together in one all-reduce.
// Plain C++, no LibTorch, so the rule can be unit-tested on its own.
//
// Backward produces gradients roughly in reverse order of the parameters (the last layer
// first), so buckets are filled from the last parameter backwards. The first bucket is kept
// small so that communication starts as early as possible; the others are capped (25 MiB as in
// PyTorch) so that each all-reduce is large enough to be efficient. Every rank computes the same
// assignment from the same model, so buckets are launched in the same order everywhere.
#pragma once

#include <cstddef>
#include <vector>

namespace kit {

// bytes[i]: size of parameter i's gradient. Returns buckets of parameter indices, bucket 0 first.
// A parameter larger than the cap gets a bucket of its own.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<size_t>& bytes,
                                                size_t first_bucket_bytes, size_t bucket_bytes);

}  // namespace kit
