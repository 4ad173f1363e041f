// kit/data/xsum.cpp — the prepared XSum file, read with HDF5's C API (see xsum.h). Built only
// where CMake found HDF5 (common/CMakeLists.txt).
#include "kit/data/xsum.h"

#include <hdf5.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "kit/check/observe.h"        // the examples read, and on which thread
#include "kit/data/hdf5_handles.h"    // hdf5_lock(), Hid
#include "kit/data/loader_workers.h"  // loader_worker(): which worker thread reads

namespace kit {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kFormatVersion = 1;  // common/data/xsum_data.py's FORMAT_VERSION

[[noreturn]] void fail(const std::string& what) { throw DataError("xsum: " + what); }

std::string prepare_hint(const std::string& dir) {
  return "prepare it on the login node: ./kit data xsum " + dir +
         " (offline: ./kit data xsum generate " + dir + " && ./kit data xsum prepare " + dir + ")";
}

// The rest of this namespace runs under hdf5_lock().
bool exists(hid_t file, const std::string& path) {
  // H5Lexists on "a/b" needs "a" to exist: ask level by level.
  std::string prefix;
  for (size_t start = 0; start <= path.size();) {
    const size_t slash = std::min(path.find('/', start), path.size());
    prefix = path.substr(0, slash);
    if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    start = slash + 1;
  }
  return true;
}

int64_t int_attr(hid_t file, const std::string& where, const char* name) {
  if (H5Aexists(file, name) <= 0) fail(where + " has no attribute " + name);
  Hid attr(H5Aopen(file, name, H5P_DEFAULT), H5Aclose);
  Hid type(H5Aget_type(attr.id), H5Tclose);
  int64_t value = 0;
  if (H5Tget_class(type.id) != H5T_INTEGER ||
      H5Aread(attr.id, H5T_NATIVE_INT64, &value) < 0)
    fail(where + ": attribute " + name + " is not an integer");
  return value;
}

std::string string_attr(hid_t file, const std::string& where, const char* name) {
  if (H5Aexists(file, name) <= 0) fail(where + " has no attribute " + name);
  Hid attr(H5Aopen(file, name, H5P_DEFAULT), H5Aclose);
  Hid type(H5Aget_type(attr.id), H5Tclose);
  if (H5Tget_class(type.id) != H5T_STRING) fail(where + ": attribute " + name + " is not a string");
  if (H5Tis_variable_str(type.id) > 0) {  // h5py's str
    char* text = nullptr;
    Hid memory(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(memory.id, H5T_VARIABLE);
    if (H5Aread(attr.id, memory.id, &text) < 0 || text == nullptr)
      fail(where + ": cannot read attribute " + name);
    std::string value(text);
    H5free_memory(text);
    return value;
  }
  std::string value(H5Tget_size(type.id), '\0');  // h5py's numpy.bytes_: fixed length
  if (H5Aread(attr.id, type.id, value.data()) < 0) fail(where + ": cannot read attribute " + name);
  return value.substr(0, value.find('\0'));
}

// The length of the 1-D integer dataset `path`, or a DataError naming it.
int64_t length_of(hid_t dataset, const std::string& where) {
  Hid type(H5Dget_type(dataset), H5Tclose);
  Hid space(H5Dget_space(dataset), H5Sclose);
  if (type.id < 0 || space.id < 0) fail("cannot read " + where);
  if (H5Tget_class(type.id) != H5T_INTEGER) fail(where + " does not hold integers");
  if (H5Sget_simple_extent_ndims(space.id) != 1)
    fail(where + " has " + std::to_string(H5Sget_simple_extent_ndims(space.id)) +
         " dimensions, 1 expected");
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.id, &n, nullptr);
  return static_cast<int64_t>(n);
}

Hid open_dataset(hid_t file, const std::string& path, const std::string& where) {
  if (!exists(file, path)) fail(where + " has no dataset " + path + " (the layout: common/data/XSUM.md)");
  Hid d(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose);
  if (d.id < 0) fail("cannot open " + path + " of " + where);
  return d;
}

template <typename T>
std::vector<T> read_all(hid_t file, const std::string& path, const std::string& where,
                        hid_t memtype) {
  Hid d = open_dataset(file, path, where);
  std::vector<T> values(static_cast<size_t>(length_of(d.id, where + ":" + path)));
  if (!values.empty() &&
      H5Dread(d.id, memtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0)
    fail("cannot read " + path + " of " + where + " (a partial or damaged file)");
  return values;
}

std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

// --- XsumVocab ----------------------------------------------------------------------------------
XsumVocab::XsumVocab(std::vector<std::string> pieces, std::vector<uint8_t> kinds, int64_t pad,
                     int64_t unk, int64_t bos, int64_t eos)
    : pieces_(std::move(pieces)), kinds_(std::move(kinds)), pad_(pad), unk_(unk), bos_(bos),
      eos_(eos) {
  if (kinds_.size() != pieces_.size())
    throw std::invalid_argument("XsumVocab: " + std::to_string(pieces_.size()) + " pieces but " +
                                std::to_string(kinds_.size()) + " kinds");
}

const std::string& XsumVocab::piece(int64_t id) const {
  if (id < 0 || id >= size())
    throw std::out_of_range("XsumVocab: id " + std::to_string(id) + " of " +
                            std::to_string(size()));
  return pieces_[static_cast<size_t>(id)];
}

std::string XsumVocab::decode(const torch::Tensor& ids) const {
  static const std::string kSpace = "\xE2\x96\x81";  // U+2581, sentencepiece's word start
  const torch::Tensor flat = ids.to(torch::kCPU, torch::kLong).contiguous().view(-1);
  std::string text;
  const int64_t* p = flat.data_ptr<int64_t>();
  for (int64_t i = 0; i < flat.numel(); ++i) {
    const std::string& s = piece(p[i]);
    switch (kinds_[static_cast<size_t>(p[i])]) {
      case 2: break;                                    // <pad>, <s>, </s>: no text
      case 1: text += " \xE2\x81\x87 "; break;          // sentencepiece's " ⁇ " for the unknown
      case 4: text += static_cast<char>(std::stoi(s.substr(3, 2), nullptr, 16)); break;  // <0xAB>
      default: text += s;
    }
  }
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, kSpace.size(), kSpace) == 0) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += text[i++];
    }
  }
  if (!out.empty() && out[0] == ' ' && text.compare(0, kSpace.size(), kSpace) == 0)
    out.erase(0, 1);  // the space sentencepiece put before the first word
  return out;
}

// --- XsumDataset --------------------------------------------------------------------------------
struct XsumDataset::Handles {
  Hid file{-1, H5Fclose}, documents{-1, H5Dclose}, summaries{-1, H5Dclose};
};

XsumDataset::XsumDataset(const std::string& path, const std::string& split, XsumOptions options)
    : open_(std::make_shared<Handles>()), split_(split), options_(std::move(options)) {
  std::error_code ec;
  // A folder, or a path that is not there and does not name an .h5 file: the folder the login
  // node prepares (DIR/xsum.h5), so that the hint below names DIR itself, not its parent.
  const bool is_dir = fs::is_directory(path, ec) ||
                      (!fs::exists(path, ec) && fs::path(path).extension() != ".h5");
  file_ = is_dir ? (fs::path(path) / "xsum.h5").string() : path;
  const std::string dir = fs::path(file_).parent_path().string();
  if (!fs::exists(file_, ec)) fail("no " + file_ + ": " + prepare_hint(dir.empty() ? "." : dir));
  if (split != "train" && split != "validation" && split != "test")
    fail("no split '" + split + "' (train, validation or test)");
  if (options_.max_document_len < 0 || options_.max_summary_len < 0)
    fail("max_document_len and max_summary_len must be 0 (no limit) or more");
  const std::string again = "run ./kit data xsum prepare " + dir + " again";

  std::lock_guard<std::mutex> lock(hdf5_lock());
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors as one line of ours, not HDF5's stack
  open_->file.id = H5Fopen(file_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (open_->file.id < 0)
    fail("cannot open " + file_ + " as an HDF5 file (a partial copy or a damaged file: " + again +
         "; on a Lustre file system HDF5_USE_FILE_LOCKING=FALSE may be needed)");
  const hid_t f = open_->file.id;
  if (H5Aexists(f, "format") <= 0 || string_attr(f, file_, "format") != "kit-xsum")
    fail(file_ + " is not a prepared XSum file (no attribute format = kit-xsum): " + again);
  const int64_t version = int_attr(f, file_, "format_version");
  if (version != kFormatVersion)
    fail(file_ + " has format version " + std::to_string(version) + ", this kit reads version " +
         std::to_string(kFormatVersion) + ": " + again);
  tokenizer_sha256_ = string_attr(f, file_, "tokenizer_sha256");

  // The tokenizer: pieces, and the model file it was prepared with.
  const int64_t vocab_size = int_attr(f, file_, "vocab_size");
  const auto offsets = read_all<int64_t>(f, "tokenizer/piece_offsets", file_, H5T_NATIVE_INT64);
  // Bytes as uint8: HDF5 would clip bytes above 127 when converting to a signed char.
  const auto bytes = read_all<uint8_t>(f, "tokenizer/pieces", file_, H5T_NATIVE_UINT8);
  const auto kinds = read_all<uint8_t>(f, "tokenizer/piece_kinds", file_, H5T_NATIVE_UINT8);
  if (static_cast<int64_t>(offsets.size()) != vocab_size + 1 ||
      static_cast<int64_t>(kinds.size()) != vocab_size || offsets.front() != 0 ||
      offsets.back() != static_cast<int64_t>(bytes.size()) ||
      !std::is_sorted(offsets.begin(), offsets.end()))
    fail(file_ + ": the tokenizer's pieces do not add up to vocab_size " +
         std::to_string(vocab_size) + " (a partial or damaged file): " + again);
  std::vector<std::string> pieces;
  for (int64_t i = 0; i < vocab_size; ++i)
    pieces.emplace_back(bytes.begin() + offsets[i], bytes.begin() + offsets[i + 1]);
  vocab_ = XsumVocab(std::move(pieces), kinds, int_attr(f, file_, "pad_id"),
                     int_attr(f, file_, "unk_id"), int_attr(f, file_, "bos_id"),
                     int_attr(f, file_, "eos_id"));
  if (options_.vocab_size > 0 && options_.vocab_size != vocab_size)
    fail(file_ + " was prepared with a tokenizer of " + std::to_string(vocab_size) +
         " pieces, the model has a vocabulary of " + std::to_string(options_.vocab_size) +
         ": build the model with the file's vocab_size, or prepare the file with that tokenizer");
  const std::string model_file =
      options_.tokenizer.empty() ? (fs::path(dir) / "xsum.model").string() : options_.tokenizer;
  if (!options_.tokenizer.empty() || fs::exists(model_file, ec)) {
    if (!fs::exists(model_file, ec)) fail("no tokenizer " + model_file);
    const auto model = read_all<uint8_t>(f, "tokenizer/model", file_, H5T_NATIVE_UINT8);
    if (read_file_bytes(model_file) != std::string(model.begin(), model.end()))
      fail(file_ + " was prepared with another tokenizer than " + model_file + " (the file's: "
           "SHA-256 " + tokenizer_sha256_.substr(0, 16) + "...): its ids would mean other "
           "pieces; " + again);
  }

  // The split: lengths and offsets in memory, the tokens stay on disk until get().
  const std::string where = file_ + ":" + split;
  if (!exists(f, split)) fail(file_ + " has no group " + split + " (a partial file): " + again);
  for (const char* part : {"document", "summary"}) {
    const std::string name = part;
    auto lengths = read_all<int64_t>(f, split + "/" + name + "_lengths", file_, H5T_NATIVE_INT64);
    auto offs = read_all<int64_t>(f, split + "/" + name + "_offsets", file_, H5T_NATIVE_INT64);
    Hid tokens = open_dataset(f, split + "/" + name + "_tokens", file_);
    const int64_t total = length_of(tokens.id, where + "/" + name + "_tokens");
    if (offs.size() != lengths.size() + 1 || offs.front() != 0 || offs.back() != total)
      fail(where + ": " + name + "_offsets (" + std::to_string(offs.size()) + ", last " +
           std::to_string(offs.empty() ? 0 : offs.back()) + ") do not match " + name + "_lengths (" +
           std::to_string(lengths.size()) + ") and " + name + "_tokens (" +
           std::to_string(total) + "): a partial or damaged file; " + again);
    for (size_t i = 0; i < lengths.size(); ++i) {
      if (offs[i + 1] - offs[i] != lengths[i])
        fail(where + ": example " + std::to_string(i) + "'s " + name + " length " +
             std::to_string(lengths[i]) + " does not match its offsets: a damaged file; " + again);
      if (lengths[i] == 0)
        fail(where + ": example " + std::to_string(i) + " has an empty " + name +
             " (nothing to learn from; xsum_data.py prepare skips such examples): " + again);
    }
    if (name == "document") {
      document_lengths_ = std::move(lengths);
      document_offsets_ = std::move(offs);
      open_->documents = std::move(tokens);
    } else {
      summary_lengths_ = std::move(lengths);
      summary_offsets_ = std::move(offs);
      open_->summaries = std::move(tokens);
    }
  }
  if (document_lengths_.size() != summary_lengths_.size())
    fail(where + ": " + std::to_string(document_lengths_.size()) + " documents but " +
         std::to_string(summary_lengths_.size()) + " summaries: " + again);
  if (document_lengths_.empty()) fail(where + " holds no example: " + again);
  auto over = [](const std::vector<int64_t>& lengths, int64_t max) {
    return max == 0 ? 0 : std::count_if(lengths.begin(), lengths.end(),
                                        [max](int64_t n) { return n > max; });
  };
  truncated_documents_ = over(document_lengths_, options_.max_document_len);
  truncated_summaries_ = over(summary_lengths_, options_.max_summary_len);
}

XsumExample XsumDataset::get(size_t index) const {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  if (index >= size())
    throw std::out_of_range("xsum: example " + std::to_string(index) + " of " +
                            std::to_string(size()) + " (" + split_ + ")");
  auto read = [&](hid_t dataset, const std::vector<int64_t>& offsets, int64_t max,
                  const char* what) {
    int64_t n = offsets[index + 1] - offsets[index];
    if (max > 0) n = std::min(n, max);
    torch::Tensor ids = torch::empty({n}, torch::kLong);
    hsize_t begin[1] = {static_cast<hsize_t>(offsets[index])}, count[1] = {static_cast<hsize_t>(n)};
    herr_t ok;
    {
      std::lock_guard<std::mutex> lock(hdf5_lock());
      Hid space(H5Dget_space(dataset), H5Sclose);
      Hid memory(H5Screate_simple(1, count, nullptr), H5Sclose);
      ok = H5Sselect_hyperslab(space.id, H5S_SELECT_SET, begin, nullptr, count, nullptr);
      if (ok >= 0)
        ok = H5Dread(dataset, H5T_NATIVE_INT64, memory.id, space.id, H5P_DEFAULT,
                     ids.data_ptr<int64_t>());
    }
    if (ok < 0)
      fail("cannot read the " + std::string(what) + " of example " + std::to_string(index) +
           " of " + file_ + ":" + split_ + " (a damaged file)");
    if (n > 0 && (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= vocab_.size()))
      fail(file_ + ":" + split_ + ": the " + what + " of example " + std::to_string(index) +
           " holds an id outside the tokenizer's " + std::to_string(vocab_.size()) +
           " pieces (a damaged file)");
    return ids;
  };
  XsumExample e{read(open_->documents.id, document_offsets_, options_.max_document_len, "document"),
                read(open_->summaries.id, summary_offsets_, options_.max_summary_len, "summary")};
  const auto ns = [](clock::time_point p) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(p.time_since_epoch()).count();
  };
  observe::sample(split_, index, loader_worker(), ns(start), ns(clock::now()));
  return e;
}

namespace {
torch::Tensor clamped(const std::vector<int64_t>& lengths, int64_t max) {
  torch::Tensor t = torch::tensor(lengths, torch::kLong);
  return max > 0 ? t.clamp_max(max) : t;
}
}  // namespace

torch::Tensor XsumDataset::document_lengths() const {
  return clamped(document_lengths_, options_.max_document_len);
}

torch::Tensor XsumDataset::summary_lengths() const {
  return clamped(summary_lengths_, options_.max_summary_len);
}

std::string XsumDataset::report() const {
  auto limit = [](int64_t n) { return n > 0 ? std::to_string(n) + " tokens" : "no limit"; };
  return "xsum " + split_ + ": " + std::to_string(size()) + " examples, " +
         std::to_string(truncated_documents_) + " documents truncated to " +
         limit(options_.max_document_len) + ", " + std::to_string(truncated_summaries_) +
         " summaries truncated to " + limit(options_.max_summary_len);
}

}  // namespace kit
