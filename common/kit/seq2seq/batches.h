// kit/seq2seq/batches.h — the summariser's batches: examples of similar length together, so that
// a batch of news articles is not mostly padding, and the padding itself.
//
//   auto batches = kit::length_buckets(train.document_lengths(), 32, seed + epoch);
//   for (auto& idx : batches) { ... kit::pad_batch(documents of idx, vocab.pad()) ... }
//
// XSum's articles run from a few dozen tokens to the 512 they are cut at (kit/data/xsum.h): in a
// batch of 32 drawn at random, most rows are padded up to the longest. Sorted by length and cut
// into batches, a batch's rows are nearly equally long. The order of the batches is shuffled, and
// so is the order among equal lengths, so that the model does not see short batches first and
// long ones last, and an epoch's batches differ from the last epoch's where lengths tie.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/types.h>

namespace kit {

// lengths: int64 [n] (XsumDataset::document_lengths(), or documents' plus summaries'); batch_size
// >= 1. The indices 0..n-1 cut into batches of batch_size (the last one shorter when batch_size
// does not divide n; none when n is 0): the indices are shuffled by seed (ties), sorted by length
// (stable), cut in that order, and the batches shuffled by seed. Every index is in exactly one
// batch. The same (lengths, batch_size, seed) gives the same batches, on every rank and platform
// (torch's CPU generator, seeded, not the standard library's distributions).
// std::invalid_argument, one line naming the call, for batch_size < 1 or lengths that are not 1-D.
std::vector<std::vector<int64_t>> length_buckets(const torch::Tensor& lengths, int64_t batch_size,
                                                 uint64_t seed);

// Sequences (1-D int64 tensors, any lengths >= 0) -> int64 [count, longest] with pad_id after each
// sequence's end. std::invalid_argument, one line naming the call, for no sequences, or one that
// is not a 1-D int64 tensor.
torch::Tensor pad_batch(const std::vector<torch::Tensor>& sequences, int64_t pad_id);

// How many padded positions batches of these lengths hold: sum over the batches of
// (longest * rows - sum of lengths). What length_buckets() lowers.
int64_t padding_of(const std::vector<std::vector<int64_t>>& batches, const torch::Tensor& lengths);

}  // namespace kit
