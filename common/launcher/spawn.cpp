// ddprun's start of the job (see ddprun.h): the signals it takes, set up before the first fork,
// and one child per rank with its environment (RANK, WORLD_SIZE, MASTER_ADDR, ...), its own
// process group, PR_SET_PDEATHSIG, and its stdout/stderr on pipes.
//
// Apart from the supervision because this is where the ranks are made, and everything that is
// true of a rank for its whole life (its variables, its process group, what it inherits) is
// decided here, between fork() and exec().
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ddprun.h"

extern char** environ;

namespace ddprun {

// Signals are taken synchronously through a signalfd instead of with handlers: they simply
// become one more file descriptor in the poll() loop, next to the output pipes. No async
// handler, no flags, no races between "a signal arrived" and "poll() went to sleep".
//
// A forwarded signal that ddprun inherited as *ignored* stays ignored: `nohup ddprun ...`
// and `ddprun ... &` in a script (where the shell ignores SIGINT) mean "don't react to it",
// and the ranks inherit the same ignored disposition.
void Launcher::setup_signals() {
  sigemptyset(&handled_);
  sigaddset(&handled_, SIGCHLD);  // a rank exited: check who
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) {
    struct sigaction current {};
    ::sigaction(sig, nullptr, &current);
    if (current.sa_handler != SIG_IGN) sigaddset(&handled_, sig);
  }
  // Blocked *before* the first fork, so that no SIGCHLD or SIGTERM can slip past us.
  ::sigprocmask(SIG_BLOCK, &handled_, &original_mask_);
  signal_fd_ = ::signalfd(-1, &handled_, SFD_NONBLOCK | SFD_CLOEXEC);
  if (signal_fd_ < 0) fail_usage(std::string("signalfd failed: ") + std::strerror(errno));

  // Writing to a closed stdout (`ddprun ... | head`) must not kill ddprun: the ranks would be
  // orphaned mid-collective. Get EPIPE instead; the ranks get the original setting back.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &original_sigpipe_);
}

void Launcher::start_ranks(const std::string& program_path) {
  const pid_t launcher_pid = ::getpid();
  const std::string port = std::to_string(opt_.master_port);

  // argv for the program, shared by all ranks. argv[0] is what the user typed.
  std::vector<char*> child_argv;
  for (auto& a : opt_.command) child_argv.push_back(const_cast<char*>(a.c_str()));
  child_argv.push_back(nullptr);

  // The variables we set replace any inherited ones of the same name: a RANK=3 left over in
  // the shell must not reach rank 0. Everything else (PATH, SLURM_*, OMP_*, ...) passes through.
  const char* const ours[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                              "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"};
  std::vector<std::string> inherited;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const char* o : ours) replaced = replaced || name == o;
    if (!replaced) inherited.push_back(entry);
  }

  ranks_.resize(static_cast<size_t>(opt_.nproc));
  for (int r = 0; r < opt_.nproc; ++r) {
    Rank& rank = ranks_[static_cast<size_t>(r)];
    rank.rank = r;

    // Everything the child needs is built *before* fork(), so that the child only has to
    // make a few system calls between fork() and exec().
    std::vector<std::string> env = inherited;
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("LOCAL_RANK=" + std::to_string(r));  // one node: local rank == rank
    env.push_back("WORLD_SIZE=" + std::to_string(opt_.nproc));
    env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(opt_.nproc));
    env.push_back("MASTER_ADDR=" + opt_.master_addr);
    env.push_back("MASTER_PORT=" + port);
    env.push_back("GROUP_RANK=0");  // the index of this node; standalone: always node 0
    std::vector<char*> child_env;
    for (auto& e : env) child_env.push_back(const_cast<char*>(e.c_str()));
    child_env.push_back(nullptr);

    if (!opt_.log_dir.empty()) {
      std::string path = opt_.log_dir + "/rank" + std::to_string(r) + ".log";
      rank.log_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (rank.log_fd < 0) abort_start("cannot create " + path + ": " + std::strerror(errno));
    }

    // One pipe per stream. O_CLOEXEC on all our descriptors matters: without it rank 1 would
    // inherit the write end of rank 0's pipe, and rank 0's output would never see EOF.
    int out_pipe[2], err_pipe[2];
    const std::string which = " for rank " + std::to_string(r) + ": ";
    if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0)
      abort_start("cannot create output pipes" + which + std::strerror(errno));

    pid_t pid = ::fork();
    if (pid < 0) abort_start("cannot start a process" + which + std::strerror(errno));
    if (pid == 0) {
      // --- In the child. ddprun is single-threaded, so any call is safe here. ---

      // Own process group: a Ctrl-C in the terminal reaches ddprun only, and ddprun decides
      // what each rank gets. It also lets us signal a rank *and* anything it started
      // (data-loader workers, a shell wrapper's children) with one kill(-pgid, sig).
      ::setpgid(0, 0);
      // If ddprun dies for any reason, even SIGKILL or an OOM kill, the kernel kills the rank:
      // no orphaned trainers spinning in a collective. (This only covers the rank itself,
      // not processes it starts.)
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      // ...unless ddprun already died before the prctl: then we have been re-parented.
      if (::getppid() != launcher_pid) _exit(1);

      ::dup2(out_pipe[1], STDOUT_FILENO);
      ::dup2(err_pipe[1], STDERR_FILENO);
      // A background process group that reads the terminal is stopped by SIGTTIN, which would
      // freeze the job. Trainers do not read stdin, so they get /dev/null.
      int devnull = ::open("/dev/null", O_RDONLY);
      if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);

      // Undo ddprun's own signal setup: the rank starts with the mask and SIGPIPE handling
      // ddprun was started with. (exec keeps the blocked mask, so this is not optional.)
      ::sigaction(SIGPIPE, &original_sigpipe_, nullptr);
      ::sigprocmask(SIG_SETMASK, &original_mask_, nullptr);

      ::execve(program_path.c_str(), child_argv.data(), child_env.data());
      std::fprintf(stderr, "ddprun: rank %d: cannot run %s: %s\n", r, program_path.c_str(),
                   std::strerror(errno));
      _exit(127);
    }

    // --- In ddprun. ---
    // setpgid on both sides: whichever runs first wins, and we may signal -pid right away.
    ::setpgid(pid, pid);
    rank.pid = pid;
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    rank.out.fd = out_pipe[0];
    rank.out.dest = STDOUT_FILENO;
    rank.err.fd = err_pipe[0];
    rank.err.dest = STDERR_FILENO;
    // Non-blocking read ends: draining a pipe after its rank exited must stop at "empty".
    for (int fd : {rank.out.fd, rank.err.fd})
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
}

// Starting the job failed half-way (fork or pipe failed, a log file cannot be created): kill
// whatever was started and give up with the "could not start" status.
void Launcher::abort_start(const std::string& what) {
  for (auto& r : ranks_)
    if (r.pid > 0) ::kill(-r.pid, SIGKILL);
  for (auto& r : ranks_)
    if (r.pid > 0) ::waitpid(r.pid, nullptr, 0);
  fail_usage(what);
}

}  // namespace ddprun
