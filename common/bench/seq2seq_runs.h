// common/bench/seq2seq_runs.h — a small summariser (kit::Seq2Seq) and padded batches of it, drawn
// from a seed: the model and data of the tests that train it on in-process ranks under ZeRO-3
// (tests/ddp/zero3_seq2seq_test.cpp) and tensor parallelism (tests/parallel/seq2seq_tp_test.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "kit/seq2seq/batches.h"  // pad_batch
#include "kit/seq2seq/model.h"    // Seq2SeqOptions

namespace kit_bench {

// 29 tokens (pad 0, bos 1, eos 2), width 16, 2 + 2 layers: seconds on a CPU.
inline kit::Seq2SeqOptions seq2seq_options(int64_t heads, double dropout = 0.0) {
  return {.vocab_size = 29, .d_model = 16, .heads = heads, .encoder_layers = 2,
          .decoder_layers = 2, .feedforward = 24, .dropout = dropout, .max_len = 16, .pad_id = 0,
          .bos_id = 1, .eos_id = 2, .seed = 5};
}

struct Seq2SeqBatch {
  torch::Tensor src, tgt_in, tgt_out;
};

// `rows` rows of different lengths (so that padding is masked in both inputs), drawn from `seed`.
inline Seq2SeqBatch seq2seq_batch(uint64_t seed, int64_t rows) {
  auto gen = at::detail::createCPUGenerator(seed);
  std::vector<torch::Tensor> src, in, out;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t s = 3 + (r * 5 + static_cast<int64_t>(seed)) % 9, t = 2 + (r * 3) % 5;
    src.push_back(torch::randint(3, 29, {s}, gen, torch::kLong));
    auto summary = torch::randint(3, 29, {t}, gen, torch::kLong);
    in.push_back(torch::cat({torch::ones({1}, torch::kLong), summary}));
    out.push_back(torch::cat({summary, torch::full({1}, 2, torch::kLong)}));
  }
  return {kit::pad_batch(src, 0), kit::pad_batch(in, 0), kit::pad_batch(out, 0)};
}

}  // namespace kit_bench
