// kit/data/xsum.h — the capstone's news articles and their one-sentence summaries (XSum), read
// from the one HDF5 file the login node prepared: tokens, lengths, and the tokenizer's pieces.
//
// The file (common/data/XSUM.md has its full layout) is written by `./kit data xsum prepare DIR`
// (common/data/xsum_data.py): a SentencePiece tokenizer trained on the training split, every split
// tokenised, DIR/xsum.h5. The trainer needs neither the network nor sentencepiece: the pieces in
// the file turn generated ids back into text (XsumVocab::decode). One file instead of 200,000
// small ones: a parallel file system serves one large file to many ranks far better than it
// serves many small files' metadata.
//
// Read with HDF5's C API (as kit/data/era5.h; without HDF5 this file's functions are not built).
// The lengths are read when the dataset opens; an example's tokens are read by get(), one
// hyperslab each, under the kit's HDF5 lock (kit/data/hdf5_handles.h), so get() may be called from
// the loader's worker threads.
//
//   kit::XsumDataset train(dir, "train", {.max_document_len = 512});
//   kit::XsumExample e = train.get(0);          // int64 ids: e.document [<= 512], e.summary
//   std::cout << train.report() << "\n";        // how many documents were truncated
//   std::cout << train.vocab().decode(e.summary) << "\n";
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "kit/data/data_error.h"  // DataError: a missing, partial or mismatched file, one line

namespace kit {

// The tokenizer's pieces: ids back to text without sentencepiece, as its decode() does.
class XsumVocab {
 public:
  XsumVocab() = default;
  // pieces[i] is id i's piece ("▁the": U+2581 marks a word's start); kinds as the file's
  // tokenizer/piece_kinds: 0 normal, 1 unknown, 2 control, 3 unused, 4 byte.
  XsumVocab(std::vector<std::string> pieces, std::vector<uint8_t> kinds, int64_t pad, int64_t unk,
            int64_t bos, int64_t eos);
  int64_t size() const { return static_cast<int64_t>(pieces_.size()); }
  const std::string& piece(int64_t id) const;  // std::out_of_range outside [0, size())
  int64_t pad() const { return pad_; }
  int64_t unk() const { return unk_; }
  int64_t bos() const { return bos_; }
  int64_t eos() const { return eos_; }
  // Ids (a 1-D integer tensor) to text: the pieces joined, U+2581 as a space, the first word's
  // space dropped; control ids (<pad>, <s>, </s>) give nothing, the unknown id " ⁇ ", a byte
  // piece <0xAB> its byte: sentencepiece's decode_ids(), checked in data.xsum_reader.
  std::string decode(const torch::Tensor& ids) const;

 private:
  std::vector<std::string> pieces_;
  std::vector<uint8_t> kinds_;
  int64_t pad_ = 0, unk_ = 1, bos_ = 2, eos_ = 3;
};

struct XsumOptions {
  // Longer documents (summaries) keep their first max tokens; how many were cut is counted
  // (truncated_documents(), report()). 0: no limit.
  int64_t max_document_len = 512;
  int64_t max_summary_len = 64;
  // The model's vocabulary: another size than the file's tokenizer is a DataError (a model built
  // for another tokenizer). 0: whatever the file has.
  int64_t vocab_size = 0;
  // A SentencePiece model file that must be the one the file was prepared with ("": DIR/xsum.model
  // when it exists beside the file). Another one is a DataError: its ids would mean other words.
  std::string tokenizer;
};

struct XsumExample {
  torch::Tensor document;  // int64 [document length, at most max_document_len], no <s> or </s>
  torch::Tensor summary;   // int64 [summary length, at most max_summary_len], no <s> or </s>
};

class XsumDataset {
 public:
  // path: DIR (reads DIR/xsum.h5) or the .h5 file itself; split: train, validation or test.
  // One DataError line for: no file (naming the login-node command), a file that HDF5 cannot open
  // (partial copy, damaged), another format or format version, datasets of the wrong type or
  // shape, offsets that do not add up (a partial write), a tokenizer that does not match, an
  // example with an empty summary or document.
  XsumDataset(const std::string& path, const std::string& split, XsumOptions options = {});

  size_t size() const { return document_lengths_.size(); }
  // Example i, truncated to the options' lengths; an id outside the vocabulary is a DataError
  // naming the example (a damaged file). std::out_of_range for i >= size(). Each read is told to
  // the checker's seam (kit/check/observe.h), as Era5Dataset's: which example, which thread.
  XsumExample get(size_t index) const;
  // Each example's lengths after truncation (int64 [size()]): for batching by length.
  torch::Tensor document_lengths() const;
  torch::Tensor summary_lengths() const;
  int64_t truncated_documents() const { return truncated_documents_; }
  int64_t truncated_summaries() const { return truncated_summaries_; }
  // One line: "xsum train: 204045 examples, 1234 documents truncated to 512 tokens, ...".
  std::string report() const;
  const XsumVocab& vocab() const { return vocab_; }
  const std::string& file() const { return file_; }
  const std::string& name() const { return split_; }
  const std::string& tokenizer_sha256() const { return tokenizer_sha256_; }

 private:
  struct Handles;  // the open file and its two token datasets (xsum.cpp)
  std::shared_ptr<Handles> open_;
  std::string file_, split_, tokenizer_sha256_;
  XsumOptions options_;
  XsumVocab vocab_;
  std::vector<int64_t> document_offsets_, summary_offsets_;
  std::vector<int64_t> document_lengths_, summary_lengths_;  // before truncation
  int64_t truncated_documents_ = 0, truncated_summaries_ = 0;
};

}  // namespace kit
