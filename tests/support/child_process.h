// Child processes for the tests that run the real trainer (ex01-solution) and launcher (ddprun)
// as programs: tests/badinput and tests/faults. Every child gets a clean, explicit environment,
// its own process group and a deadline, so that a test never hangs: wait(timeout) kills the whole
// group when the time is up, and a Process that goes out of scope unreaped is killed too.
//
// Defines, in namespace kit_test:
//   read_file, nonempty_lines          whole files, non-blank lines
//   TempDir                            a fresh directory under $TMPDIR, removed afterwards
//   free_port                          a TCP port nobody listens on right now
//   clean_env                          our environment minus rank/Slurm/KIT_ settings, plus a tag
//   Result, Process                    one child: fork/exec, wait with a deadline, what it printed
//   tagged_processes, child_with_rank  finding the processes a test started, via /proc
//
// Header-only and no LibTorch: the tests only start programs and read what they leave behind.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace kit_test {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

inline std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::vector<std::string> nonempty_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) out.push_back(line);
  return out;
}

// <tmp>/<prefix>-XXXXXX, removed with everything in it at the end, unless the environment
// variable `keep_env` (when given) is set: then it stays for a post-mortem.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& prefix, const char* keep_env = nullptr) : keep_env_(keep_env) {
    std::string tmpl = (fs::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  ~TempDir() {
    if (keep_env_ && std::getenv(keep_env_)) return;
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

 private:
  const char* keep_env_;
};

// A TCP port nobody listens on right now (the kernel picks it).
inline int free_port() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(s);
    return -1;
  }
  ::close(s);
  return ntohs(a.sin_port);
}

// The environment of a child: ours, minus anything that would make it a rank of some job or
// change the kit's behaviour (RANK, WORLD_SIZE, MASTER_*, SLURM_*, KIT_*, ...), plus one intra-op
// thread (the cores are shared), `defaults`, the tag `tag_var`=`tag` that lets a test find every
// process it started, and finally `extra` (which wins over everything before it).
inline std::map<std::string, std::string> clean_env(const std::string& tag_var, const std::string& tag,
                                                    const std::map<std::string, std::string>& extra,
                                                    const std::map<std::string, std::string>& defaults = {}) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    std::string k = kv.substr(0, eq);
    static const char* drop[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                 "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"};
    bool skip = k.rfind("SLURM_", 0) == 0 || k.rfind("KIT_", 0) == 0;
    for (auto d : drop) skip = skip || k == d;
    if (!skip) env[k] = kv.substr(eq + 1);
  }
  env["OMP_NUM_THREADS"] = "1";
  for (auto& [k, v] : defaults) env[k] = v;
  env[tag_var] = tag;
  for (auto& [k, v] : extra) env[k] = v;
  return env;
}

struct Result {
  int exit_code = -1;  // when it exited
  int signal = 0;      // when a signal ended it
  bool timed_out = false;
  double seconds = 0;
  std::string out, err;
  std::vector<std::string> err_lines() const { return nonempty_lines(err); }
};

inline std::ostream& operator<<(std::ostream& o, const Result& r) {
  return o << "exit " << r.exit_code << ", signal " << r.signal << (r.timed_out ? ", TIMED OUT" : "")
           << ", " << r.seconds << " s\n--- stderr ---\n" << r.err << "--- stdout ---\n" << r.out;
}

// One child process: its own process group (so a timeout kills everything it started),
// stdout/stderr into <dir>/<name>.out and .err (no pipe can fill up while we wait for another
// process), stdin from /dev/null.
class Process {
 public:
  Process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
          const fs::path& dir, const std::string& name)
      : out_(dir / (name + ".out")), err_(dir / (name + ".err")), start_(Clock::now()) {
    std::vector<std::string> env_strings;
    for (auto& [k, v] : env) env_strings.push_back(k + "=" + v);
    std::vector<char*> cargv, cenv;
    for (auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    for (auto& e : env_strings) cenv.push_back(const_cast<char*>(e.c_str()));
    cenv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      int o = ::open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int e = ::open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int devnull = ::open("/dev/null", O_RDONLY);
      ::dup2(devnull, 0);
      ::dup2(o, 1);
      ::dup2(e, 2);
      ::execve(cargv[0], cargv.data(), cenv.data());
      std::fprintf(stderr, "exec %s: %s\n", cargv[0], std::strerror(errno));
      ::_exit(127);
    }
    ::setpgid(pid_, pid_);  // also here: no race with the child's own call
  }
  ~Process() {
    if (!reaped_) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }

  // Still running (not exited; an exited child stays unreaped until wait()).
  bool running() {
    if (reaped_) return false;
    siginfo_t info{};
    return ::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           info.si_pid == 0;
  }

  // Waits until the process exits or `timeout_s` (from its start) passed; then kills its group.
  Result wait(double timeout_s) {
    Result r;
    auto deadline = start_ + std::chrono::duration<double>(timeout_s);
    int status = 0;
    for (;;) {
      pid_t done = ::waitpid(pid_, &status, WNOHANG);
      if (done == pid_) break;
      if (Clock::now() > deadline) {
        r.timed_out = true;
        ::kill(-pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    reaped_ = true;
    r.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
    r.out = read_file(out_);
    r.err = read_file(err_);
    return r;
  }

 private:
  fs::path out_, err_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  Clock::time_point start_;
};

namespace detail {
// Whether the NUL-separated environment block `env` has an entry that is exactly `entry`.
inline bool has_env_entry(const std::string& env, const std::string& entry) {
  for (size_t at = 0; at < env.size();) {
    size_t end = env.find('\0', at);
    if (env.compare(at, end == std::string::npos ? std::string::npos : end - at, entry) == 0) return true;
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return false;
}
}  // namespace detail

// Processes whose environment has `tag_var`=`tag` (zombies do not count), other than ourselves.
inline std::vector<pid_t> tagged_processes(const std::string& tag_var, const std::string& tag) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  const std::string needle = tag_var + "=" + tag;
  while (dirent* e = ::readdir(d)) {
    pid_t pid = std::atoi(e->d_name);
    if (pid <= 0 || pid == ::getpid()) continue;
    std::string stat = read_file(fs::path("/proc") / e->d_name / "stat");
    if (stat.find(") Z ") != std::string::npos) continue;
    if (detail::has_env_entry(read_file(fs::path("/proc") / e->d_name / "environ"), needle))
      out.push_back(pid);
  }
  ::closedir(d);
  return out;
}

// The child of `parent` whose environment says RANK=<rank>, or -1.
inline pid_t child_with_rank(pid_t parent, int rank) {
  DIR* d = ::opendir("/proc");
  pid_t found = -1;
  const std::string want = "RANK=" + std::to_string(rank);
  while (d && found < 0) {
    dirent* e = ::readdir(d);
    if (!e) break;
    pid_t pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    std::string stat = read_file(fs::path("/proc") / e->d_name / "stat");
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    fields >> state >> ppid;
    if (ppid != parent) continue;
    if (detail::has_env_entry(read_file(fs::path("/proc") / e->d_name / "environ"), want)) found = pid;
  }
  if (d) ::closedir(d);
  return found;
}

}  // namespace kit_test
