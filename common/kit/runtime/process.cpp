// kit/runtime/process.cpp — the process-wide settings of every kit program (see process.h): the
// terminate handler, the line a rank writes when it aborts, and glibc's malloc options.
#include "kit/runtime/process.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>  // mallopt
#endif

namespace kit {
namespace {

int g_rank = -1;                  // setup()'s rank (name_rank_on_abort), -1 before
std::atomic<bool> g_said{false};  // the terminate handler has written the abort line already

// "rank N", from setup() or, before it, from the launcher's variables; "" outside a job.
std::string rank_label() {
  if (g_rank >= 0) return "rank " + std::to_string(g_rank);
  const char* rank = std::getenv("RANK");
  if (rank == nullptr) rank = std::getenv("SLURM_PROCID");
  return rank ? std::string("rank ") + rank : "";
}

// The first line of the exception being handled (c10d's are long and multi-line).
std::string current_error() {
  std::string what = "unknown error";
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
  }
  return what.substr(0, what.find('\n'));
}

// Linux gives the main thread the process's id as its thread id.
bool on_main_thread() { return static_cast<pid_t>(syscall(SYS_gettid)) == getpid(); }

[[noreturn]] void end_with_one_line() {
  std::string what = current_error();
  const std::string rank = rank_label();
  // A kit error that names its rank already ("rank 0: all_reduce #4 ...") is not prefixed twice.
  if (!rank.empty() && what.rfind(rank + ": ", 0) == 0) what.erase(0, rank.size() + 2);
  std::fflush(stdout);
  if (on_main_thread()) {
    std::fprintf(stderr, "%s%serror: %s\n", rank.c_str(), rank.empty() ? "" : ": ", what.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
  // Another thread: c10d's NCCL watchdog (thread "pt_nccl_watchdg") rethrows a collective's
  // failure so that std::terminate aborts the process; an exit(1) here would hide that (no
  // SIGABRT for the launcher, Slurm or the core dump to report), so abort as c10d intends.
  char thread[16] = "?";
  pthread_getname_np(pthread_self(), thread, sizeof thread);
  std::fprintf(stderr, "kit: %s%saborted (SIGABRT): an exception escaped thread %s: %s\n",
               rank.c_str(), rank.empty() ? "" : " ", thread, what.c_str());
  std::fflush(stderr);
  g_said = true;
  std::abort();
}

// glibc's malloc gives a large block (from 128 KiB up; its threshold rises only as far as 32
// MiB) straight back to the kernel when it is freed, and returns free heap space above 128 KiB.
// A training step frees and reallocates the same activations and gradients every step, so every
// step pays page faults to get back the memory it has just given away: on the CPU, about a fifth
// of the benchmark model's step (tests/bench; PyTorch users get the same from MALLOC_* variables
// or another allocator). Keeping freed memory in the process costs only the RSS that the next
// step needs anyway. (Both calls also turn off glibc's dynamic threshold, which is why they go
// together: either one alone is slower.)
void keep_freed_memory() {
#if defined(__GLIBC__)
  const char* mode = std::getenv("KIT_MALLOC");
  if (mode != nullptr && std::string(mode) == "default") return;
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

// The line is made when setup() knows the rank, so that the handler only calls write(2), which is
// safe in a signal handler.
char g_abort_line[256];
size_t g_abort_len = 0;

void on_abort(int) {
  if (g_abort_len > 0 && !g_said) {
    ssize_t ignored = write(STDERR_FILENO, g_abort_line, g_abort_len);
    (void)ignored;
  }
  std::signal(SIGABRT, SIG_DFL);
  std::raise(SIGABRT);
}

}  // namespace

void prepare_process() {
  static const bool prepared = [] {
    std::set_terminate(end_with_one_line);
    keep_freed_memory();
    return true;
  }();
  (void)prepared;
}

void name_rank_on_abort(int rank) {
  g_rank = rank;
  const int n = std::snprintf(g_abort_line, sizeof g_abort_line,
                              "kit: rank %d aborted (SIGABRT): on GPUs usually NCCL's watchdog, "
                              "after a collective timed out or failed (its reason is in the lines "
                              "above; NCCL_DEBUG=INFO says more)\n", rank);
  g_abort_len = n > 0 ? std::min(static_cast<size_t>(n), sizeof g_abort_line - 1) : 0;
  std::signal(SIGABRT, on_abort);
}

}  // namespace kit
