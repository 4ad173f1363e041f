// The rank-0 helpers of kit/runtime/distributed.h (save0, print0) and kit::all_reduce, on real
// ranks: separate processes started by ddprun, each joining with kit::setup() as a trainer does,
// since these helpers use the default group that setup() makes. tests/unit/rank0_probe.cpp is the
// program; this test starts it and judges what can be seen from outside: the combined output,
// the file and, for save0, the file system's own record of who wrote what (inotify). Also what
// a whole process does (kit/runtime/process.h): how an uncaught exception ends a rank, on its main
// thread or on another one as c10d's NCCL watchdog throws, and glibc's malloc settings, and
// subgroups (kit::new_group) in a job of processes.
//
// No LibTorch in this file: it only starts programs and reads what they leave behind.
#include <sys/inotify.h>
#include <unistd.h>

#include <cmath>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "child_process.h"  // Process, Result, TempDir, clean_env (tests/support)

namespace fs = std::filesystem;

namespace {

using kit_test::Process;
using kit_test::Result;

const std::string g_tag = "kit-rank0-" + std::to_string(::getpid());

// ddprun --nproc-per-node n --tag-output -- rank0_probe args..., with a clean environment and a
// collective timeout far below the test's, so that a rank left waiting fails instead of hanging.
Result run_probe(int n, const std::vector<std::string>& args, const fs::path& dir,
                 const std::map<std::string, std::string>& env = {{"KIT_TIMEOUT", "20"}}) {
  std::vector<std::string> argv = {DDPRUN_EXE, "--nproc-per-node", std::to_string(n),
                                   "--tag-output", "--", PROBE_EXE};
  argv.insert(argv.end(), args.begin(), args.end());
  Process p(argv, kit_test::clean_env("KIT_RANK0_TAG", g_tag, env), dir, "ddprun");
  return p.wait(45);
}

// The lines of `text` that match `re`, each as its submatches (copied: a std::smatch points
// into the line it matched).
using Match = std::vector<std::string>;
std::vector<Match> matches(const std::string& text, const std::regex& re) {
  std::vector<Match> out;
  for (auto& line : kit_test::nonempty_lines(text)) {
    std::smatch m;
    if (std::regex_search(line, m, re)) out.emplace_back(m.begin(), m.end());
  }
  return out;
}

// "rank R pid P", printed by every rank right after setup().
std::map<int, int> pid_to_rank(const std::string& out) {
  std::map<int, int> ranks;
  for (auto& m : matches(out, std::regex(R"(\] rank (\d+) pid (\d+)$)")))
    ranks[std::stoi(m[2])] = std::stoi(m[1]);
  return ranks;
}

// What the kernel saw happen in one folder: files closed after writing, and renames (from -> to).
struct FolderEvents {
  std::vector<std::string> written;
  std::vector<std::pair<std::string, std::string>> renamed;
};

class FolderWatch {
 public:
  explicit FolderWatch(const fs::path& dir) {
    fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd_ < 0 || ::inotify_add_watch(fd_, dir.c_str(), IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO) < 0)
      throw std::runtime_error("inotify cannot watch " + dir.string());
  }
  ~FolderWatch() { ::close(fd_); }
  FolderEvents events() {
    FolderEvents out;
    std::map<uint32_t, std::string> moved_from;  // rename cookie -> old name
    alignas(inotify_event) char buffer[1 << 16];
    for (ssize_t n; (n = ::read(fd_, buffer, sizeof buffer)) > 0;)
      for (char* p = buffer; p < buffer + n;) {
        auto* e = reinterpret_cast<inotify_event*>(p);
        std::string name = e->len ? e->name : "";
        if (e->mask & IN_Q_OVERFLOW) throw std::runtime_error("inotify lost events");
        if (e->mask & IN_CLOSE_WRITE) out.written.push_back(name);
        if (e->mask & IN_MOVED_FROM) moved_from[e->cookie] = name;
        if (e->mask & IN_MOVED_TO) out.renamed.emplace_back(moved_from[e->cookie], name);
        p += sizeof(inotify_event) + e->len;
      }
    return out;
  }

 private:
  int fd_ = -1;
};

// ---------------------------------------------------------------------------------------------

// save0 on 2 ranks, rank 0 arriving 1.5 s late. The file system must have seen exactly one write
// of model.pt: rank 0's temporary file, renamed once (kit/runtime/files.h), and nothing else. Every
// rank must find, the moment save0 returns, the complete file holding rank 0's values (1): a rank
// that returns before rank 0 wrote finds no file, and a file written by every rank shows either in
// the renames or, when rank 0 is not the last to rename, in the content.
TEST(Rank0Helpers, Save0WritesOneFileFromRankZeroAndTheOthersWaitForIt) {
  kit_test::TempDir tmp("kit-rank0");
  const fs::path out = tmp.path / "out";
  fs::create_directory(out);
  FolderWatch watch(out);
  Result r = run_probe(2, {"save0", (out / "model.pt").string(), "1.5"}, tmp.path);
  ASSERT_EQ(r.exit_code, 0) << r;

  auto ranks = pid_to_rank(r.out);
  ASSERT_EQ(ranks.size(), 2u) << r;
  FolderEvents seen = watch.events();
  ASSERT_EQ(seen.renamed.size(), 1u) << "model.pt was renamed into place " << seen.renamed.size()
                                     << " times: more than one rank wrote it\n" << r;
  auto [from, to] = seen.renamed[0];
  EXPECT_EQ(to, "model.pt");
  const std::string prefix = "model.pt.tmp.";
  ASSERT_EQ(from.rfind(prefix, 0), 0u) << "renamed from " << from;
  int writer = std::stoi(from.substr(prefix.size()));
  ASSERT_TRUE(ranks.count(writer)) << "pid " << writer << " is none of the ranks\n" << r;
  EXPECT_EQ(ranks[writer], 0) << "rank " << ranks[writer] << " wrote the file";
  EXPECT_EQ(seen.written, std::vector<std::string>{from}) << "other files were written";
  std::set<std::string> left;
  for (auto& e : fs::directory_iterator(out)) left.insert(e.path().filename().string());
  EXPECT_EQ(left, std::set<std::string>{"model.pt"});

  auto after = matches(r.out, std::regex(R"(\[rank (\d+)\] rank \d+ after save0: exists=(\d) loaded=(\S+))"));
  ASSERT_EQ(after.size(), 2u) << r;
  for (auto& m : after) {
    EXPECT_EQ(m[2], "1") << "rank " << m[1] << " returned from save0 before the file existed";
    EXPECT_EQ(m[3], "1.000000") << "rank " << m[1] << " read back " << m[3]
                                << " instead of rank 0's complete file (1.000000)";
  }
}

// print0 on 3 ranks, 4 calls each: the job's output has each line once, from rank 0, while the
// plain printf of every rank shows up (the launcher does forward every rank's output).
TEST(Rank0Helpers, Print0PrintsEachLineOnceFromRankZero) {
  kit_test::TempDir tmp("kit-rank0");
  Result r = run_probe(3, {"print0", "4"}, tmp.path);
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_EQ(matches(r.out, std::regex(R"(^\[rank \d+\] alive: rank \d+$)")).size(), 3u) << r;
  auto lines = matches(r.out, std::regex(R"(^\[rank (\d+)\] print0 line (\d) of 4 from rank (\d+)$)"));
  ASSERT_EQ(lines.size(), 4u) << "expected 4 print0 lines in the job's output\n" << r;
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i][1], "0") << "printed by rank " << lines[i][1];
    EXPECT_EQ(lines[i][3], "0");
    EXPECT_EQ(lines[i][2], std::to_string(i + 1)) << "lines out of order";
  }
}

// kit::all_reduce with every op on 3 ranks (3, so that AVG is not half of SUM and the maximum is
// not simply rank 1's): rank r puts in x_r = {r + 1, -(r + 1)^2, 10 if r == 1 else 0, r / 2}.
TEST(Rank0Helpers, AllReduceGivesTheExactResultOfEachOp) {
  const int n = 3;
  kit_test::TempDir tmp("kit-rank0");
  Result r = run_probe(n, {"all_reduce"}, tmp.path);
  ASSERT_EQ(r.exit_code, 0) << r;
  const double sum[] = {n * (n + 1) / 2.0, -n * (n + 1) * (2 * n + 1) / 6.0, 10, n * (n - 1) / 4.0};
  std::map<std::string, std::vector<double>> want = {
      {"SUM", {sum[0], sum[1], sum[2], sum[3]}},
      {"AVG", {sum[0] / n, sum[1] / n, sum[2] / n, sum[3] / n}},
      {"MAX", {double(n), -1, 10, (n - 1) / 2.0}},
      {"MIN", {1, -double(n * n), 0, 0}}};
  auto rows = matches(r.out, std::regex(R"(all_reduce (\w+) (\w+) rank (\d+): (\S+) (\S+) (\S+) (\S+)$)"));
  ASSERT_EQ(rows.size(), 4u * 2u * n) << "one line per op, dtype and rank\n" << r;
  for (auto& m : rows) {
    const std::string &op = m[1], &type = m[2];
    ASSERT_TRUE(want.count(op)) << op;
    // float64 is exact here; float32 rounds AVG's thirds in the last bit.
    const double tol = type == "float64" ? 1e-12 : 1e-6;
    for (int k = 0; k < 4; ++k)
      EXPECT_NEAR(std::stod(m[4 + k]), want[op][k], tol)
          << op << " " << type << " on rank " << m[3] << ", element " << k;
  }
}

// The collective timeout that setup() gave the process group, as each rank traced it
// ("setup ... timeout_s=N ..."): c10d's default for the backend unless KIT_TIMEOUT says otherwise.
std::vector<std::string> traced_timeouts(const std::map<std::string, std::string>& env) {
  kit_test::TempDir tmp("kit-rank0");
  auto with_trace = env;
  with_trace["KIT_TRACE_DIR"] = tmp.path.string();
  Result r = run_probe(2, {"all_reduce"}, tmp.path, with_trace);
  EXPECT_EQ(r.exit_code, 0) << r;
  std::vector<std::string> found;
  for (auto& entry : fs::directory_iterator(tmp.path))
    if (entry.path().extension() == ".trace")
      for (auto& m : matches(kit_test::read_file(entry.path()), std::regex(R"(^setup .* timeout_s=(\d+) )")))
        found.push_back(m[1]);
  return found;
}

TEST(Rank0Helpers, CollectiveTimeoutIsGloosDefaultUnlessKitTimeoutSaysOtherwise) {
  // This build's ranks use Gloo (CPU): c10d's kBackendDefaultTimeout, 30 min.
  EXPECT_EQ(traced_timeouts({}), (std::vector<std::string>{"1800", "1800"}));
  EXPECT_EQ(traced_timeouts({{"KIT_TIMEOUT", "20"}}), (std::vector<std::string>{"20", "20"}));
}

TEST(Rank0Helpers, AnAbortedRankSaysWhichRankAndKeepsC10dsReason) {
  // As NCCL's watchdog does: log the reason at ERROR, then abort. The rank's stderr must keep
  // that reason (setup() quiets c10d's log during the rendezvous only) and name the rank.
  kit_test::TempDir tmp("kit-rank0");
  Result r = run_probe(2, {"abort"}, tmp.path);
  EXPECT_NE(r.exit_code, 0) << r;
  EXPECT_NE(r.err.find("probe: a collective timed out"), std::string::npos)
      << "c10d's ERROR line was silenced\n" << r;
  EXPECT_NE(r.err.find("kit: rank 1 aborted (SIGABRT)"), std::string::npos) << r;
  EXPECT_EQ(r.err.find("kit: rank 0 aborted"), std::string::npos) << r;
  EXPECT_LT(r.seconds, 20) << r;
}

// What c10d's NCCL watchdog really does when a collective times out or fails (with
// TORCH_NCCL_ASYNC_ERROR_HANDLING, which setup() sets): it rethrows the error from its own thread,
// and std::terminate, called there, aborts the process. The kit's terminate handler must let that
// happen (SIGABRT, 134 through ddprun, reported as an aborted rank), with one line naming the rank
// and the exception's first line, instead of turning it into exit(1) as for an error on the main
// thread.
TEST(Rank0Helpers, AnExceptionOnAnotherThreadAbortsTheRankAsC10dsWatchdogDoes) {
  kit_test::TempDir tmp("kit-rank0");
  Result r = run_probe(2, {"thread_throws", "1"}, tmp.path);
  EXPECT_EQ(r.exit_code, 128 + SIGABRT) << r;
  const std::regex line(R"(kit: rank 1 aborted \(SIGABRT\): an exception escaped thread \S+: probe: )"
                        R"(Watchdog caught collective operation timeout$)");
  EXPECT_EQ(matches(r.err, line).size(), 1u) << "one line naming rank 1 and the reason\n" << r;
  EXPECT_EQ(matches(r.err, std::regex("kit: rank . aborted")).size(), 1u)
      << "the generic abort line too, or another rank's\n" << r;
  EXPECT_EQ(r.err.find("second line"), std::string::npos) << r;
  EXPECT_EQ(r.err.find("rank 1: error:"), std::string::npos) << "ended as an error on the main thread\n" << r;
  EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r;
  // ddprun says it as it says every aborted rank (tests/launcher: RankAbortedIsNamedAsAborted).
  EXPECT_EQ(matches(r.err, std::regex(R"(^ddprun: rank 1 \(pid \d+\) died: killed by signal 6 )"
                                      R"(\(SIGABRT\): the rank aborted itself \(on GPUs usually )"
                                      R"(NCCL's watchdog)")).size(), 1u) << r;
  EXPECT_LT(r.seconds, 20) << r;

  // Alone, without a launcher: the process itself ends by SIGABRT.
  Process alone({PROBE_EXE, "thread_throws", "0"}, kit_test::clean_env("KIT_RANK0_TAG", g_tag, {}),
                tmp.path, "alone");
  Result a = alone.wait(30);
  EXPECT_EQ(a.signal, SIGABRT) << a;
  EXPECT_EQ(matches(a.err, std::regex(R"(^kit: rank 0 aborted \(SIGABRT\): an exception escaped )"
                                      R"(thread \S+: probe: Watchdog caught collective operation timeout$)")).size(), 1u)
      << a;
}

// On the main thread an uncaught exception stays one line and exit status 1.
TEST(Rank0Helpers, AnExceptionOnTheMainThreadIsOneErrorLineAndExitOne) {
  kit_test::TempDir tmp("kit-rank0");
  Result r = run_probe(2, {"main_throws", "1"}, tmp.path);
  EXPECT_EQ(r.exit_code, 1) << r;
  EXPECT_EQ(matches(r.err, std::regex(R"(^\[rank 1\] rank 1: error: probe: a bad batch$)")).size(), 1u) << r;
  EXPECT_EQ(r.err.find("aborted"), std::string::npos) << r;
  EXPECT_EQ(r.err.find("second line"), std::string::npos) << r;
}

// glibc's malloc keeps freed memory in the process unless KIT_MALLOC=default
// (kit/runtime/process.h): a 64 MiB block (above glibc's own largest threshold) comes from the
// heap, or, with glibc's settings, is mapped from the kernel.
TEST(Rank0Helpers, MallocKeepsLargeBlocksUnlessKitMallocIsDefault) {
  kit_test::TempDir tmp("kit-rank0");
  auto mapped = [&](const std::map<std::string, std::string>& env) {
    Process p({PROBE_EXE, "malloc"}, kit_test::clean_env("KIT_RANK0_TAG", g_tag, env), tmp.path,
              "malloc");
    Result r = p.wait(30);
    EXPECT_EQ(r.exit_code, 0) << r;
    auto m = matches(r.out, std::regex(R"(^malloc: mmapped=(\d+)$)"));
    if (r.out.find("not glibc") != std::string::npos) return std::string("skip");
    return m.size() == 1 ? m[0][1] : "no line:\n" + r.out;
  };
  const std::string tuned = mapped({}), plain = mapped({{"KIT_MALLOC", "default"}});
  if (tuned == "skip") GTEST_SKIP() << "mallinfo2 needs glibc 2.33 or newer";
  EXPECT_EQ(tuned, "0");
  EXPECT_EQ(plain, "1");
}

// kit::new_group() in a job of 4 processes: two groups of two, each all-reduce over its own pair;
// the trace names the group of each collective (common/kit/check/observe.h).
TEST(Rank0Helpers, SubgroupsReduceOverTheirRanksAndTheTraceNamesTheGroup) {
  kit_test::TempDir tmp("kit-rank0");
  Result r = run_probe(4, {"subgroups"}, tmp.path,
                       {{"KIT_TIMEOUT", "20"}, {"KIT_TRACE_DIR", tmp.path.string()}});
  ASSERT_EQ(r.exit_code, 0) << r;
  auto sums = matches(r.out, std::regex(R"(subgroup rank (\d): (\S+)$)"));
  ASSERT_EQ(sums.size(), 4u) << r;
  for (auto& m : sums) EXPECT_EQ(m[2], std::stoi(m[1]) < 2 ? "3" : "7") << "rank " << m[1];
  for (int rank = 0; rank < 4; ++rank) {
    const std::string trace = kit_test::read_file(tmp.path / ("rank" + std::to_string(rank) + ".trace"));
    const std::string pair = rank < 2 ? "0,1" : "2,3";
    EXPECT_EQ(matches(trace, std::regex("^coll seq=1 kind=all_reduce .* site=rank0_probe.cpp:\\d+ group=" + pair + "$")).size(), 1u)
        << "rank " << rank << ":\n" << trace;
    EXPECT_EQ(matches(trace, std::regex("^coll seq=1 kind=barrier .* group=world$")).size(), 1u)
        << "rank " << rank << ":\n" << trace;
  }
}

// A bad group ends the rank with one line that names the probe's line, and a non-zero exit.
TEST(Rank0Helpers, BadGroupsAreOneErrorLineNamingTheCall) {
  kit_test::TempDir tmp("kit-rank0");
  const std::pair<const char*, const char*> cases[] = {
      {"member", "rank 1: error: all_reduce \\(rank0_probe.cpp:\\d+\\) on group 0, which rank 1 is not a member of"},
      {"world", "rank 1: error: all_reduce \\(rank0_probe.cpp:\\d+\\) was given a group of another world"},
      {"ranks", "rank 1: error: new_group \\(rank0_probe.cpp:\\d+\\) was given rank 0 twice"}};
  for (auto [what, says] : cases) {
    Result r = run_probe(2, {"group_error", what}, tmp.path);
    EXPECT_NE(r.exit_code, 0) << what << "\n" << r;
    EXPECT_EQ(matches(r.err, std::regex(std::string("^\\[rank 1\\] ") + says)).size(), 1u) << what << "\n" << r;
    EXPECT_LT(r.seconds, 20) << r;
  }
}

TEST(Rank0Helpers, KitTimeoutThatIsNotANumberIsOneErrorLine) {
  kit_test::TempDir tmp("kit-rank0");
  // "10s" once meant 10 (atoi), "ten" the default: both are now refused.
  for (const char* bad : {"10s", "ten", "0"}) {
    Result r = run_probe(2, {"all_reduce"}, tmp.path, {{"KIT_TIMEOUT", bad}});
    EXPECT_NE(r.exit_code, 0) << r;
    EXPECT_NE(r.err.find(std::string("KIT_TIMEOUT='") + bad + "' is not a whole number"), std::string::npos) << r;
    EXPECT_LT(r.seconds, 20) << r;
  }
}

}  // namespace
