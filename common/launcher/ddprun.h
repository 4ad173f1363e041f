// ddprun.h — internal to ddprun (common/launcher/*.cpp); nothing else includes it.
//
// What ddprun's parts share: its exit codes, the parsed command line (Options), a rank as the
// launcher sees it (Rank, with its two output Streams), and the Launcher that owns the ranks.
// Each part is a file of its own (ddprun.cpp says which and in what order they act).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace ddprun {

// Exit codes. 0 and 2 are fixed; the others tell a script *why* the job ended.
constexpr int kExitUsage = 2;        // bad command line / could not start the job
constexpr int kExitRankFailed = 1;   // the first failing rank exited with a non-zero code

// command_line.cpp: one line on stderr and exit code 2 (kExitUsage), for every complaint about
// the command line and every failure to start the job.
[[noreturn]] void fail_usage(const std::string& message);

struct Options {
  int nproc = 2;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string log_dir;  // empty: no log files
  bool tag_output = false;
  double grace = 5.0;
  std::vector<std::string> command;  // program + its arguments
};

// command_line.cpp: the options, checked (--help and --version exit 0 here).
Options parse_command_line(int argc, char** argv);
// command_line.cpp: the program's path, found as execvp() would, before anything starts.
std::string resolve_program(const std::string& program);
// port.cpp: the rendezvous port: opt.master_port checked, or a free one if it is 0.
int choose_port(const Options& opt);

// One output stream (stdout or stderr) of one rank, read from a pipe.
struct Stream {
  int fd = -1;           // read end of the pipe; -1 once closed
  int dest = -1;         // where ddprun forwards it: 1 or 2
  std::string pending;   // bytes after the last newline, waiting for the rest of their line
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;        // also the id of the rank's process group
  bool exited = false;   // seen exiting (still a zombie until the very end: Launcher::run)
  int exit_code = 0;     // when it exited normally
  int exit_signal = 0;   // when a signal killed it
  Stream out, err;
  int log_fd = -1;
};

class Launcher {
 public:
  explicit Launcher(Options opt) : opt_(std::move(opt)) {}
  int run();  // ddprun.cpp: the whole job, start to end; returns ddprun's exit status

 private:
  // spawn.cpp: signals taken through a signalfd, the ranks forked with their environment.
  void setup_signals();
  void start_ranks(const std::string& program_path);
  [[noreturn]] void abort_start(const std::string& what);

  // supervise.cpp: the poll() loop, signals received, ranks that exited, the verdict, the stop.
  void loop();
  void handle_signal(int sig);
  void check_children();
  void give_verdict();
  void begin_stop(int first_signal);
  int signal_running(int sig);
  int count_running() const;

  // forward.cpp: the ranks' output, line by line, to ddprun's stdout/stderr and the logs.
  void read_stream(Rank& r, Stream& s);
  void drain(Rank& r);
  void emit_line(Rank& r, Stream& s, const char* data, size_t size, bool add_newline);

  Options opt_;
  std::vector<Rank> ranks_;
  sigset_t handled_{};       // signals ddprun takes through the signalfd
  sigset_t original_mask_{};
  struct sigaction original_sigpipe_ {};
  int signal_fd_ = -1;
  bool dest_broken_[3] = {false, false, false};  // stdout/stderr of ddprun gone away

  // Supervision state.
  bool stopping_ = false;     // tearing the job down (a rank failed, or SIGINT/SIGTERM)
  bool killed_ = false;       // SIGKILL already sent
  double kill_deadline_ = 0;  // when SIGTERM turns into SIGKILL
  std::vector<Rank*> failed_;  // ranks found failed, before the verdict (in the order found)
  double verdict_at_ = 0;      // the latest time for the verdict, once a rank failed (0: none)
  int exit_status_ = 0;
};

}  // namespace ddprun
