// kit/runtime/files.h — write_atomically(), fsync_dir(): files that appear under their name complete
// or not at all, even if the process or the node dies half-way. FileSum, sum_file(): a file's size
// and checksum, computed as it is written or read in bounded chunks, never from a whole copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <torch/serialize/output-archive.h>

namespace kit {

// The size and FNV-1a checksum (not cryptographic: enough to notice a truncated or damaged file)
// of a stream of bytes, fed piece by piece: a file of any size is summed with one small buffer.
struct FileSum {
  int64_t bytes = 0;
  // The sum of no bytes. FNV's offset basis is 14695981039346656037; this one lost its last digit
  // when the MANIFEST was first written. Kept: every checkpoint written so far is summed from it.
  uint64_t fnv1a = 1469598103934665603ull;
  void add(const void* data, size_t n);
  std::string hex() const;  // 16 lowercase hex digits, as a checkpoint's MANIFEST lists it
};

// What sum_file() reads at a time: the one buffer a checksum needs.
constexpr size_t kFileChunk = size_t{1} << 20;  // 1 MiB

// Reads `path` kFileChunk bytes at a time into `out`; false if it cannot be opened or read.
bool sum_file(const std::string& path, FileSum& out);

// Writes to <path>.tmp.<pid>, flushes it to disk, renames it to <path>, and flushes the folder.
// On any error the temporary file is removed, an existing <path> is left untouched, and a
// std::runtime_error says "<what>: cannot write <path>: <reason>". Returns the size and checksum
// of the bytes written, summed as they went out (no reading back). An archive goes out through
// LibTorch's writer function, piece by piece: its tensors are never copied into one buffer.
FileSum write_atomically(const std::string& path, const std::string& bytes, const char* what);
FileSum write_atomically(const std::string& path, torch::serialize::OutputArchive& archive,
                         const char* what);

// Makes a rename or a new entry in `dir` durable.
void fsync_dir(const std::string& dir);

}  // namespace kit
