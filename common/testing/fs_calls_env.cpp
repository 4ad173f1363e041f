// The file-system calls a checkpoint depends on, observed: with KIT_TEST_FS_LOG=<file> in the
// environment, every fsync() and rename() of the process (preloaded: LD_PRELOAD=
// <build>/lib/libkit_test_hooks.so) appends one line to <file> before it runs:
//
//   fsync <the path of the descriptor, from /proc/self/fd>
//   rename <old path> <new path>
//
// KIT_TEST_KILL_AT_RENAME=<name>: the process SIGKILLs itself when it is about to rename something
// to a path that ends in /<name>: a node failure after a checkpoint was written, before it got
// its name.
//
// Why: a write that is renamed into place before it reached the disk, or a rename whose folder
// was never flushed, looks perfect to every test that does not pull the power; only the order of
// these calls shows it (tests/faults: Checkpoints.SyncsFilesAndFoldersAroundTheRename).
// Without the variable both calls go straight to the C library's, unchanged.
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

void log_line(const std::string& line) {
  static const char* path = std::getenv("KIT_TEST_FS_LOG");
  if (path == nullptr || *path == '\0') return;
  // O_APPEND and one write per line: the ranks share the file without mixing their lines.
  int fd = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  const std::string text = line + "\n";
  (void)!::write(fd, text.data(), text.size());
  ::close(fd);
}

template <typename F>
F real(const char* name) {
  return reinterpret_cast<F>(::dlsym(RTLD_NEXT, name));
}

}  // namespace

extern "C" int fsync(int fd) {
  static auto next = real<int (*)(int)>("fsync");
  if (std::getenv("KIT_TEST_FS_LOG")) {
    char target[PATH_MAX] = {0};
    const std::string link = "/proc/self/fd/" + std::to_string(fd);
    const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
    log_line("fsync " + std::string(target, n > 0 ? static_cast<size_t>(n) : 0));
  }
  return next(fd);
}

extern "C" int rename(const char* from, const char* to) {
  static auto next = real<int (*)(const char*, const char*)>("rename");
  if (std::getenv("KIT_TEST_FS_LOG")) log_line(std::string("rename ") + from + " " + to);
  if (const char* name = std::getenv("KIT_TEST_KILL_AT_RENAME"); name && *name) {
    const std::string target(to), tail = std::string("/") + name;
    if (target.size() >= tail.size() && target.compare(target.size() - tail.size(), tail.size(), tail) == 0)
      std::raise(SIGKILL);
  }
  return next(from, to);
}
