// kit/ddp/buckets.h — assign_buckets(): which gradients travel together in one all-reduce.
// Plain C++, no LibTorch, so the rule can be unit-tested on its own.
//
// Buckets are filled in the order the gradients are expected to arrive, so that the first
// bucket is complete (and its all-reduce can start) while backward is still busy with earlier
// layers. Before the first backward that order is a guess: the reverse of the parameters' order
// (backward visits the last layer first). After the first backward DDP knows the real order and
// calls this again with it (kit/ddp/ddp.h: "rebuilt buckets").
//
// The rule, as PyTorch's: add parameters to the current bucket until it holds at least its limit,
// then close it. The first bucket's limit is small, so that communication starts early; the others
// are capped (25 MiB, as in PyTorch) so that each all-reduce is large enough to be efficient. A
// parameter is never split, so a bucket may end above its limit: an LM head of 16 MiB goes into
// the first bucket whole, together with its bias, instead of leaving the bias to travel alone.
// Every rank must use the same order (DDP takes rank 0's), so that buckets match across ranks.
#pragma once

#include <cstddef>
#include <vector>

namespace kit {

// bytes[i]: size of parameter i's gradient. order: parameter indices, the first expected gradient
// first (every index exactly once); empty: the reverse of the parameters' order. Returns buckets
// of parameter indices, bucket 0 first.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<size_t>& bytes,
                                                size_t first_bucket_bytes, size_t bucket_bytes,
                                                std::vector<size_t> order = {});

}  // namespace kit
