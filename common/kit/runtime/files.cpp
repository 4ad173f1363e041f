// kit/runtime/files.cpp — atomic file writes (see files.h).
#include "kit/runtime/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>

namespace kit {
namespace {

using Sink = std::function<void(const void*, size_t)>;

FileSum write_with(const std::string& path, const char* what, const std::function<void(const Sink&)>& produce) {
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  auto fail = [&](int err) {
    std::remove(tmp.c_str());
    throw std::runtime_error(std::string(what) + ": cannot write " + path + ": " + std::strerror(err));
  };
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(errno);
  // The first write error is remembered and reported after cleaning up, never thrown from inside
  // the producer: LibTorch's archive writer, after a failed write, throws again from its
  // destructor, which ends the process via std::terminate (seen with a full disk).
  int write_error = 0;
  FileSum sum;  // of the bytes as they go out: a checkpoint's MANIFEST never reads them back
  Sink sink = [&](const void* data, size_t n) {
    sum.add(data, n);
    const char* p = static_cast<const char*>(data);
    for (size_t left = n; left > 0 && write_error == 0;) {
      ssize_t done = ::write(fd, p, left);
      if (done < 0 && errno == EINTR) continue;
      if (done <= 0) write_error = done < 0 ? errno : EIO;
      else p += done, left -= static_cast<size_t>(done);
    }
  };
  try {
    produce(sink);
  } catch (...) {
    ::close(fd);
    std::remove(tmp.c_str());
    throw;
  }
  // fsync before rename: otherwise a node crash can leave the new name pointing at an empty file.
  if (write_error == 0 && ::fsync(fd) != 0) write_error = errno;
  if (::close(fd) != 0 && write_error == 0) write_error = errno;
  if (write_error != 0) fail(write_error);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail(errno);
  fsync_dir(path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/')));
  return sum;
}

}  // namespace

void FileSum::add(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) fnv1a = (fnv1a ^ p[i]) * 1099511628211ull;
  bytes += static_cast<int64_t>(n);
}

std::string FileSum::hex() const {
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(fnv1a));
  return out;
}

bool sum_file(const std::string& path, FileSum& out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  // A small file (an RNG state) needs no whole chunk.
  struct stat st {};
  const size_t chunk = ::fstat(fd, &st) == 0 && st.st_size > 0 && static_cast<size_t>(st.st_size) < kFileChunk
                           ? static_cast<size_t>(st.st_size) : kFileChunk;
  std::unique_ptr<char[]> buffer(new char[chunk]);
  bool ok = true;
  for (;;) {
    ssize_t n = ::read(fd, buffer.get(), chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = n == 0;
      break;
    }
    out.add(buffer.get(), static_cast<size_t>(n));
  }
  ::close(fd);
  return ok;
}

FileSum write_atomically(const std::string& path, const std::string& bytes, const char* what) {
  return write_with(path, what, [&](const Sink& sink) { sink(bytes.data(), bytes.size()); });
}

FileSum write_atomically(const std::string& path, torch::serialize::OutputArchive& archive,
                         const char* what) {
  // LibTorch's writer function gets the archive record by record, each tensor from its own
  // storage: the file is never assembled in memory (a GPU tensor is copied to the host alone).
  return write_with(path, what, [&](const Sink& sink) {
    archive.save_to([&](const void* data, size_t n) -> size_t {
      sink(data, n);
      return n;
    });
  });
}

void fsync_dir(const std::string& dir) {
  if (int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace kit
