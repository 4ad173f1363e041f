// ddprun's supervision of the running job (see ddprun.h): one poll() loop that wakes for output,
// signals (through the signalfd) and exits; signals forwarded to the ranks; a failed rank named
// in one line, and the others stopped (SIGTERM, then SIGKILL after the grace period).
//
// Apart from the start (spawn.cpp) and the output (forward.cpp) because this is the part that
// decides: when the job ends, who is blamed, and with which exit status.
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ddprun.h"

namespace ddprun {
namespace {

// How long ddprun waits, after a rank failed with an exit code, for a rank killed by a signal to
// show up before it names the culprit (see check_children).
constexpr double kSettleSeconds = 0.5;

// Our own short table instead of sigabbrev_np(): that needs glibc 2.32, clusters run older.
const char* signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGCHLD: return "SIGCHLD";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSYS: return "SIGSYS";
    default: return "unknown signal";
  }
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int Launcher::count_running() const {
  int n = 0;
  for (auto& r : ranks_) n += r.exited ? 0 : 1;
  return n;
}

// Signal the process group of every rank that is still running; returns how many.
int Launcher::signal_running(int sig) {
  int n = 0;
  for (auto& r : ranks_) {
    if (r.exited) continue;
    ::kill(-r.pid, sig);
    ++n;
  }
  return n;
}

void Launcher::begin_stop(int first_signal) {
  stopping_ = true;
  signal_running(first_signal);
  kill_deadline_ = now_seconds() + opt_.grace;
}

void Launcher::handle_signal(int sig) {
  if (sig == SIGCHLD) return;  // check_children() runs after every wake-up anyway
  if (sig == SIGINT || sig == SIGTERM) {
    if (!stopping_) {
      exit_status_ = 128 + sig;
      int n = count_running();
      std::fprintf(stderr,
                   "ddprun: received %s; forwarding it to %d rank%s, SIGKILL in %g s "
                   "(send it again to kill them now)\n",
                   signal_name(sig), n, n == 1 ? "" : "s", opt_.grace);
      begin_stop(sig);  // the ranks get the same signal, so a trainer can tell Ctrl-C apart
    } else if (!killed_) {
      std::fprintf(stderr, "ddprun: received %s again; killing the remaining ranks\n",
                   signal_name(sig));
      signal_running(SIGKILL);
      killed_ = true;
    }
    return;
  }
  // SIGUSR1/SIGUSR2/SIGHUP: pass on and carry on. Slurm's `--signal=USR1@120` uses this to
  // tell the trainer to write a checkpoint before the time limit; what happens next is the
  // trainer's business (and if a rank dies from it, that is a failure like any other).
  int n = signal_running(sig);
  std::fprintf(stderr, "ddprun: forwarded %s to %d rank%s\n", signal_name(sig), n,
               n == 1 ? "" : "s");
}

// Who has exited? waitid(..., WNOWAIT) tells us without reaping: the rank stays a zombie until
// ddprun is done. That keeps its pid -- which is also its process group id -- reserved, so a
// later kill(-pgid) can never hit an unrelated process that happened to get the recycled number.
void Launcher::check_children() {
  for (auto& r : ranks_) {
    if (r.exited) continue;
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(r.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0)
      continue;
    if (info.si_pid != r.pid) continue;  // still running
    r.exited = true;
    if (info.si_code == CLD_EXITED) {
      r.exit_code = info.si_status;
    } else {
      r.exit_signal = info.si_status;  // CLD_KILLED or CLD_DUMPED
    }
    drain(r);
    if ((r.exit_code != 0 || r.exit_signal != 0) && !stopping_) failed_.push_back(&r);
  }
  if (failed_.empty() || stopping_) return;  // all well, or ranks we are stopping anyway

  // Who is to blame? A rank killed by a signal (the OOM killer, a segfault, scancel) makes its
  // peers' collectives fail within milliseconds, and they exit with an error of their own. On a
  // busy machine one of them may even be seen gone first: the killed rank's sockets close before
  // the kernel reports its death. So a failure by exit code alone waits up to kSettleSeconds for
  // a death by signal among the others; the signal is the cause and is named.
  const bool signalled = std::any_of(failed_.begin(), failed_.end(),
                                     [](const Rank* x) { return x->exit_signal != 0; });
  if (!signalled && count_running() > 0) {
    if (verdict_at_ == 0) verdict_at_ = now_seconds() + kSettleSeconds;
    if (now_seconds() < verdict_at_) return;
  }
  give_verdict();
}

// The first failure: say which rank and how, in one line, then stop everybody else. Their
// collectives cannot finish without this rank; left alone they would hang until the rendezvous
// timeout (30 minutes by default).
void Launcher::give_verdict() {
  std::stable_partition(failed_.begin(), failed_.end(), [](const Rank* x) { return x->exit_signal != 0; });
  Rank& r = *failed_.front();
  std::string how = r.exit_signal != 0 ? "killed by signal " + std::to_string(r.exit_signal) +
                                             " (" + signal_name(r.exit_signal) + ")"
                                       : "exited with code " + std::to_string(r.exit_code);
  // SIGABRT is a rank ending itself. On GPUs that is most often c10d's NCCL watchdog (with
  // asynchronous error handling on, as the kit sets it): a collective timed out or failed, and
  // the watchdog aborted the rank rather than leave it hanging. The rank's stderr says which.
  if (r.exit_signal == SIGABRT)
    how += ": the rank aborted itself (on GPUs usually NCCL's watchdog, after a collective timed "
           "out or failed: see the rank's stderr above)";
  int others = count_running();
  std::string next = others == 0 ? "no other rank is running"
                                 : "stopping the other " + std::to_string(others) +
                                       (others == 1 ? " rank" : " ranks");
  std::fprintf(stderr, "ddprun: rank %d (pid %d) died: %s; %s\n", r.rank,
               static_cast<int>(r.pid), how.c_str(), next.c_str());
  exit_status_ = r.exit_signal != 0 ? 128 + r.exit_signal : kExitRankFailed;
  failed_.clear();
  begin_stop(SIGTERM);
}

void Launcher::loop() {
  std::vector<pollfd> fds;
  std::vector<std::pair<Rank*, Stream*>> owners;
  while (count_running() > 0) {
    // Time to escalate? SIGTERM asked nicely; after the grace period SIGKILL does not ask.
    if (stopping_ && !killed_ && now_seconds() >= kill_deadline_) {
      int n = count_running();
      std::fprintf(stderr,
                   "ddprun: %d rank%s still running %g s after being told to stop; "
                   "sending SIGKILL\n",
                   n, n == 1 ? "" : "s", opt_.grace);
      signal_running(SIGKILL);
      killed_ = true;
    }

    fds.clear();
    owners.clear();
    fds.push_back({signal_fd_, POLLIN, 0});
    owners.push_back({nullptr, nullptr});
    for (auto& r : ranks_)
      for (Stream* s : {&r.out, &r.err})
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          owners.push_back({&r, s});
        }

    // SIGCHLD through the signalfd wakes us whenever a rank exits, so in principle we could
    // sleep forever here. A 1 s tick costs nothing and bounds the damage of any surprise.
    int timeout_ms = 1000;
    if (stopping_ && !killed_) {
      double left = kill_deadline_ - now_seconds();
      timeout_ms = std::max(0, std::min(timeout_ms, static_cast<int>(std::ceil(left * 1000))));
    }
    if (!stopping_ && !failed_.empty()) {  // a verdict is due by verdict_at_
      double left = verdict_at_ - now_seconds();
      timeout_ms = std::max(0, std::min(timeout_ms, static_cast<int>(std::ceil(left * 1000))));
    }
    int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) {
      // Cannot happen in practice; if it does, do not leave the ranks running unsupervised.
      std::fprintf(stderr, "ddprun: poll failed (%s); killing all ranks\n", std::strerror(errno));
      if (exit_status_ == 0) exit_status_ = kExitRankFailed;
      stopping_ = true;
      signal_running(SIGKILL);
      for (auto& r : ranks_) r.exited = true;  // the waitpid() in run() collects them
      break;
    }

    if (ready > 0) {
      if (fds[0].revents & POLLIN) {
        signalfd_siginfo si;
        while (::read(signal_fd_, &si, sizeof si) == static_cast<ssize_t>(sizeof si))
          handle_signal(static_cast<int>(si.ssi_signo));
      }
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR))
          if (owners[i].second->fd >= 0) read_stream(*owners[i].first, *owners[i].second);
    }
    check_children();
  }
}

}  // namespace ddprun
