// ddprun's command line (see ddprun.h): the usage text, the options and their strict checks, and
// the program looked up before anything starts. Every complaint is one line and exit code 2,
// never a half-started job.
//
// Apart from the rest because it is all that happens before ddprun touches a process: a reader
// looking for what an option means, or why a command line is refused, needs nothing else.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ddprun.h"

namespace ddprun {
namespace {

constexpr const char* kVersion = "ddprun 1.0 (DDP course kit)";

constexpr int kMaxRanks = 1024;      // each rank costs 3 file descriptors here

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

}  // namespace

// Every complaint about the command line is exactly one line on stderr and exit code 2, so a
// script (or a student) sees the reason at once and nothing ever waits on a half-started job.
[[noreturn]] void fail_usage(const std::string& message) {
  std::fprintf(stderr, "ddprun: %s\n", message.c_str());
  std::exit(kExitUsage);
}

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

}  // namespace ddprun
