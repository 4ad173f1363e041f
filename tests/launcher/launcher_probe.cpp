// launcher_probe — a tiny stand-in for a trainer, run under ddprun by the launcher tests.
//
// It executes a list of commands from its arguments, left to right. `rank R` in front of a
// command makes that one command run on rank R only, so one command line can give different
// ranks different behaviour:
//
//   launcher_probe pidfile /tmp/x  rank 1 exit 3  sleep 30
//     -> every rank writes /tmp/x/rank<R>.pid, rank 1 then exits with 3, the others sleep.
//
// Commands:
//   say TEXT | say-err TEXT | partial TEXT   print TEXT + "\n" to stdout / stderr, or TEXT
//                                            without a newline to stdout
//   print-env                    print KEY=VALUE for the launcher variables (see below)
//   spam N                       print N lines "<rank>:<i>:xxxx...x" to stdout
//   pidfile DIR                  write getpid() to DIR/rank<R>.pid (written atomically)
//   await-pidfiles DIR N         wait until DIR holds N rank*.pid files (10 s, else exit 90)
//   record-signals DIR           append the name of each SIGINT/SIGTERM/SIGHUP/SIGUSR1/SIGUSR2
//                                received to DIR/rank<R>.signals; after SIGINT/SIGTERM exit 0
//   ignore SIGNUM | default SIGNUM   ignore a signal / restore its default action
//   await-signals N              wait until N signals were recorded (10 s, else exit 91)
//   sleep SECONDS                sleep, carrying on after a signal interrupts the sleep
//   spawn-sleeper DIR SECONDS    start a background child that inherits stdout/stderr and
//                                sleeps; its pid goes to DIR/rank<R>.child.pid
//   bind-master-port             listen on MASTER_ADDR:MASTER_PORT; exit 5 if that fails
//   kill-self SIGNUM             raise a signal
//   abort TEXT                   print TEXT to stderr, then std::abort() (as c10d's NCCL
//                                watchdog ends a rank whose collective timed out)
//   exit-on SIGNUM CODE          from now on, that signal makes the rank exit with CODE (a
//                                trainer whose collective fails because a peer died)
//   exit CODE                    exit with CODE
//
// Plain C++ and POSIX, no LibTorch: the launcher tests must not depend on the rest of the kit.

#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <string>
#include <thread>

extern char** environ;

namespace {

int g_rank = -1;
int g_signal_fd = -1;
volatile sig_atomic_t g_signals_seen = 0;

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "launcher_probe: %s\n", message.c_str());
  std::exit(99);
}

std::string rank_file(const std::string& dir, const char* suffix) {
  return dir + "/rank" + std::to_string(g_rank) + suffix;
}

void write_file_atomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) die("cannot write " + tmp);
  std::fputs(text.c_str(), f);
  std::fclose(f);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) die("cannot rename " + tmp);
}

double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

void sleep_for(double seconds) {
  // std::this_thread::sleep_for resumes after EINTR on its own; loop on the clock anyway so a
  // signal can never shorten the sleep.
  double end = now() + seconds;
  while (now() < end) std::this_thread::sleep_for(std::chrono::duration<double>(end - now()));
}

const char* name_of(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT\n";
    case SIGTERM: return "SIGTERM\n";
    case SIGHUP: return "SIGHUP\n";
    case SIGUSR1: return "SIGUSR1\n";
    case SIGUSR2: return "SIGUSR2\n";
    default: return "OTHER\n";
  }
}

extern "C" void on_signal(int sig) {
  // Only async-signal-safe calls here: write() and _exit().
  const char* name = name_of(sig);
  if (g_signal_fd >= 0) {
    ssize_t ignored = ::write(g_signal_fd, name, std::strlen(name));
    (void)ignored;
  }
  g_signals_seen = g_signals_seen + 1;
  if (sig == SIGINT || sig == SIGTERM) _exit(0);  // a trainer that shuts down cleanly
}

int count_pidfiles(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  int n = 0;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    bool rank_pid = name.rfind("rank", 0) == 0 && name.size() > 8 &&
                    name.compare(name.size() - 4, 4, ".pid") == 0;
    if (rank_pid && name.find(".child.") == std::string::npos)
      ++n;
  }
  ::closedir(d);
  return n;
}

void print_env() {
  for (const char* key : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                          "MASTER_PORT", "GROUP_RANK", "SLURM_PROCID", "DDPRUN_TEST_MARKER"}) {
    const char* v = std::getenv(key);
    std::printf("%s=%s\n", key, v ? v : "<unset>");
  }
  // How many times RANK appears in environ: a launcher that appends instead of replacing an
  // inherited RANK would leave two, and getenv() would pick an arbitrary one.
  int rank_entries = 0;
  for (char** e = environ; *e != nullptr; ++e) rank_entries += std::strncmp(*e, "RANK=", 5) == 0;
  std::printf("RANK_ENTRIES=%d\n", rank_entries);
  std::printf("PID=%d\n", static_cast<int>(::getpid()));
  std::fflush(stdout);
}

int bind_master_port() {
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  if (addr == nullptr || port == nullptr) return 5;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (::getaddrinfo(addr, port, &hints, &list) != 0) return 5;
  int fd = ::socket(list->ai_family, list->ai_socktype, list->ai_protocol);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  bool ok = fd >= 0 && ::bind(fd, list->ai_addr, list->ai_addrlen) == 0 && ::listen(fd, 4) == 0;
  ::freeaddrinfo(list);
  if (!ok) {
    std::fprintf(stderr, "launcher_probe: cannot listen on %s:%s: %s\n", addr, port,
                 std::strerror(errno));
    return 5;
  }
  std::printf("LISTENING=%s:%s\n", addr, port);
  std::fflush(stdout);
  ::close(fd);
  return 0;
}

}  // namespace

volatile sig_atomic_t g_exit_code = 0;  // exit-on's code, read by its signal handler

int main(int argc, char** argv) {
  const char* rank_env = std::getenv("RANK");
  g_rank = rank_env ? std::atoi(rank_env) : 0;

  int i = 1;
  auto next = [&](const char* what) -> std::string {
    if (i >= argc) die(std::string("missing argument for ") + what);
    return argv[i++];
  };
  while (i < argc) {
    std::string cmd = next("command");
    bool skip = false;
    if (cmd == "rank") {
      skip = std::atoi(next("rank").c_str()) != g_rank;
      cmd = next("command");
    }
    // Read this command's arguments even when skipping it, to stay in step.
    if (cmd == "say" || cmd == "say-err" || cmd == "partial") {
      std::string text = next("text");
      if (skip) continue;
      if (cmd == "partial") {
        std::fputs(text.c_str(), stdout);
        std::fflush(stdout);
      } else {
        std::FILE* f = cmd == "say" ? stdout : stderr;
        std::fprintf(f, "%s\n", text.c_str());
        std::fflush(f);
      }
    } else if (cmd == "print-env") {
      if (!skip) print_env();
    } else if (cmd == "spam") {
      long n = std::atol(next("count").c_str());
      if (skip) continue;
      std::string payload(100, 'x');
      for (long k = 0; k < n; ++k) std::printf("%d:%ld:%s\n", g_rank, k, payload.c_str());
      std::fflush(stdout);
    } else if (cmd == "pidfile") {
      std::string dir = next("dir");
      if (!skip) write_file_atomically(rank_file(dir, ".pid"), std::to_string(::getpid()) + "\n");
    } else if (cmd == "await-pidfiles") {
      std::string dir = next("dir");
      int n = std::atoi(next("count").c_str());
      if (skip) continue;
      double end = now() + 10;
      while (count_pidfiles(dir) < n) {
        if (now() > end) die("timed out waiting for pid files");
        sleep_for(0.01);
      }
    } else if (cmd == "record-signals") {
      std::string dir = next("dir");
      if (skip) continue;
      std::string path = rank_file(dir, ".signals");
      g_signal_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (g_signal_fd < 0) die("cannot open " + path);
      struct sigaction sa {};
      sa.sa_handler = on_signal;
      sigemptyset(&sa.sa_mask);
      for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) ::sigaction(sig, &sa, nullptr);
    } else if (cmd == "ignore") {
      int sig = std::atoi(next("signal").c_str());
      if (!skip) ::signal(sig, SIG_IGN);
    } else if (cmd == "default") {
      int sig = std::atoi(next("signal").c_str());
      if (!skip) ::signal(sig, SIG_DFL);
    } else if (cmd == "await-signals") {
      int n = std::atoi(next("count").c_str());
      if (skip) continue;
      double end = now() + 10;
      while (g_signals_seen < n) {
        if (now() > end) {
          std::fprintf(stderr, "launcher_probe: rank %d saw %d of %d signals\n", g_rank,
                       static_cast<int>(g_signals_seen), n);
          return 91;
        }
        sleep_for(0.01);
      }
    } else if (cmd == "sleep") {
      double s = std::atof(next("seconds").c_str());
      if (!skip) sleep_for(s);
    } else if (cmd == "spawn-sleeper") {
      std::string dir = next("dir");
      double s = std::atof(next("seconds").c_str());
      if (skip) continue;
      pid_t child = ::fork();
      if (child == 0) {
        sleep_for(s);
        _exit(0);
      }
      write_file_atomically(rank_file(dir, ".child.pid"), std::to_string(child) + "\n");
    } else if (cmd == "bind-master-port") {
      if (!skip && bind_master_port() != 0) return 5;
    } else if (cmd == "abort") {
      std::string why = next("text");
      if (!skip) {
        std::fprintf(stderr, "%s\n", why.c_str());
        std::fflush(stderr);
        std::abort();
      }
    } else if (cmd == "kill-self") {
      int sig = std::atoi(next("signal").c_str());
      if (!skip) ::raise(sig);
    } else if (cmd == "exit-on") {
      int sig = std::atoi(next("signal").c_str());
      g_exit_code = std::atoi(next("code").c_str());
      if (!skip) ::signal(sig, [](int) { ::_exit(g_exit_code); });
    } else if (cmd == "exit") {
      int code = std::atoi(next("code").c_str());
      if (!skip) return code;
    } else {
      die("unknown command '" + cmd + "'");
    }
  }
  return 0;
}
