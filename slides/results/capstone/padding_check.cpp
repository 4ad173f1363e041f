// Cross-check of slides/results/capstone/padding.py: the kit's own length_buckets and padding_of.
#include <cstdio>
#include <random>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>
#include "kit/data/xsum.h"
#include "kit/seq2seq/batches.h"
int main(int argc, char** argv) {
  kit::XsumDataset train(argv[1], "train", {.max_document_len = 0, .max_summary_len = 0});
  auto lengths = train.document_lengths();
  const int64_t n = lengths.size(0);
  for (int64_t bs : {16, 32, 64}) {
    int64_t bucketed = 0, random = 0;
    for (int e = 0; e < 10; ++e) {
      bucketed += kit::padding_of(kit::length_buckets(lengths, bs, 42 + e), lengths);
      auto gen = at::make_generator<at::CPUGeneratorImpl>(42 + e);
      auto perm = torch::randperm(n, gen, torch::kLong);
      std::vector<std::vector<int64_t>> batches;
      for (int64_t i = 0; i < n; i += bs) {
        std::vector<int64_t> b;
        for (int64_t j = i; j < std::min(n, i + bs); ++j) b.push_back(perm[j].item<int64_t>());
        batches.push_back(b);
      }
      random += kit::padding_of(batches, lengths);
    }
    std::printf("batch %ld: random %.1f, buckets %.1f per epoch\n", bs, random / 10.0, bucketed / 10.0);
  }
}
