// kit/check/trace.cpp — the run trace (see trace.h).
#include "kit/check/trace.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unistd.h>

namespace kit::trace {
namespace {

struct Sink {
  std::FILE* file = nullptr;
  std::string dir, name;  // the trace folder, and this process's name in it ("rank1")
  std::mutex mutex;
  Sink() {
    const char* d = std::getenv("KIT_TRACE_DIR");
    if (d == nullptr || *d == '\0') return;
    const char* rank = std::getenv("RANK");
    if (rank == nullptr) rank = std::getenv("SLURM_PROCID");
    dir = d;
    name = rank ? std::string("rank") + rank : "pid" + std::to_string(getpid());
    file = std::fopen((dir + "/" + name + ".trace").c_str(), "a");
    // Who this rank is to the operating system: the checker maps the pid in the temporary
    // names of the files the run wrote (kit/runtime/files.h) back to a rank.
    if (file) std::fprintf(file, "process pid=%d\n", static_cast<int>(getpid()));
  }
};

Sink& sink() {
  static Sink s;  // opened on first use, never closed: records may come from atexit handlers
  return s;
}

}  // namespace

bool enabled() { return sink().file != nullptr; }

void record(const std::string& event, const std::string& fields) {
  Sink& s = sink();
  if (s.file == nullptr) return;
  std::lock_guard<std::mutex> lock(s.mutex);
  std::fprintf(s.file, "%s %s\n", event.c_str(), fields.c_str());
  std::fflush(s.file);
}

std::string file(const std::string& stem, const std::string& ext) {
  Sink& s = sink();
  if (s.file == nullptr) return "";
  return s.dir + "/" + stem + "-" + s.name + "." + ext;
}

}  // namespace kit::trace
