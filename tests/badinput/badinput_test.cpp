// Bad input to the real trainer (ex01-solution) and launcher (ddprun): every mistake must end
// the process with a non-zero exit and ONE clear line on stderr, well within a timeout, never a
// hang. The programs run as subprocesses with a clean, explicit environment.
//
// No LibTorch in this file: it only starts programs and reads what they print.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

extern char** environ;

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// Quick settings: a tiny model and three steps. The tests are about failing, not training.
const std::vector<std::string> kQuick = {"--epochs", "1", "--max-steps", "3", "--d-model", "32",
                                         "--layers", "1", "--seq-len", "16"};

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> nonempty_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) out.push_back(line);
  return out;
}

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "kit-badinput-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// A TCP port nobody listens on right now (the kernel picks it).
int free_port() {
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

// The environment of every child: ours, minus anything that would make it a rank of some job
// or change the kit's behaviour, plus one intra-op thread (two cores are shared) and a tag that
// lets a test find every process it started.
std::string g_tag = "kit-badinput-" + std::to_string(::getpid());

std::map<std::string, std::string> clean_env(const std::map<std::string, std::string>& extra) {
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
  env["KIT_BADINPUT_TAG"] = g_tag;
  for (auto& [k, v] : extra) env[k] = v;
  return env;
}

std::map<std::string, std::string> rank_env(int rank, int world, int port,
                                            std::map<std::string, std::string> extra = {}) {
  extra["RANK"] = std::to_string(rank);
  extra["LOCAL_RANK"] = std::to_string(rank);
  extra["WORLD_SIZE"] = std::to_string(world);
  extra["LOCAL_WORLD_SIZE"] = std::to_string(world);
  extra["MASTER_ADDR"] = "127.0.0.1";
  extra["MASTER_PORT"] = std::to_string(port);
  return extra;
}

struct Result {
  int exit_code = -1;   // when it exited
  int signal = 0;       // when a signal ended it
  bool timed_out = false;
  double seconds = 0;
  std::string out, err;
  std::vector<std::string> err_lines() const { return nonempty_lines(err); }
};

std::ostream& operator<<(std::ostream& o, const Result& r) {
  return o << "exit " << r.exit_code << ", signal " << r.signal << (r.timed_out ? ", TIMED OUT" : "")
           << ", " << r.seconds << " s\n--- stderr ---\n" << r.err << "--- stdout ---\n" << r.out;
}

// One child process: its own process group (so a timeout kills everything it started),
// stdout/stderr into files (no pipe can fill up while we wait for another process).
class Process {
 public:
  Process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
          const fs::path& out_dir, const std::string& name)
      : out_(out_dir / (name + ".out")), err_(out_dir / (name + ".err")), start_(Clock::now()) {
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
  pid_t pid() const { return pid_; }

  // Waits until the process exits or `timeout_s` passed (then kills its process group).
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

std::vector<std::string> trainer(std::vector<std::string> args, bool quick = true) {
  std::vector<std::string> argv = {TRAINER_EXE};
  if (quick) argv.insert(argv.end(), kQuick.begin(), kQuick.end());
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// The common verdict: failed (exit code != 0, no signal, no timeout) with exactly one line on
// stderr that contains every one of `words`.
void expect_one_clear_line(const Result& r, std::initializer_list<std::string> words) {
  EXPECT_FALSE(r.timed_out) << r;
  EXPECT_EQ(r.signal, 0) << r;
  EXPECT_NE(r.exit_code, 0) << r;
  auto lines = r.err_lines();
  ASSERT_EQ(lines.size(), 1u) << "expected exactly one line on stderr\n" << r;
  for (auto& w : words) EXPECT_NE(lines[0].find(w), std::string::npos) << "'" << w << "' missing in: " << lines[0];
}

// Every process (still) carrying our tag, other than ourselves.
std::vector<pid_t> tagged_processes() {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  const std::string needle = "KIT_BADINPUT_TAG=" + g_tag;
  while (dirent* e = ::readdir(d)) {
    pid_t pid = std::atoi(e->d_name);
    if (pid <= 0 || pid == ::getpid()) continue;
    std::string env = read_file(fs::path("/proc") / e->d_name / "environ");
    std::string stat = read_file(fs::path("/proc") / e->d_name / "stat");
    bool zombie = stat.find(") Z ") != std::string::npos;
    for (size_t at = 0; !zombie && at < env.size();) {
      size_t end = env.find('\0', at);
      if (env.compare(at, end - at, needle) == 0) {
        out.push_back(pid);
        break;
      }
      if (end == std::string::npos) break;
      at = end + 1;
    }
  }
  ::closedir(d);
  return out;
}

// Children of `parent` whose environment has RANK=<rank>.
pid_t child_with_rank(pid_t parent, int rank) {
  DIR* d = ::opendir("/proc");
  pid_t found = -1;
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
    std::string env = read_file(fs::path("/proc") / e->d_name / "environ");
    if (env.find(std::string("\0RANK=", 6) + std::to_string(rank) + '\0') != std::string::npos ||
        env.rfind("RANK=" + std::to_string(rank) + '\0', 0) == 0)
      found = pid;
  }
  if (d) ::closedir(d);
  return found;
}

// ---------------------------------------------------------------------------------------------
// Data
// ---------------------------------------------------------------------------------------------

TEST(BadInput, MissingDataDirNamesTheDownloadScript) {
  TempDir tmp;
  const std::string missing = (tmp.path / "no-wikitext-here").string();
  Process p(trainer({"--data-dir", missing, "--out-dir", tmp.path.string()}), clean_env({}), tmp.path, "t");
  Result r = p.wait(20);
  expect_one_clear_line(r, {"common/data/download_wikitext2.sh", missing});
}

TEST(BadInput, CorruptDataWithNulBytes) {
  TempDir tmp;
  const fs::path data = tmp.path / "data";
  fs::create_directory(data);
  for (auto split : {"train", "valid", "test"}) {
    std::string name = std::string("wiki.") + split + ".tokens";
    fs::copy_file(fs::path(KIT_CORPUS_DIR) / name, data / name);
  }
  {  // NUL bytes in the middle of the training text, as a damaged copy would have them
    std::fstream f(data / "wiki.train.tokens", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1000);
    f.write("\0\0\0\0", 4);
  }
  Process p(trainer({"--data-dir", data.string(), "--out-dir", tmp.path.string()}), clean_env({}), tmp.path, "t");
  Result r = p.wait(20);
  expect_one_clear_line(r, {"wiki.train.tokens", "NUL"});
}

// ---------------------------------------------------------------------------------------------
// Rank environment and rendezvous
// ---------------------------------------------------------------------------------------------

TEST(BadInput, RankSetButWorldSizeNot) {
  TempDir tmp;
  auto env = rank_env(0, 2, free_port());
  env.erase("WORLD_SIZE");
  Process p(trainer({"--data-dir", KIT_CORPUS_DIR, "--out-dir", tmp.path.string()}), clean_env(env), tmp.path, "t");
  Result r = p.wait(20);
  expect_one_clear_line(r, {"WORLD_SIZE"});
  EXPECT_LT(r.seconds, 10) << r;
}

TEST(BadInput, WorldSizeDisagreesBetweenRanks) {
  TempDir tmp;
  const int port = free_port();
  auto args = trainer({"--data-dir", KIT_CORPUS_DIR, "--out-dir", tmp.path.string()});
  Process rank0(args, clean_env(rank_env(0, 2, port, {{"KIT_TIMEOUT", "10"}})), tmp.path, "r0");
  Process rank1(args, clean_env(rank_env(1, 3, port, {{"KIT_TIMEOUT", "10"}})), tmp.path, "r1");
  Result r1 = rank1.wait(25);
  Result r0 = rank0.wait(25);
  // Both sides stop, each with the same one-line diagnosis, long before the 10 s timeout.
  expect_one_clear_line(r0, {"WORLD_SIZE differs"});
  expect_one_clear_line(r1, {"WORLD_SIZE differs"});
  EXPECT_LT(r0.seconds, 8) << r0;
  EXPECT_LT(r1.seconds, 8) << r1;
}

TEST(BadInput, MasterPortAlreadyInUse) {
  TempDir tmp;
  // Occupy a port the way another job's rendezvous would: bound and listening on all addresses.
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(s, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(s, 4), 0);
  ASSERT_EQ(::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);

  Process p(trainer({"--data-dir", KIT_CORPUS_DIR, "--out-dir", tmp.path.string()}),
            clean_env(rank_env(0, 2, port, {{"KIT_TIMEOUT", "10"}})), tmp.path, "t");
  Result r = p.wait(25);
  ::close(s);
  expect_one_clear_line(r, {std::to_string(port), "in use"});
  EXPECT_LT(r.seconds, 8) << "should fail at once, not after the timeout\n" << r;
}

TEST(BadInput, RankThatNeverArrives) {
  TempDir tmp;
  Process p(trainer({"--data-dir", KIT_CORPUS_DIR, "--out-dir", tmp.path.string()}),
            clean_env(rank_env(0, 2, free_port(), {{"KIT_TIMEOUT", "3"}})), tmp.path, "t");
  Result r = p.wait(20);
  expect_one_clear_line(r, {"1 of 2 ranks joined", "missing: 1"});
  EXPECT_GE(r.seconds, 2.5) << "gave up before the 3 s timeout\n" << r;
  EXPECT_LT(r.seconds, 10) << r;
}

// ddprun, 2 ranks: once rank 1 is training, SIGKILL it. ddprun must notice, stop rank 0, exit
// non-zero and name rank 1; afterwards no process of the job may be left.
TEST(BadInput, RankDiesMidRun) {
  TempDir tmp;
  const fs::path trace = tmp.path / "trace";
  fs::create_directory(trace);
  std::vector<std::string> argv = {DDPRUN_EXE, "--nproc-per-node", "2", "--log-dir",
                                   (tmp.path / "logs").string(), "--"};
  // Many epochs: the job must still be running when we kill rank 1.
  for (auto& a : trainer({"--data-dir", KIT_CORPUS_DIR, "--out-dir", tmp.path.string(), "--epochs",
                          "100", "--max-steps", "0", "--d-model", "32", "--layers", "1", "--seq-len", "16"},
                         /*quick=*/false))
    argv.push_back(a);
  Process job(argv, clean_env({{"KIT_TRACE_DIR", trace.string()}, {"KIT_TIMEOUT", "20"}}), tmp.path, "ddprun");

  // Training has started on rank 1 when its trace shows a reduced backward pass.
  auto deadline = Clock::now() + std::chrono::seconds(30);
  while (read_file(trace / "rank1.trace").find("ddp_step") == std::string::npos && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_NE(read_file(trace / "rank1.trace").find("ddp_step"), std::string::npos)
      << "rank 1 never started training\n" << job.wait(1);
  const pid_t rank1 = child_with_rank(job.pid(), 1);
  const pid_t rank0 = child_with_rank(job.pid(), 0);
  ASSERT_GT(rank1, 0);
  ASSERT_GT(rank0, 0);
  ASSERT_EQ(::kill(rank1, SIGKILL), 0);

  Result r = job.wait(40);
  EXPECT_FALSE(r.timed_out) << r;
  EXPECT_EQ(r.signal, 0) << r;
  EXPECT_NE(r.exit_code, 0) << r;
  // ddprun's verdict names rank 1 (the one that died first), not rank 0 (the one it stopped).
  bool named = false;
  for (auto& line : r.err_lines())
    if (line.rfind("ddprun: rank", 0) == 0 && line.find("died") != std::string::npos) {
      named = true;
      EXPECT_NE(line.find("rank 1 "), std::string::npos) << line << "\n" << r;
      EXPECT_NE(line.find("SIGKILL"), std::string::npos) << line;
    }
  EXPECT_TRUE(named) << "ddprun did not say which rank died\n" << r;
  EXPECT_LT(r.seconds, 60) << r;
  // Nothing of the job survives ddprun.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_NE(::kill(rank0, 0), 0) << "rank 0 (pid " << rank0 << ") is still running";
  EXPECT_TRUE(tagged_processes().empty()) << "processes of the job are still running";
}

// ---------------------------------------------------------------------------------------------
// Flags
// ---------------------------------------------------------------------------------------------

TEST(BadInput, EpochsNotANumber) {
  TempDir tmp;
  Process p(trainer({"--data-dir", KIT_CORPUS_DIR, "--epochs", "abc"}), clean_env({}), tmp.path, "t");
  Result r = p.wait(20);
  expect_one_clear_line(r, {"--epochs", "abc"});
  EXPECT_EQ(r.exit_code, 2) << r;
}

TEST(BadInput, UnknownFlag) {
  TempDir tmp;
  Process p(trainer({"--data-dir", KIT_CORPUS_DIR, "--nope"}), clean_env({}), tmp.path, "t");
  Result r = p.wait(20);
  expect_one_clear_line(r, {"--nope"});
  EXPECT_EQ(r.exit_code, 2) << r;
}

// ---------------------------------------------------------------------------------------------
// Checkpoints: damaged, truncated or foreign ones are refused before anything is loaded
// ---------------------------------------------------------------------------------------------

// A run folder with one checkpoint (step-000000003, 2 ranks, the quick settings), made by a real
// 2-rank run under ddprun; each test damages its own copy.
fs::path checkpointed_run(const fs::path& dir) {
  const fs::path out = dir / "run";
  fs::create_directories(out);
  std::vector<std::string> argv = {DDPRUN_EXE, "--nproc-per-node", "2", "--"};
  for (auto& a : trainer({"--data-dir", KIT_CORPUS_DIR, "--out-dir", out.string()})) argv.push_back(a);
  Process p(argv, clean_env({}), dir, "make-checkpoint");
  Result r = p.wait(60);
  if (r.exit_code != 0 || !fs::exists(out / "checkpoints" / "step-000000003" / "MANIFEST"))
    ADD_FAILURE() << "could not make a checkpoint to damage\n" << r;
  return out;
}

fs::path checkpoint_dir(const fs::path& out) { return out / "checkpoints" / "step-000000003"; }

// Runs `ranks` ranks of the trainer (quick settings plus `extra`) on the run folder `out`, each
// rank a process of its own with its own stderr, and requires of every rank: a non-zero exit
// within seconds and exactly one line on stderr, "rank R: error: checkpoint <dir> ...", with
// every one of `words`. The checkpoint itself stays where it was.
void expect_refused(const fs::path& dir, const fs::path& out, int ranks,
                    std::initializer_list<std::string> words, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--data-dir", KIT_CORPUS_DIR, "--out-dir", out.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  const int port = free_port();
  std::vector<std::unique_ptr<Process>> procs;
  for (int r = 0; r < ranks; ++r)
    procs.push_back(std::make_unique<Process>(trainer(args), clean_env(rank_env(r, ranks, port, {{"KIT_TIMEOUT", "20"}})),
                                              dir, "rank" + std::to_string(r)));
  for (int r = 0; r < ranks; ++r) {
    Result res = procs[static_cast<size_t>(r)]->wait(40);
    SCOPED_TRACE("rank " + std::to_string(r));
    expect_one_clear_line(res, words);
    auto lines = res.err_lines();
    if (lines.size() == 1) {
      const std::string head = "rank " + std::to_string(r) + ": error: checkpoint " + checkpoint_dir(out).string() + " ";
      EXPECT_EQ(lines[0].rfind(head, 0), 0u) << "expected '" << head << "...', got: " << lines[0];
    }
    EXPECT_LT(res.seconds, 15) << res;
    EXPECT_EQ(res.out.find("resuming from"), std::string::npos) << res;
  }
  EXPECT_TRUE(fs::exists(checkpoint_dir(out) / "MANIFEST")) << "the refused checkpoint must stay";
}

void overwrite(const fs::path& file, std::streamoff at, const std::string& bytes) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(at);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(BadInput, CorruptCheckpoint) {
  TempDir tmp;
  const fs::path out = checkpointed_run(tmp.path);
  const fs::path state = checkpoint_dir(out) / "state.pt";
  overwrite(state, static_cast<std::streamoff>(fs::file_size(state) / 2), std::string(64, 'x'));
  expect_refused(tmp.path, out, 2, {"is damaged", "state.pt fails its checksum", "nothing was loaded"});
}

TEST(BadInput, TruncatedCheckpoint) {
  TempDir tmp;
  const fs::path out = checkpointed_run(tmp.path);
  const fs::path state = checkpoint_dir(out) / "state.pt";
  const auto size = fs::file_size(state);
  fs::resize_file(state, size / 2);
  expect_refused(tmp.path, out, 2,
                 {"is damaged", "state.pt has " + std::to_string(size / 2) + " of " + std::to_string(size) + " bytes",
                  "nothing was loaded"});
}

// Rank 1's random-number state is cut short: rank 0 refuses too (its own files are fine), so
// that no rank ever trains on from a checkpoint that another rank cannot load.
TEST(BadInput, TruncatedCheckpointOfAnotherRank) {
  TempDir tmp;
  const fs::path out = checkpointed_run(tmp.path);
  fs::resize_file(checkpoint_dir(out) / "rng-rank1.bin", 100);
  expect_refused(tmp.path, out, 2, {"is damaged", "rng-rank1.bin has 100 of", "nothing was loaded"});
}

TEST(BadInput, CheckpointWithDamagedManifest) {
  TempDir tmp;
  const fs::path out = checkpointed_run(tmp.path);
  overwrite(checkpoint_dir(out) / "MANIFEST", 0, "garbage");
  expect_refused(tmp.path, out, 2, {"has no valid MANIFEST", "nothing was loaded"});
}

TEST(BadInput, CheckpointOfAnotherModel) {
  TempDir tmp;
  const fs::path out = checkpointed_run(tmp.path);
  expect_refused(tmp.path, out, 2,
                 {"was written for another configuration", "d_model=32", "d_model=64", "nothing was loaded"},
                 {"--d-model", "64"});
}

TEST(BadInput, CheckpointOfAnotherRankCount) {
  TempDir tmp;
  const fs::path out = checkpointed_run(tmp.path);
  expect_refused(tmp.path, out, 3, {"was written by 2 ranks; this run has 3", "nothing was loaded"});
}

TEST(BadInput, ResumeWithoutCheckpoint) {
  TempDir tmp;
  Process p(trainer({"--data-dir", KIT_CORPUS_DIR, "--out-dir", tmp.path.string(), "--resume"}), clean_env({}),
            tmp.path, "t");
  Result r = p.wait(20);
  expect_one_clear_line(r, {"--resume: no checkpoint in " + (tmp.path / "checkpoints").string()});
  EXPECT_LT(r.seconds, 15) << r;
}

}  // namespace
