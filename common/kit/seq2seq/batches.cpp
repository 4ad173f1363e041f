// kit/seq2seq/batches.cpp — batches by length and their padding (see batches.h).
#include "kit/seq2seq/batches.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

namespace kit {

std::vector<std::vector<int64_t>> length_buckets(const torch::Tensor& lengths, int64_t batch_size,
                                                 uint64_t seed) {
  if (batch_size < 1)
    throw std::invalid_argument("length_buckets: batch_size must be at least 1, not " +
                                std::to_string(batch_size));
  if (!lengths.defined() || lengths.dim() != 1)
    throw std::invalid_argument("length_buckets: lengths must be a 1-D tensor, one per example");
  auto len = lengths.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t n = len.numel();
  const int64_t* l = len.data_ptr<int64_t>();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  // Shuffled first, then sorted stably: equal lengths come in the seed's order.
  auto perm = torch::randperm(n, gen, torch::kLong);
  std::vector<int64_t> order(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + n);
  std::stable_sort(order.begin(), order.end(), [l](int64_t a, int64_t b) { return l[a] < l[b]; });
  std::vector<std::vector<int64_t>> batches;
  for (int64_t i = 0; i < n; i += batch_size)
    batches.emplace_back(order.begin() + i, order.begin() + std::min(n, i + batch_size));
  auto shuffle = torch::randperm(static_cast<int64_t>(batches.size()), gen, torch::kLong);
  std::vector<std::vector<int64_t>> out;
  out.reserve(batches.size());
  for (int64_t i = 0; i < shuffle.numel(); ++i) out.push_back(std::move(batches[shuffle[i].item<int64_t>()]));
  return out;
}

torch::Tensor pad_batch(const std::vector<torch::Tensor>& sequences, int64_t pad_id) {
  if (sequences.empty()) throw std::invalid_argument("pad_batch: no sequences");
  int64_t longest = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const auto& s = sequences[i];
    if (!s.defined() || s.dim() != 1 || s.scalar_type() != torch::kLong)
      throw std::invalid_argument("pad_batch: sequence " + std::to_string(i) +
                                  " is not a 1-D int64 tensor");
    longest = std::max(longest, s.size(0));
  }
  auto out = torch::full({static_cast<int64_t>(sequences.size()), longest}, pad_id, torch::kLong);
  for (size_t i = 0; i < sequences.size(); ++i)
    out[static_cast<int64_t>(i)].narrow(0, 0, sequences[i].size(0)).copy_(sequences[i]);
  return out;
}

int64_t padding_of(const std::vector<std::vector<int64_t>>& batches, const torch::Tensor& lengths) {
  auto len = lengths.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t* l = len.data_ptr<int64_t>();
  int64_t pad = 0;
  for (const auto& b : batches) {
    int64_t longest = 0, sum = 0;
    for (int64_t i : b) {
      longest = std::max(longest, l[i]);
      sum += l[i];
    }
    pad += longest * static_cast<int64_t>(b.size()) - sum;
  }
  return pad;
}

}  // namespace kit
