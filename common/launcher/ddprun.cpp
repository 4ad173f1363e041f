// ddprun — start N ranks of a distributed program on this machine and look after them.
//
// This is the kit's equivalent of `torchrun --standalone --nproc-per-node N`. LibTorch's C++
// frontend ships no launcher, and a distributed trainer needs one: every process must be told
// who it is (RANK, WORLD_SIZE, ...) and where to meet the others (MASTER_ADDR:MASTER_PORT),
// and somebody must notice when one of them dies, because the survivors would otherwise sit in
// a collective (all_reduce, barrier) waiting for a peer that will never answer.
//
// It deliberately uses nothing but C++17 and POSIX/Linux calls (no LibTorch), so it builds in
// about two seconds on one core. Launcher::run() below is the whole job in order; each step is a
// file:
//
//   1. command_line.cpp  parse the command line and refuse bad input up front (exit 2, one
//                        line, never a hang); find the program;
//   2. port.cpp          pick or check the rendezvous port;
//   3. spawn.cpp         fork one child per rank: own process group, PR_SET_PDEATHSIG,
//                        stdout/stderr on pipes, signals taken through a signalfd;
//   4. supervise.cpp     one poll() loop that receives signals, notices dead ranks and tears
//                        the job down when one fails; forward.cpp passes the ranks' output
//                        on line by line.
// ddprun.h holds what they share (Options, Rank, the Launcher).
//
// Linux-only on purpose (signalfd, prctl): that is where the course's clusters run.

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "ddprun.h"

namespace ddprun {
namespace {

// `mkdir -p`, by hand, to stay within plain POSIX.
bool make_dirs(const std::string& path, std::string* error) {
  std::string partial;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t slash = path.find('/', pos);
    if (slash == std::string::npos) slash = path.size();
    partial = path.substr(0, slash);
    pos = slash + 1;
    if (partial.empty()) continue;  // leading '/'
    if (::mkdir(partial.c_str(), 0777) != 0 && errno != EEXIST) {
      *error = std::strerror(errno);
      return false;
    }
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *error = "not a directory";
    return false;
  }
  return true;
}

}  // namespace

int Launcher::run() {
  std::string program_path = resolve_program(opt_.command[0]);
  opt_.master_port = choose_port(opt_);
  if (!opt_.log_dir.empty()) {
    std::string why;
    if (!make_dirs(opt_.log_dir, &why))
      fail_usage("cannot create --log-dir '" + opt_.log_dir + "': " + why);
  }
  setup_signals();
  start_ranks(program_path);
  loop();

  // When we tore the job down, also take out anything the ranks left behind in their process
  // groups (the ranks themselves are zombies now, so these group ids are still theirs).
  if (stopping_)
    for (auto& r : ranks_) ::kill(-r.pid, SIGKILL);
  for (auto& r : ranks_) {
    drain(r);
    ::waitpid(r.pid, nullptr, 0);  // reap the zombie; returns at once
    if (r.log_fd >= 0) ::close(r.log_fd);
  }
  return exit_status_;
}

}  // namespace ddprun

int main(int argc, char** argv) {
  // If ddprun was started with stdin/stdout/stderr closed, our first pipe would get number 1
  // or 2 and the ranks' output would go to strange places. Occupy them with /dev/null first.
  for (int fd = 0; fd <= 2; ++fd)
    if (::fcntl(fd, F_GETFD) < 0) ::open("/dev/null", O_RDWR);

  ddprun::Launcher launcher(ddprun::parse_command_line(argc, argv));
  return launcher.run();
}
