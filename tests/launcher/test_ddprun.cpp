// Tests of ddprun, the kit's local launcher. Each test runs the real ddprun binary on
// launcher_probe (a fake trainer whose behaviour is chosen on its command line) and checks
// what actually happened: the environment each rank saw, the files and output they produced,
// the exit status, and -- by pid -- whether any process was left behind.
//
// Nothing here uses a fixed port, and every wait has a deadline, so a broken ddprun makes a
// test fail rather than hang.

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;

const std::string kDdprun = DDPRUN_EXE;
const std::string kProbe = PROBE_EXE;

double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

bool wait_until(const std::function<bool()>& condition, double timeout_s) {
  double end = now() + timeout_s;
  while (!condition()) {
    if (now() > end) return false;
    sleep_s(0.01);
  }
  return true;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::string line;
  std::istringstream in(text);
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

// "One clear line": non-empty, a single '\n' at the very end, starting with "ddprun: ".
::testing::AssertionResult IsOneDdprunLine(const std::string& text) {
  if (text.rfind("ddprun: ", 0) != 0 || text.back() != '\n' ||
      text.find('\n') != text.size() - 1)
    return ::testing::AssertionFailure() << "expected one line starting with 'ddprun: ', got:\n"
                                         << text;
  return ::testing::AssertionSuccess();
}

// Is the process still there? A zombie counts as gone: it runs nothing and holds nothing, and
// in a container whose PID 1 does not reap orphans it may stay a zombie for a long time.
bool alive(pid_t pid) {
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty()) return false;
  size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return false;
  char state = stat[paren + 2];
  return state != 'Z' && state != 'X';
}

bool all_gone(const std::vector<pid_t>& pids, double timeout_s) {
  return wait_until([&] {
    for (pid_t p : pids)
      if (alive(p)) return false;
    return true;
  }, timeout_s);
}

pid_t read_pid(const std::string& path) {
  return static_cast<pid_t>(std::atol(read_file(path).c_str()));
}

// A port nobody uses right now, found the same way ddprun does it.
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

struct Result {
  int exit_code = -1;   // -1 when killed by a signal
  int signal = 0;
  bool timed_out = false;
  double seconds = 0;
  std::string out, err;
};

// ddprun running in the background, its stdout/stderr going to files (files rather than
// pipes: nobody has to keep reading them while the test waits for something else).
class Launch {
 public:
  Launch(const std::string& dir, const std::vector<std::string>& args,
         const std::map<std::string, std::optional<std::string>>& env_changes = {})
      : out_path_(dir + "/ddprun.out"), err_path_(dir + "/ddprun.err") {
    std::vector<std::string> argv_s{kDdprun};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<std::string> env_s;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string entry = *e;
      if (env_changes.count(entry.substr(0, entry.find('='))) == 0) env_s.push_back(entry);
    }
    for (auto& [k, v] : env_changes)
      if (v) env_s.push_back(k + "=" + *v);
    std::vector<char*> argv, envp;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);

    int out = ::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int err = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    start_ = now();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out, 1);
      ::dup2(err, 2);
      int null = ::open("/dev/null", O_RDONLY);
      ::dup2(null, 0);
      ::execve(argv[0], argv.data(), envp.data());
      _exit(126);
    }
    ::close(out);
    ::close(err);
  }

  ~Launch() {
    if (!waited_) {  // a failed assertion left it running: do not leak it
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }
  std::string err_so_far() const { return read_file(err_path_); }

  Result wait(double timeout_s = 20) {
    Result r;
    int status = 0;
    double end = start_ + timeout_s;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (now() > end) {
        r.timed_out = true;
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      sleep_s(0.005);
    }
    waited_ = true;
    r.seconds = now() - start_;
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
    r.out = read_file(out_path_);
    r.err = read_file(err_path_);
    return r;
  }

 private:
  std::string out_path_, err_path_;
  pid_t pid_ = -1;
  double start_ = 0;
  bool waited_ = false;
};

class Ddprun : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "ddprun-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  Result run(const std::vector<std::string>& args,
             const std::map<std::string, std::optional<std::string>>& env = {},
             double timeout_s = 20) {
    Launch l(dir_, args, env);
    return l.wait(timeout_s);
  }

  bool wait_for_pidfiles(int n, double timeout_s = 10) {
    return wait_until([&] {
      for (int r = 0; r < n; ++r)
        if (!fs::exists(pidfile(r))) return false;
      return true;
    }, timeout_s);
  }
  std::string pidfile(int r) const { return dir_ + "/rank" + std::to_string(r) + ".pid"; }
  std::vector<pid_t> rank_pids(int n) const {
    std::vector<pid_t> pids;
    for (int r = 0; r < n; ++r) pids.push_back(read_pid(pidfile(r)));
    return pids;
  }

  std::string dir_;
};

// Parses "[rank R] KEY=VALUE" lines into one map per tag.
std::map<int, std::map<std::string, std::string>> env_by_rank(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> result;
  std::regex line_re(R"(\[rank (\d+)\] ([A-Z_]+)=(.*))");
  for (auto& line : lines_of(out)) {
    std::smatch m;
    if (std::regex_match(line, m, line_re)) result[std::stoi(m[1])][m[2]] = m[3];
  }
  return result;
}

// --- The environment each rank gets --------------------------------------------------------

TEST_F(Ddprun, EachRankGetsItsOwnRankAndTheSharedWorld) {
  Result r = run({"--nproc-per-node", "4", "--tag-output", kProbe, "print-env"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  auto env = env_by_rank(r.out);
  ASSERT_EQ(env.size(), 4u) << r.out;
  std::set<std::string> pids;
  for (int rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    auto& e = env[rank];
    EXPECT_EQ(e["RANK"], std::to_string(rank));
    EXPECT_EQ(e["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(e["WORLD_SIZE"], "4");
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "4");
    EXPECT_EQ(e["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(e["GROUP_RANK"], "0");
    EXPECT_EQ(e["MASTER_PORT"], env[0]["MASTER_PORT"]) << "all ranks must meet at one port";
    pids.insert(e["PID"]);
  }
  EXPECT_EQ(pids.size(), 4u) << "four distinct processes";
  int port = std::atoi(env[0]["MASTER_PORT"].c_str());
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
}

TEST_F(Ddprun, InheritedVariablesPassThroughAndStaleRankVariablesAreReplaced) {
  Result r = run({"--nproc-per-node", "2", "--tag-output", kProbe, "print-env"},
                 {{"DDPRUN_TEST_MARKER", "kept"}, {"SLURM_PROCID", "7"}, {"RANK", "77"},
                  {"WORLD_SIZE", "99"}, {"MASTER_PORT", "1"}});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto env = env_by_rank(r.out);
  ASSERT_EQ(env.size(), 2u) << r.out;
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(env[rank]["DDPRUN_TEST_MARKER"], "kept");
    EXPECT_EQ(env[rank]["SLURM_PROCID"], "7") << "Slurm variables are left alone";
    EXPECT_EQ(env[rank]["RANK"], std::to_string(rank));
    EXPECT_EQ(env[rank]["RANK_ENTRIES"], "1") << "RANK must be replaced, not added twice";
    EXPECT_EQ(env[rank]["WORLD_SIZE"], "2");
    EXPECT_NE(env[rank]["MASTER_PORT"], "1");
  }
}

TEST_F(Ddprun, DefaultIsTwoRanks) {
  Result r = run({"--tag-output", kProbe, "print-env"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto env = env_by_rank(r.out);
  ASSERT_EQ(env.size(), 2u) << r.out;
  EXPECT_EQ(env[0]["WORLD_SIZE"], "2");
  EXPECT_EQ(env[1]["RANK"], "1");
}

TEST_F(Ddprun, ExplicitAddressAndPortReachTheRanks) {
  int port = free_port();
  Result r = run({"--nproc-per-node=3", "--master-addr=localhost", "--master-port",
                  std::to_string(port), "--tag-output", kProbe, "print-env"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto env = env_by_rank(r.out);
  ASSERT_EQ(env.size(), 3u) << r.out;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(env[rank]["MASTER_ADDR"], "localhost");
    EXPECT_EQ(env[rank]["MASTER_PORT"], std::to_string(port));
  }
}

// --- The rendezvous port ---------------------------------------------------------------------

TEST_F(Ddprun, PickedPortIsFreeForRank0ToListenOn) {
  Result r = run({"--nproc-per-node", "2", kProbe, "rank", "0", "bind-master-port"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;  // rank 0 exits 5 if it cannot listen there
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(LISTENING=127\.0\.0\.1:(\d+))"))) << r.out;
  int port = std::stoi(m[1]);
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
}

TEST_F(Ddprun, PortInUseIsRefusedWithOneLine) {
  // Occupy a port the way a running TCPStore would: bound and listening.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  std::string port = std::to_string(ntohs(a.sin_port));

  Result r = run({"--master-port", port, kProbe, "pidfile", dir_});
  ::close(fd);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(IsOneDdprunLine(r.err));
  EXPECT_EQ(r.err.rfind("ddprun: MASTER_PORT " + port + " on 127.0.0.1 is in use", 0), 0u) << r.err;
  EXPECT_FALSE(fs::exists(pidfile(0))) << "no rank may start";
}

// --- Output ----------------------------------------------------------------------------------

TEST_F(Ddprun, LogFilesHoldEachRanksOutput) {
  std::string logs = dir_ + "/logs/nested";  // does not exist yet
  Result r = run({"--nproc-per-node", "2", "--log-dir", logs, kProbe,
                  "rank", "0", "say", "zero-out", "rank", "1", "say", "one-out",
                  "rank", "0", "say-err", "zero-err", "rank", "1", "say-err", "one-err"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::string log0 = read_file(logs + "/rank0.log"), log1 = read_file(logs + "/rank1.log");
  EXPECT_NE(log0.find("zero-out\n"), std::string::npos) << log0;
  EXPECT_NE(log0.find("zero-err\n"), std::string::npos) << log0;
  EXPECT_EQ(log0.find("one-"), std::string::npos) << log0;
  EXPECT_NE(log1.find("one-out\n"), std::string::npos) << log1;
  EXPECT_NE(log1.find("one-err\n"), std::string::npos) << log1;
  EXPECT_EQ(log1.find("zero-"), std::string::npos) << log1;
  // ...and the output still reaches ddprun's own stdout and stderr.
  EXPECT_NE(r.out.find("zero-out\n"), std::string::npos);
  EXPECT_NE(r.out.find("one-out\n"), std::string::npos);
  EXPECT_EQ(r.out.find("-err"), std::string::npos) << "stderr lines belong on stderr";
  EXPECT_NE(r.err.find("zero-err\n"), std::string::npos);
  EXPECT_NE(r.err.find("one-err\n"), std::string::npos);
}

TEST_F(Ddprun, LinesOfDifferentRanksNeverInterleave) {
  // ~1 MB in total: many times a pipe's capacity, so ddprun must keep draining all ranks.
  const int kRanks = 3, kLines = 3000;
  Result r = run({"--nproc-per-node", std::to_string(kRanks), "--tag-output", "--log-dir",
                  dir_ + "/logs", kProbe, "spam", std::to_string(kLines)});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::regex line_re(R"(\[rank (\d)\] (\d):(\d+):x{100})");
  std::vector<int> next(kRanks, 0);
  int bad = 0;
  for (auto& line : lines_of(r.out)) {
    std::smatch m;
    if (!std::regex_match(line, m, line_re) || m[1] != m[2]) {
      if (++bad <= 3) ADD_FAILURE() << "mangled line: " << line.substr(0, 200);
      continue;
    }
    int rank = std::stoi(m[1]);
    EXPECT_EQ(std::stoi(m[3]), next[rank]) << "lines of one rank must stay in order";
    next[rank] = std::stoi(m[3]) + 1;
  }
  EXPECT_EQ(bad, 0);
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(next[rank], kLines) << "rank " << rank;
    EXPECT_EQ(lines_of(read_file(dir_ + "/logs/rank" + std::to_string(rank) + ".log")).size(),
              static_cast<size_t>(kLines));
  }
}

// --prefix-ranks is torchrun's --tee/--role-style prefix under the kit's own name: every line,
// stdout and stderr alike, starts with the rank that wrote it, and nothing else changes.
TEST_F(Ddprun, PrefixRanksStartsEveryLineWithItsRank) {
  Result plain = run({"--nproc-per-node", "2", kProbe, "spam", "3"});
  Result tagged = run({"--nproc-per-node", "2", "--prefix-ranks", kProbe, "spam", "3"});
  ASSERT_FALSE(plain.timed_out || tagged.timed_out);
  EXPECT_EQ(tagged.exit_code, 0) << tagged.err;
  auto before = lines_of(plain.out), after = lines_of(tagged.out);
  ASSERT_EQ(after.size(), 6u) << tagged.out;
  ASSERT_EQ(before.size(), after.size());
  std::multiset<std::string> expected, got;
  for (auto& line : before) {
    // The probe's "spam" lines start with the writer's rank: "R:N:xxx".
    expected.insert("[rank " + line.substr(0, line.find(':')) + "] " + line);
    EXPECT_EQ(line.rfind("[rank ", 0), std::string::npos) << "no prefix unless asked: " << line;
  }
  for (auto& line : after) got.insert(line);
  EXPECT_EQ(got, expected);
}

TEST_F(Ddprun, UnterminatedLastLineIsFlushedOnItsOwnLine) {
  Result r = run({"--nproc-per-node", "2", "--tag-output", kProbe, "partial", "no-newline"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto lines = lines_of(r.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"[rank 0] no-newline", "[rank 1] no-newline"}));
}

TEST_F(Ddprun, SuccessfulJobPrintsNothingExtra) {
  Result r = run({"--nproc-per-node", "3", kProbe, "say", "ok"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "ok\nok\nok\n");
  EXPECT_EQ(r.err, "");
}

TEST_F(Ddprun, ProgramOptionsAreLeftToTheProgram) {
  // The first non-option word is the program; what follows is its business, even if it looks
  // like a ddprun option. "--" also ends ddprun's options.
  Result r = run({"--nproc-per-node", "1", kProbe, "say", "--tag-output"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "--tag-output\n");
  r = run({"--nproc-per-node", "1", "--", kProbe, "say", "after-dashes"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "after-dashes\n");
}

// --- A rank fails ----------------------------------------------------------------------------

TEST_F(Ddprun, RankKilledBySigkillStopsTheWholeJob) {
  // Rank 2 waits until everybody is up, then SIGKILLs itself; the others would sleep 30 s.
  Result r = run({"--nproc-per-node", "4", "--grace", "2", kProbe, "pidfile", dir_,
                  "rank", "2", "await-pidfiles", dir_, "4", "rank", "2", "kill-self", "9",
                  "sleep", "30"});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_LT(r.seconds, 10);
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  ASSERT_TRUE(wait_for_pidfiles(4, 0));
  auto pids = rank_pids(4);
  EXPECT_TRUE(IsOneDdprunLine(r.err));
  EXPECT_NE(r.err.find("rank 2 (pid " + std::to_string(pids[2]) +
                       ") died: killed by signal 9 (SIGKILL); stopping the other 3 ranks"),
            std::string::npos) << r.err;
  EXPECT_TRUE(all_gone(pids, 3)) << "every rank must be gone";
}

TEST_F(Ddprun, RankAbortedIsNamedAsAborted) {
  // What c10d's NCCL watchdog does to a rank whose collective timed out: a line on the rank's
  // stderr, then abort(). ddprun's one line names the rank and says that it aborted itself.
  Result r = run({"--nproc-per-node", "2", "--grace", "2", kProbe, "pidfile", dir_, "rank", "1",
                  "await-pidfiles", dir_, "2", "rank", "1", "abort",
                  "[Rank 1] Watchdog caught collective operation timeout", "sleep", "30"});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_LT(r.seconds, 10);
  EXPECT_EQ(r.exit_code, 128 + SIGABRT) << r.err;
  ASSERT_TRUE(wait_for_pidfiles(2, 0));
  auto pids = rank_pids(2);
  EXPECT_NE(r.err.find("Watchdog caught collective operation timeout"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ddprun: rank 1 (pid " + std::to_string(pids[1]) +
                       ") died: killed by signal 6 (SIGABRT): the rank aborted itself (on GPUs "
                       "usually NCCL's watchdog, after a collective timed out or failed: see the "
                       "rank's stderr above); stopping the other 1 rank"),
            std::string::npos) << r.err;
  EXPECT_TRUE(all_gone(pids, 3));
}

TEST_F(Ddprun, RankExitingWithCode3StopsTheWholeJob) {
  Result r = run({"--nproc-per-node", "4", "--grace", "2", kProbe, "pidfile", dir_,
                  "rank", "1", "await-pidfiles", dir_, "4", "rank", "1", "exit", "3",
                  "sleep", "30"});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_LT(r.seconds, 10);
  EXPECT_EQ(r.exit_code, 1);
  ASSERT_TRUE(wait_for_pidfiles(4, 0));
  auto pids = rank_pids(4);
  EXPECT_TRUE(IsOneDdprunLine(r.err));
  EXPECT_NE(r.err.find("rank 1 (pid " + std::to_string(pids[1]) +
                       ") died: exited with code 3; stopping the other 3 ranks"),
            std::string::npos) << r.err;
  EXPECT_TRUE(all_gone(pids, 3));
}

// A rank that has ended and that ddprun has not reaped yet (it reaps only at the very end).
bool is_zombie(pid_t pid) {
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  size_t paren = stat.rfind(')');
  return paren != std::string::npos && stat.size() > paren + 2 && stat[paren + 2] == 'Z';
}

// The verdict of the two tests below: rank 3, SIGKILLed while rank 0 exited with code 1, is the
// rank ddprun names, in its one line, and the job is gone.
void ExpectRank3NamedAsKilled(Launch& l, const std::vector<pid_t>& pids) {
  Result r = l.wait();
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.err;
  EXPECT_TRUE(IsOneDdprunLine(r.err)) << r.err;
  EXPECT_NE(r.err.find("rank 3 (pid " + std::to_string(pids[3]) + ") died: killed by signal 9"),
            std::string::npos) << r.err;
  EXPECT_TRUE(all_gone(pids, 3));
}

TEST_F(Ddprun, TheRankKilledBySignalIsNamedWhenItsPeersDieInTheSameInstant) {
  // Rank 3 is SIGKILLed and rank 0's collective fails at once (exit 1). When ddprun notices both
  // in the same look -- on a loaded machine it often does -- the signal is the cause, and the
  // message must name rank 3, not the lower rank number. ddprun is held with SIGSTOP while both
  // die, so that this test does not depend on timing.
  Launch l(dir_, {"--nproc-per-node", "4", "--grace", "2", kProbe, "rank", "0", "exit-on", "10",
                  "1", "pidfile", dir_, "await-pidfiles", dir_, "4", "sleep", "30"});
  ASSERT_TRUE(wait_for_pidfiles(4)) << l.err_so_far();
  auto pids = rank_pids(4);
  ASSERT_EQ(::kill(l.pid(), SIGSTOP), 0);
  ::kill(pids[3], SIGKILL);
  ::kill(pids[0], SIGUSR1);
  bool both = wait_until([&] { return is_zombie(pids[0]) && is_zombie(pids[3]); }, 5);
  ::kill(l.pid(), SIGCONT);
  ASSERT_TRUE(both) << "ranks 0 and 3 did not both end";
  ExpectRank3NamedAsKilled(l, pids);
}

TEST_F(Ddprun, TheRankKilledBySignalIsNamedWhenAPeersErrorIsSeenFirst) {
  // The same, on a busy machine: the killed rank's sockets close before the kernel reports its
  // death, so a peer's error exit can be seen first. Here rank 0 exits with code 1, and rank 3 is
  // SIGKILLed 50 ms after ddprun could see that: ddprun waits for such a death before it names
  // the culprit, and names rank 3.
  Launch l(dir_, {"--nproc-per-node", "4", "--grace", "2", kProbe, "rank", "0", "exit-on", "10",
                  "1", "pidfile", dir_, "await-pidfiles", dir_, "4", "sleep", "30"});
  ASSERT_TRUE(wait_for_pidfiles(4)) << l.err_so_far();
  auto pids = rank_pids(4);
  ::kill(pids[0], SIGUSR1);
  const bool gone = wait_until([&] { return is_zombie(pids[0]); }, 5);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ::kill(pids[3], SIGKILL);
  ASSERT_TRUE(gone) << "rank 0 did not end";
  ExpectRank3NamedAsKilled(l, pids);
}

TEST_F(Ddprun, RankIgnoringSigtermIsKilledAfterTheGracePeriod) {
  // Rank 0 ignores SIGTERM (a trainer stuck in a collective behaves much the same).
  Result r = run({"--nproc-per-node", "2", "--grace", "1", kProbe, "pidfile", dir_,
                  "rank", "0", "ignore", "15", "rank", "1", "await-pidfiles", dir_, "2",
                  "rank", "1", "exit", "3", "sleep", "30"});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_GE(r.seconds, 0.9) << "SIGKILL must wait for the grace period";
  EXPECT_LT(r.seconds, 8);
  EXPECT_NE(r.err.find("rank 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("SIGKILL"), std::string::npos) << r.err;
  ASSERT_TRUE(wait_for_pidfiles(2, 0));
  EXPECT_TRUE(all_gone(rank_pids(2), 3));
}

TEST_F(Ddprun, StoppingAlsoKillsWhatTheRanksStarted) {
  // Rank 0 starts a background sleeper (a data-loader worker, say) that ignores SIGTERM, then
  // rank 1 fails. Rank 0 itself dies of the SIGTERM at once, so the sleeper is only taken
  // down if ddprun sweeps the rank's whole process group before it exits.
  Result r = run({"--nproc-per-node", "2", "--grace", "2", kProbe,
                  "rank", "0", "ignore", "15", "rank", "0", "spawn-sleeper", dir_, "30",
                  "rank", "0", "default", "15", "pidfile", dir_,
                  "rank", "1", "await-pidfiles", dir_, "2", "rank", "1", "exit", "3",
                  "sleep", "30"});
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 1);
  pid_t sleeper = read_pid(dir_ + "/rank0.child.pid");
  ASSERT_GT(sleeper, 0);
  bool gone = all_gone({sleeper}, 3);
  if (!gone) ::kill(sleeper, SIGKILL);
  EXPECT_TRUE(gone) << "the rank's process group must be taken down with it";
}

TEST_F(Ddprun, BackgroundChildHoldingTheOutputPipeDoesNotHang) {
  // The rank exits 0 but leaves a child that keeps its stdout open for 20 s: ddprun must not
  // wait for EOF on that pipe.
  Result r = run({"--nproc-per-node", "1", kProbe, "spawn-sleeper", dir_, "20", "say", "done"});
  pid_t sleeper = read_pid(dir_ + "/rank0.child.pid");
  if (sleeper > 0) ::kill(sleeper, SIGKILL);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "done\n");
  EXPECT_LT(r.seconds, 5);
}

// --- Signals sent to ddprun ------------------------------------------------------------------

TEST_F(Ddprun, SigtermAndSigintAreForwardedToEveryRankAndStopTheJob) {
  for (int sig : {SIGTERM, SIGINT}) {
    SCOPED_TRACE(sig == SIGTERM ? "SIGTERM" : "SIGINT");
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // The ranks record the signal and then exit 0, as a trainer that shuts down cleanly would.
    Launch l(dir_, {"--nproc-per-node", "3", kProbe, "record-signals", dir_, "pidfile", dir_,
                    "sleep", "30"});
    ASSERT_TRUE(wait_for_pidfiles(3)) << l.err_so_far();
    auto pids = rank_pids(3);
    ::kill(l.pid(), sig);
    Result r = l.wait(15);
    ASSERT_FALSE(r.timed_out) << r.err;
    EXPECT_EQ(r.exit_code, 128 + sig) << "stopped by a signal: non-zero even if ranks exit 0";
    EXPECT_LT(r.seconds, 5) << "ranks exited at once, no need to wait for the grace period";
    const char* name = sig == SIGTERM ? "SIGTERM\n" : "SIGINT\n";
    for (int rank = 0; rank < 3; ++rank)
      EXPECT_EQ(read_file(dir_ + "/rank" + std::to_string(rank) + ".signals"), name)
          << "rank " << rank;
    EXPECT_TRUE(all_gone(pids, 3));
  }
}

TEST_F(Ddprun, Usr1Usr2AndHupAreForwardedAndTheJobCarriesOn) {
  Launch l(dir_, {"--nproc-per-node", "2", kProbe, "record-signals", dir_, "pidfile", dir_,
                  "await-signals", "3", "say", "finished"});
  ASSERT_TRUE(wait_for_pidfiles(2)) << l.err_so_far();
  std::string expected;
  for (int sig : {SIGUSR1, SIGUSR2, SIGHUP}) {
    ::kill(l.pid(), sig);
    expected += sig == SIGUSR1 ? "SIGUSR1\n" : sig == SIGUSR2 ? "SIGUSR2\n" : "SIGHUP\n";
    // One at a time: two different signals pending at once may be delivered in either order.
    EXPECT_TRUE(wait_until([&] {
      return read_file(dir_ + "/rank0.signals") == expected &&
             read_file(dir_ + "/rank1.signals") == expected;
    }, 10)) << "after signal " << sig;
  }
  Result r = l.wait(15);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "finished\nfinished\n") << "both ranks ran to the end";
  EXPECT_NE(r.err.find("forwarded SIGUSR1 to 2 ranks"), std::string::npos) << r.err;
}

TEST_F(Ddprun, SecondSigintKillsAtOnce) {
  // The ranks ignore SIGINT and SIGTERM and the grace period is long: only SIGKILL helps.
  Launch l(dir_, {"--nproc-per-node", "2", "--grace", "60", kProbe, "ignore", "2",
                  "ignore", "15", "pidfile", dir_, "sleep", "30"});
  ASSERT_TRUE(wait_for_pidfiles(2)) << l.err_so_far();
  auto pids = rank_pids(2);
  ::kill(l.pid(), SIGINT);
  // Wait until the first one was handled: two SIGINTs pending at once would merge into one.
  ASSERT_TRUE(wait_until(
      [&] { return l.err_so_far().find("received SIGINT") != std::string::npos; }, 10));
  ::kill(l.pid(), SIGINT);
  Result r = l.wait(10);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 128 + SIGINT);
  EXPECT_LT(r.seconds, 5);
  EXPECT_TRUE(all_gone(pids, 3));
}

TEST_F(Ddprun, RanksDieWhenDdprunIsKilled) {
  // SIGKILL cannot be caught: only PR_SET_PDEATHSIG keeps the ranks from living on.
  Launch l(dir_, {"--nproc-per-node", "3", kProbe, "pidfile", dir_, "sleep", "30"});
  ASSERT_TRUE(wait_for_pidfiles(3)) << l.err_so_far();
  auto pids = rank_pids(3);
  ::kill(l.pid(), SIGKILL);
  Result r = l.wait(10);
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_TRUE(all_gone(pids, 3));
}

// --- Bad command lines -----------------------------------------------------------------------

TEST_F(Ddprun, BadCommandLinesExitWith2AndOneLine) {
  std::string not_executable = dir_ + "/plain.txt";
  std::ofstream(not_executable) << "not a program\n";
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"--bogus", kProbe},
      {"-x", kProbe},
      {"--nproc-per-node", "0", kProbe},
      {"--nproc-per-node", "abc", kProbe},
      {"--nproc-per-node=-1", kProbe},
      {"--nproc-per-node=2x", kProbe},
      {"--nproc-per-node", "100000", kProbe},
      {"--nproc-per-node"},
      {"--nproc-per-node", "2"},
      {"--"},
      {"--master-port", "70000", kProbe},
      {"--master-port", "port", kProbe},
      {"--master-addr", "192.0.2.1", kProbe},  // TEST-NET: not an address of this machine
      {"--grace", "soon", kProbe},
      {"--grace", "-1", kProbe},
      {"--tag-output=yes", kProbe},
      {"--log-dir", not_executable + "/sub", kProbe},
      {"/nonexistent/dir/program"},
      {"ddprun-test-no-such-program"},
      {not_executable},
      {dir_},
  };
  for (auto& args : cases) {
    std::string joined;
    for (auto& a : args) joined += " " + a;
    SCOPED_TRACE("ddprun" + joined);
    Result r = run(args, {}, 10);
    ASSERT_FALSE(r.timed_out);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_TRUE(IsOneDdprunLine(r.err));
    EXPECT_EQ(r.out, "");
  }
}

TEST_F(Ddprun, HelpAndVersion) {
  Result r = run({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.rfind("usage: ddprun", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("exit status"), std::string::npos);
  EXPECT_EQ(r.err, "");
  r = run({"--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.rfind("ddprun ", 0), 0u) << r.out;
}

}  // namespace
