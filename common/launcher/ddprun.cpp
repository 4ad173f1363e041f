// ddprun — start N ranks of a distributed program on this machine and look after them.
//
// This is the kit's equivalent of `torchrun --standalone --nproc-per-node N`. LibTorch's C++
// frontend ships no launcher, and a distributed trainer needs one: every process must be told
// who it is (RANK, WORLD_SIZE, ...) and where to meet the others (MASTER_ADDR:MASTER_PORT),
// and somebody must notice when one of them dies, because the survivors would otherwise sit in
// a collective (all_reduce, barrier) waiting for a peer that will never answer.
//
// It deliberately uses nothing but C++17 and POSIX/Linux calls (no LibTorch), so it builds in
// about a second and can be read top to bottom. The interesting parts, in order:
//
//   1. parse the command line and refuse bad input up front (exit 2, one line, never a hang);
//   2. pick or check the rendezvous port;
//   3. fork one child per rank: own process group, PR_SET_PDEATHSIG, stdout/stderr on pipes;
//   4. one poll() loop that forwards output line by line, receives signals (via signalfd),
//      notices dead ranks and tears the job down when one fails.
//
// Linux-only on purpose (signalfd, prctl): that is where the course's clusters run.

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace {

constexpr const char* kVersion = "ddprun 1.0 (DDP course kit)";

// Exit codes. 0 and 2 are fixed; the others tell a script *why* the job ended.
constexpr int kExitUsage = 2;        // bad command line / could not start the job
constexpr int kExitRankFailed = 1;   // the first failing rank exited with a non-zero code

constexpr int kMaxRanks = 1024;      // each rank costs 3 file descriptors here
constexpr size_t kMaxLine = 64 * 1024;  // longer "lines" are forwarded in pieces
// How long ddprun waits, after a rank failed with an exit code, for a rank killed by a signal to
// show up before it names the culprit (see check_children).
constexpr double kSettleSeconds = 0.5;

const char* const kUsage =
    "usage: ddprun [options] [--] program [args...]\n"
    "\n"
    "Starts N copies (ranks) of `program` on this machine, each with the environment a\n"
    "distributed trainer reads, forwards their output, and stops the whole job as soon as\n"
    "one rank fails. The first argument that is not an option is the program; everything\n"
    "after it is passed to the program untouched.\n"
    "\n"
    "options:\n"
    "  --nproc-per-node N   number of ranks to start (default 2, at most 1024)\n"
    "  --master-addr ADDR   rendezvous address given to the ranks (default 127.0.0.1);\n"
    "                       must be an address of this machine\n"
    "  --master-port P      rendezvous port (default 0: pick a free one). A port given\n"
    "                       explicitly is checked and refused if it is already in use\n"
    "  --log-dir DIR        also write each rank's stdout+stderr to DIR/rank<N>.log\n"
    "  --prefix-ranks       prefix every forwarded line with \"[rank N] \", so that the\n"
    "                       interleaved output of N ranks says who wrote what\n"
    "                       (--tag-output is the same option, torchrun's older name)\n"
    "  --grace S            seconds between SIGTERM and SIGKILL when stopping ranks\n"
    "                       (default 5, may be fractional)\n"
    "  --help, --version\n"
    "Every option also accepts the --option=value form.\n"
    "\n"
    "each rank gets: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,\n"
    "MASTER_PORT, GROUP_RANK=0, on top of ddprun's own environment. Each rank runs in its\n"
    "own process group with stdin from /dev/null, and is killed if ddprun dies.\n"
    "\n"
    "signals: SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2 sent to ddprun are forwarded to\n"
    "every rank. After SIGINT/SIGTERM ddprun waits for the ranks (SIGKILL after the grace\n"
    "period; a second SIGINT/SIGTERM kills them at once) and exits 128+signal. After\n"
    "SIGUSR1/SIGUSR2/SIGHUP it keeps supervising (Slurm's \"checkpoint now\" signal).\n"
    "A signal ddprun was started with ignored (nohup, `cmd &` in a script) stays ignored.\n"
    "\n"
    "exit status:\n"
    "  0        every rank exited with status 0\n"
    "  1        a rank exited with a non-zero status; the others were stopped\n"
    "  128+S    a rank was killed by signal S (e.g. 137 for SIGKILL, 139 for SIGSEGV,\n"
    "           134 for SIGABRT: a rank that aborted, as NCCL's watchdog does),\n"
    "           or ddprun itself received SIGINT/SIGTERM (130/143) and stopped the job.\n"
    "           Only the first failure counts: ranks that die because ddprun stopped\n"
    "           them do not change the status.\n"
    "  2        bad command line, program not found, port in use, or the job could\n"
    "           not be started\n";

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

// Every complaint about the command line is exactly one line on stderr and exit code 2, so a
// script (or a student) sees the reason at once and nothing ever waits on a half-started job.
[[noreturn]] void fail_usage(const std::string& message) {
  std::fprintf(stderr, "ddprun: %s\n", message.c_str());
  std::exit(kExitUsage);
}

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

// Strict number parsing: the whole string must be a number in range. strtol alone would
// accept "4x" as 4 and "" as 0, and `--nproc-per-node 4x` silently meaning 4 is a trap.
bool parse_long(const std::string& text, long lo, long hi, long* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool parse_seconds(const std::string& text, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v) || v < 0 || v > 24 * 3600.0) return false;
  *out = v;
  return true;
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// write() until everything is out. Returns false when the destination is gone (e.g. EPIPE
// because `ddprun ... | head` closed its end); the caller then stops writing there but keeps
// supervising, because the ranks must not be abandoned just because nobody reads the output.
bool write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      // Somebody made our stdout non-blocking: wait for room instead of spinning.
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
    } else {
      return false;
    }
  }
  return true;
}

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

// ---------------------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------------------

struct Options {
  int nproc = 2;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string log_dir;  // empty: no log files
  bool tag_output = false;
  double grace = 5.0;
  std::vector<std::string> command;  // program + its arguments
};

Options parse_command_line(int argc, char** argv) {
  Options opt;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    // The first word that is not an option is the program: its own flags (which may look
    // like ours) belong to it, so option parsing stops here, as in torchrun and mpirun.
    if (arg.size() < 2 || arg[0] != '-') break;

    // Split "--name=value"; for "--name value" the value is the next word.
    std::string name = arg, value;
    bool has_inline_value = false;
    size_t eq = arg.find('=');
    if (arg.compare(0, 2, "--") == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_inline_value = true;
    }
    auto take_value = [&]() -> std::string {
      if (has_inline_value) return value;
      if (i + 1 >= argc) fail_usage("option " + name + " needs a value (try ddprun --help)");
      return argv[++i];
    };
    auto no_value = [&]() {
      if (has_inline_value) fail_usage("option " + name + " takes no value (try ddprun --help)");
    };

    if (name == "--help" || name == "-h") {
      no_value();
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (name == "--version") {
      no_value();
      std::puts(kVersion);
      std::exit(0);
    } else if (name == "--nproc-per-node") {
      std::string v = take_value();
      long n = 0;
      if (!parse_long(v, 1, kMaxRanks, &n))
        fail_usage("--nproc-per-node needs a whole number from 1 to " + std::to_string(kMaxRanks) +
                   ", got '" + v + "'");
      opt.nproc = static_cast<int>(n);
    } else if (name == "--master-addr") {
      opt.master_addr = take_value();
      if (opt.master_addr.empty()) fail_usage("--master-addr needs a non-empty address");
    } else if (name == "--master-port") {
      std::string v = take_value();
      long p = 0;
      if (!parse_long(v, 0, 65535, &p))
        fail_usage("--master-port needs a port number from 0 to 65535 (0 = pick a free one), "
                   "got '" + v + "'");
      opt.master_port = static_cast<int>(p);
    } else if (name == "--log-dir") {
      opt.log_dir = take_value();
      if (opt.log_dir.empty()) fail_usage("--log-dir needs a directory name");
    } else if (name == "--prefix-ranks" || name == "--tag-output") {
      no_value();
      opt.tag_output = true;
    } else if (name == "--grace") {
      std::string v = take_value();
      if (!parse_seconds(v, &opt.grace))
        fail_usage("--grace needs a number of seconds from 0 to 86400, got '" + v + "'");
    } else {
      fail_usage("unknown option '" + arg + "' (try ddprun --help)");
    }
  }
  for (; i < argc; ++i) opt.command.push_back(argv[i]);
  if (opt.command.empty())
    fail_usage("no program given; usage: ddprun [options] [--] program [args...]");
  return opt;
}

// Find the program the way execvp() would, but *before* starting anything: a typo should be
// one line and exit 2, not N identical "exec failed" messages from N half-started ranks.
std::string resolve_program(const std::string& program) {
  auto check = [](const std::string& path, std::string* why) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      *why = std::strerror(errno);
      return false;
    }
    if (S_ISDIR(st.st_mode)) {
      *why = "is a directory";
      return false;
    }
    if (::access(path.c_str(), X_OK) != 0) {
      *why = "is not executable";
      return false;
    }
    return true;
  };
  std::string why;
  if (program.find('/') != std::string::npos) {
    if (!check(program, &why)) fail_usage("cannot run program '" + program + "': " + why);
    return program;
  }
  const char* path_env = std::getenv("PATH");
  std::string path = (path_env && *path_env) ? path_env : "/usr/local/bin:/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t colon = path.find(':', pos);
    if (colon == std::string::npos) colon = path.size();
    std::string dir = path.substr(pos, colon - pos);
    pos = colon + 1;
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    if (check(candidate, &why)) return candidate;
  }
  fail_usage("program '" + program + "' not found in PATH");
}

// ---------------------------------------------------------------------------------------------
// The rendezvous port
// ---------------------------------------------------------------------------------------------
//
// Rank 0's TCPStore will listen on MASTER_ADDR:MASTER_PORT. With port 0 we ask the kernel for
// a free port by binding to port 0 and reading back what it chose, then close the socket so
// rank 0 can take it. (There is a small window in which another program could grab the same
// port; torchrun --standalone has the same window. It is rare enough to accept.)
//
// An explicit port is checked the same way: if we cannot bind it, the TCPStore will not be able
// to either, and it is far kinder to say so now than to let every rank time out in 30 minutes.
// SO_REUSEADDR keeps a port whose old connections linger in TIME_WAIT from being reported as
// busy, while a port somebody is listening on is still refused.

enum class BindResult { kOk, kInUse, kNotLocal, kBadAddress };

BindResult try_bind(const std::string& addr, int port, int* bound_port, std::string* detail) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* list = nullptr;
  int rc = ::getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &list);
  if (rc != 0) {
    *detail = ::gai_strerror(rc);
    return BindResult::kBadAddress;
  }
  // A name such as "localhost" may stand for several addresses (::1 and 127.0.0.1). The port
  // counts as in use if it is taken on any of them; a free port is taken from the first one.
  BindResult result = BindResult::kNotLocal;
  *detail = "no usable address";
  for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
      int got = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      ::close(fd);
      if (result != BindResult::kInUse) {
        result = BindResult::kOk;
        *bound_port = got;
      }
      if (port == 0) break;  // picking: the first address that works is enough
    } else {
      int err = errno;
      ::close(fd);
      if (err == EADDRINUSE) {
        result = BindResult::kInUse;
      } else if (result != BindResult::kOk && result != BindResult::kInUse) {
        *detail = std::strerror(err);
      }
    }
  }
  ::freeaddrinfo(list);
  return result;
}

int choose_port(const Options& opt) {
  int port = 0;
  std::string detail;
  switch (try_bind(opt.master_addr, opt.master_port, &port, &detail)) {
    case BindResult::kOk:
      return port;
    case BindResult::kInUse:
      fail_usage("MASTER_PORT " + std::to_string(opt.master_port) + " on " + opt.master_addr +
                 " is in use by another program; choose another --master-port or leave it out "
                 "to get a free one");
    case BindResult::kBadAddress:
      fail_usage("cannot resolve --master-addr '" + opt.master_addr + "': " + detail);
    case BindResult::kNotLocal:
      break;
  }
  fail_usage("cannot listen on --master-addr '" + opt.master_addr + "' (" + detail +
             "); ddprun starts every rank on this machine, so use one of its own addresses");
}

// ---------------------------------------------------------------------------------------------
// The ranks
// ---------------------------------------------------------------------------------------------

// One output stream (stdout or stderr) of one rank, read from a pipe.
struct Stream {
  int fd = -1;           // read end of the pipe; -1 once closed
  int dest = -1;         // where ddprun forwards it: 1 or 2
  std::string pending;   // bytes after the last newline, waiting for the rest of their line
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;        // also the id of the rank's process group
  bool exited = false;   // seen exiting (still a zombie until the very end, see reap below)
  int exit_code = 0;     // when it exited normally
  int exit_signal = 0;   // when a signal killed it
  Stream out, err;
  int log_fd = -1;
};

class Launcher {
 public:
  explicit Launcher(Options opt) : opt_(std::move(opt)) {}
  int run();

 private:
  void setup_signals();
  void start_ranks(const std::string& program_path);
  [[noreturn]] void abort_start(const std::string& what);
  void loop();

  void handle_signal(int sig);
  void read_stream(Rank& r, Stream& s);
  void drain(Rank& r);
  void emit_line(Rank& r, Stream& s, const char* data, size_t size, bool add_newline);
  void check_children();
  void give_verdict();
  void begin_stop(int first_signal);
  int signal_running(int sig);
  int count_running() const;

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

// Forward one complete line. It goes out in a single write(), so lines of different ranks
// never mix inside a line (a write to a pipe or terminal of a few KiB is not split).
void Launcher::emit_line(Rank& r, Stream& s, const char* data, size_t size, bool add_newline) {
  if (!dest_broken_[s.dest]) {
    std::string line;
    if (opt_.tag_output) line = "[rank " + std::to_string(r.rank) + "] ";
    line.append(data, size);
    if (add_newline) line.push_back('\n');
    if (!write_all(s.dest, line.data(), line.size())) dest_broken_[s.dest] = true;
  }
  if (r.log_fd >= 0) {
    std::string line(data, size);  // the log is per rank already: no tag needed
    if (add_newline) line.push_back('\n');
    if (!write_all(r.log_fd, line.data(), line.size())) {
      ::close(r.log_fd);  // disk full: keep the job going, lose the log
      r.log_fd = -1;
    }
  }
}

void Launcher::read_stream(Rank& r, Stream& s) {
  char buf[65536];
  ssize_t n;
  do n = ::read(s.fd, buf, sizeof buf);
  while (n < 0 && errno == EINTR);
  if (n < 0 && errno == EAGAIN) return;
  if (n <= 0) {
    // EOF (or a read error): send what is left as a last line, so the next rank's line does
    // not continue it on the same terminal line.
    if (!s.pending.empty()) emit_line(r, s, s.pending.data(), s.pending.size(), true);
    s.pending.clear();
    ::close(s.fd);
    s.fd = -1;
    return;
  }
  s.pending.append(buf, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1)
    emit_line(r, s, s.pending.data() + start, nl + 1 - start, false);
  s.pending.erase(0, start);
  // A rank writing megabytes without a newline (a progress bar with \r) must not make us
  // hold megabytes: forward it in pieces.
  if (s.pending.size() >= kMaxLine) {
    emit_line(r, s, s.pending.data(), s.pending.size(), true);
    s.pending.clear();
  }
}

// After a rank has exited, everything it wrote is already in the pipe: read it out and close.
// We do not wait for EOF, because a process the rank started in the background may hold the
// pipe open for hours; waiting for it would be exactly the hang this tool must never have.
// The number of reads is bounded for the same reason (that process may still be writing).
void Launcher::drain(Rank& r) {
  for (Stream* s : {&r.out, &r.err}) {
    for (int reads = 0; s->fd >= 0 && reads < 64; ++reads) {
      pollfd p{s->fd, POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) break;  // nothing more right now
      read_stream(r, *s);
    }
    if (s->fd >= 0) {
      if (!s->pending.empty()) emit_line(r, *s, s->pending.data(), s->pending.size(), true);
      s->pending.clear();
      ::close(s->fd);
      s->fd = -1;
    }
  }
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

}  // namespace

int main(int argc, char** argv) {
  // If ddprun was started with stdin/stdout/stderr closed, our first pipe would get number 1
  // or 2 and the ranks' output would go to strange places. Occupy them with /dev/null first.
  for (int fd = 0; fd <= 2; ++fd)
    if (::fcntl(fd, F_GETFD) < 0) ::open("/dev/null", O_RDWR);

  Launcher launcher(parse_command_line(argc, argv));
  return launcher.run();
}
