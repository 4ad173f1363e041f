// tests/support/tiny_lm.h — tiny_lm(): the smallest exercise-01 language model that still has
// every kind of layer, for tests that train it step by step against a reference (tests/ddp,
// tests/gpu). Dropout is off: no randomness in forward, so ranks and references compute the same.
#pragma once

#include "kit/models/transformer_lm.h"

namespace kit_test {

inline kit::TransformerLMOptions tiny_lm(int64_t vocab, int64_t seq_len) {
  kit::TransformerLMOptions o;
  o.vocab_size = vocab;
  o.d_model = 16;
  o.heads = 2;
  o.layers = 1;
  o.feedforward = 32;
  o.dropout = 0.0;
  o.max_len = seq_len;
  return o;
}

}  // namespace kit_test
