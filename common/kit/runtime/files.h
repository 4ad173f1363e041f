// kit/runtime/files.h — write_atomically(), fsync_dir(): files that appear under their name complete
// or not at all, even if the process or the node dies half-way.
#pragma once

#include <string>

#include <torch/serialize/output-archive.h>

namespace kit {

// Writes to <path>.tmp.<pid>, flushes it to disk, renames it to <path>, and flushes the folder.
// On any error the temporary file is removed, an existing <path> is left untouched, and a
// std::runtime_error says "<what>: cannot write <path>: <reason>".
void write_atomically(const std::string& path, const std::string& bytes, const char* what);
void write_atomically(const std::string& path, torch::serialize::OutputArchive& archive,
                      const char* what);

// Makes a rename or a new entry in `dir` durable.
void fsync_dir(const std::string& dir);

}  // namespace kit
