// WikiText-2 loading: see wikitext.h for what the functions promise.
#include "kit/data/wikitext.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace fs = std::filesystem;

namespace kit {

// --- Vocabulary -----------------------------------------------------------------------------------

int64_t Vocabulary::add(const std::string& word) {
  auto found = ids_.find(word);
  if (found != ids_.end()) return found->second;
  const int64_t new_id = size();
  words_.push_back(word);
  ids_.emplace(word, new_id);
  return new_id;
}

int64_t Vocabulary::id(const std::string& word) const {
  auto found = ids_.find(word);
  return found != ids_.end() ? found->second : unk();
}

const std::string& Vocabulary::word(int64_t id) const {
  if (id < 0 || id >= size())
    throw std::out_of_range("Vocabulary: id " + std::to_string(id) + " is outside [0, " +
                            std::to_string(size()) + ")");
  return words_[static_cast<size_t>(id)];
}

int64_t Vocabulary::unk() const {
  auto found = ids_.find(kUnk);
  if (found == ids_.end()) throw DataError("Vocabulary: the table has no <unk> word");
  return found->second;
}

int64_t Vocabulary::eos() const {
  auto found = ids_.find(kEos);
  if (found == ids_.end()) throw DataError("Vocabulary: the table has no <eos> word");
  return found->second;
}

std::string Vocabulary::decode(const torch::Tensor& ids) const {
  // to(kInt64) also accepts the int32 / float ids a sampling loop might produce.
  torch::Tensor flat = ids.reshape({-1}).to(torch::kCPU).to(torch::kInt64).contiguous();
  const int64_t* data = flat.data_ptr<int64_t>();
  std::string text;
  for (int64_t i = 0; i < flat.numel(); ++i) {
    if (i > 0) text += ' ';
    text += word(data[i]);
  }
  return text;
}

// --- Reading and checking one file ----------------------------------------------------------------

namespace {

const char* const kWikiTextDownloadHint =
    "Compute nodes have no internet: run common/data/download_wikitext2.sh ";

// 1-based line number of byte `offset` (for messages that point into a file).
size_t line_of(const std::string& text, size_t offset) {
  return 1 + static_cast<size_t>(std::count(text.begin(), text.begin() + offset, '\n'));
}

// Offset of the first byte that breaks UTF-8, or npos when the whole text is valid. Checks the
// rules that matter for a text file: correct lead/continuation bytes, no overlong forms, no
// UTF-16 surrogates, nothing above U+10FFFF.
size_t first_invalid_utf8(const std::string& text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) { ++i; continue; }
    size_t len;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min = 0x10000; }
    else return i;  // a continuation byte without a lead byte, or 0xF8..0xFF
    if (i + len > n) return i;  // cut off at the end of the file
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string::npos;
}

// The whole file as bytes, after checking it is something the tokeniser can read. Every failure
// becomes a one-line DataError naming the file.
std::string read_checked(const fs::path& path) {
  std::error_code ec;
  const std::string where = path.string();
  if (!fs::exists(path, ec))
    throw DataError("WikiText-2 not found: " + where + " is missing. " + kWikiTextDownloadHint +
                    path.parent_path().string() + " on the login node first.");
  if (!fs::is_regular_file(path, ec))
    throw DataError(where + " is not a regular file (a directory or a device?)");

  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError("cannot open " + where + ": " + std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw DataError("cannot read " + where + ": " + std::strerror(errno));

  if (text.empty())
    throw DataError(where + " is empty (0 bytes): the download was probably interrupted; " +
                    "run common/data/download_wikitext2.sh again");
  if (size_t nul = text.find('\0'); nul != std::string::npos)
    throw DataError(where + " contains a NUL byte at line " + std::to_string(line_of(text, nul)) +
                    " (byte " + std::to_string(nul) + "): not a text file, or a damaged copy");
  if (size_t bad = first_invalid_utf8(text); bad != std::string::npos)
    throw DataError(where + " is not valid UTF-8 at line " + std::to_string(line_of(text, bad)) +
                    " (byte " + std::to_string(bad) + "): a damaged or re-encoded copy");
  // A failed download often saves the server's error page instead of the data.
  const size_t start = text.find_first_not_of(" \t\r\n");
  if (start != std::string::npos &&
      (text.compare(start, 9, "<!DOCTYPE") == 0 || text.compare(start, 9, "<!doctype") == 0 ||
       text.compare(start, 5, "<html") == 0 || text.compare(start, 5, "<HTML") == 0))
    throw DataError(where + " is an HTML page, not WikiText (a failed download?): " +
                    "run common/data/download_wikitext2.sh again");
  return text;
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

// Turns a file's text into ids: the words of each line, then <eos>. With `grow` (the training
// split) new words are added to the vocabulary; otherwise unknown words become <unk>.
torch::Tensor tokenize(const std::string& text, const std::string& where, Vocabulary& vocab,
                       bool grow) {
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 5);  // WikiText averages a little over 5 bytes per token
  size_t words = 0;
  std::string word;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();  // last line without a final newline
    for (size_t i = pos; i < end;) {
      while (i < end && is_space(text[i])) ++i;
      size_t j = i;
      while (j < end && !is_space(text[j])) ++j;
      if (j > i) {
        word.assign(text, i, j - i);
        ids.push_back(grow ? vocab.add(word) : vocab.id(word));
        ++words;
      }
      i = j;
    }
    ids.push_back(grow ? vocab.add(Vocabulary::kEos) : vocab.eos());
    pos = end + 1;
  }
  if (words == 0) throw DataError(where + " contains no words (only empty lines)");
  // from_blob only borrows the vector's memory; clone() gives the tensor its own copy.
  return torch::from_blob(ids.data(), {static_cast<int64_t>(ids.size())}, torch::kInt64).clone();
}

}  // namespace

// --- WikiText-2 -----------------------------------------------------------------------------------

std::string WikiText2::file(const std::string& split) const {
  return (fs::path(dir) / ("wiki." + split + ".tokens")).string();
}

WikiText2 load_wikitext2(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec))
    throw DataError("WikiText-2 not found: the directory " + dir + " does not exist. " +
                    kWikiTextDownloadHint + dir + " on the login node first.");
  if (!fs::is_directory(dir, ec))
    throw DataError("WikiText-2 not found: " + dir + " is not a directory");

  WikiText2 data;
  data.dir = dir;
  // Check all three files before the (slower) tokenising, so a missing test split is reported
  // at once rather than after reading the training text.
  const std::string train_text = read_checked(data.file("train"));
  const std::string valid_text = read_checked(data.file("valid"));
  const std::string test_text = read_checked(data.file("test"));

  data.train = tokenize(train_text, data.file("train"), data.vocab, /*grow=*/true);
  data.vocab.add(Vocabulary::kUnk);  // a no-op when the training text has <unk>, as WikiText does
  data.valid = tokenize(valid_text, data.file("valid"), data.vocab, /*grow=*/false);
  data.test = tokenize(test_text, data.file("test"), data.vocab, /*grow=*/false);
  return data;
}

// --- LanguageModelDataset -------------------------------------------------------------------------

LanguageModelDataset::LanguageModelDataset(torch::Tensor ids, int64_t seq_len, std::string name)
    : seq_len_(seq_len), name_(std::move(name)) {
  if (seq_len < 1)
    throw std::invalid_argument(name_ + ": seq_len must be at least 1, got " +
                                std::to_string(seq_len));
  if (!ids.defined() || ids.dim() != 1 || ids.scalar_type() != torch::kInt64)
    throw std::invalid_argument(name_ + ": token ids must be a 1-D int64 tensor");
  ids_ = ids.contiguous();
  windows_ = static_cast<size_t>(ids_.numel() / (seq_len + 1));
  if (windows_ == 0)
    throw DataError(name_ + " has " + std::to_string(ids_.numel()) +
                    " tokens, too few for one window of seq_len + 1 = " +
                    std::to_string(seq_len + 1) + " tokens: use a shorter sequence length");
}

std::pair<torch::Tensor, torch::Tensor> LanguageModelDataset::get(size_t index) const {
  if (index >= windows_)
    throw std::out_of_range(name_ + ": example " + std::to_string(index) +
                            " does not exist (the dataset has " + std::to_string(windows_) + ")");
  const int64_t start = static_cast<int64_t>(index) * (seq_len_ + 1);
  return {ids_.narrow(0, start, seq_len_), ids_.narrow(0, start + 1, seq_len_)};
}

}  // namespace kit
