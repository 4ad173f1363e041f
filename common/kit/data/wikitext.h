// WikiText-2 for the kit's language-model exercise: read the three token files, turn words into
// integer ids, and cut a split into (input, target) training examples.
//
// The files are "word level": somebody already tokenised Wikipedia text, so a token is simply
// whatever stands between two spaces. That keeps this file short and lets the exercise focus on
// distributed training, not on text processing.
//
//   kit::WikiText2 data = kit::load_wikitext2("/scratch/me/wikitext-2");
//   kit::LanguageModelDataset train(data.train, /*seq_len=*/35, data.file("train"));
//   auto [input, target] = train.get(0);   // two int64 tensors of 35 ids each
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kit/data/data_error.h"  // DataError, thrown for missing or damaged files

namespace kit {

// Word <-> id table. load_wikitext2() builds it from the training split only: a model must not
// learn anything from the words of its validation or test text, not even which words exist.
class Vocabulary {
 public:
  static constexpr const char* kUnk = "<unk>";  // rare words (already replaced in the raw files)
  static constexpr const char* kEos = "<eos>";  // end of a line, added by the loader

  // Adds `word` if it is new and returns its id. Ids are given in order of first appearance,
  // which makes them deterministic: the same file always gives the same table.
  int64_t add(const std::string& word);

  bool contains(const std::string& word) const { return ids_.count(word) != 0; }
  // The id of `word`, or unk() for a word the table does not know.
  int64_t id(const std::string& word) const;
  // The word for `id`; throws std::out_of_range for an id outside [0, size()).
  const std::string& word(int64_t id) const;
  int64_t size() const { return static_cast<int64_t>(words_.size()); }
  int64_t unk() const;
  int64_t eos() const;

  // Ids back to text, words separated by spaces (for printing what a model generates).
  std::string decode(const torch::Tensor& ids) const;

 private:
  std::vector<std::string> words_;                // id -> word
  std::unordered_map<std::string, int64_t> ids_;  // word -> id
};

// The three splits as 1-D int64 tensors of token ids (all with the same vocabulary).
struct WikiText2 {
  std::string dir;  // where the files were read from
  Vocabulary vocab;
  torch::Tensor train, valid, test;

  // "<dir>/wiki.<split>.tokens", for error messages and dataset names.
  std::string file(const std::string& split) const;
};

// Reads <dir>/wiki.{train,valid,test}.tokens.
//
// Tokenisation follows the PyTorch word_language_model example, so that token counts and
// perplexities can be compared with the ones students find elsewhere (the real training split
// gives 2,088,628 tokens): every line is split on (ASCII) whitespace and gets an <eos> appended,
// *including empty lines*. In WikiText the empty lines surround headings, so their lone <eos>
// is a "paragraph break" that the model learns to predict like any other token.
//
// Vocabulary: the words of the training split in order of first appearance. <unk> is an ordinary
// word of the raw files; if the training split happens not to contain it, it is added last so that
// validation/test words unseen in training still have an id to map to.
//
// Throws DataError when a file is missing, unreadable, empty, contains NUL bytes or is not UTF-8.
WikiText2 load_wikitext2(const std::string& dir);

// A split cut into non-overlapping windows of seq_len + 1 tokens. Example i is
//   input  = ids[w .. w + seq_len)      with w = i * (seq_len + 1)
//   target = ids[w + 1 .. w + seq_len]  (the input shifted by one: the next word at every position)
// Windows do not share tokens, so when a DistributedSampler hands different indices to different
// ranks, no two ranks ever train on the same text. The tokens after the last full window are
// dropped (fewer than seq_len + 1 of them).
class LanguageModelDataset {
 public:
  // `name` is used in messages (pass e.g. data.file("valid")). Throws DataError when the split is
  // shorter than one window, std::invalid_argument for seq_len < 1 or ids not 1-D int64.
  LanguageModelDataset(torch::Tensor ids, int64_t seq_len, std::string name);

  size_t size() const { return windows_; }
  // Views into the split (no copy); throws std::out_of_range for index >= size().
  std::pair<torch::Tensor, torch::Tensor> get(size_t index) const;
  int64_t seq_len() const { return seq_len_; }
  const std::string& name() const { return name_; }

 private:
  torch::Tensor ids_;
  int64_t seq_len_;
  std::string name_;
  size_t windows_;
};

}  // namespace kit
