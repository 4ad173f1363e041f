// Fault injection on the real trainer (ex01-solution) under the real launcher (ddprun), on CPU
// with Gloo: a training must survive being stopped, a rank being killed, and rank 0 dying in the
// middle of a checkpoint, without losing work, and a resumed training must be the uninterrupted
// one bit for bit.
//
//   faults.Faults.StopAndResumeIsBitIdentical      KIT_TEST_STOP_AFTER_STEP at 7, 15 (the last step of
//                                                  epoch 1) and 23, resuming after each stop
//   faults.Faults.StopAtTheLastStepOfAShortEpoch   the same at the last step of a --max-steps epoch
//   faults.Faults.SignalStopsAndResumes/{USR1,TERM} a real signal sent to ddprun: the ranks stop at
//                                                  the next polling step (a multiple of 10)
//   faults.Faults.Rank0DiesDuringSave/{EpochEnd,StopSave}  KIT_TEST_DIE_DURING_SAVE
//   faults.KillRank.AtRandomStep/<seed>_<ranks>ranks  SIGKILL one rank at a random step, 20 times
//   faults.Checkpoints/{Rotation,StaleTmp,RankZeroChooses}.*  the checkpoint folders under DDP and
//                                                  every ZeRO stage (see tests/faults/CMakeLists.txt)
//
// Fault injection comes from the preloaded test hooks (KIT_TEST_*, libkit_test_hooks.so).
//
// No LibTorch here: the test only starts programs and reads what they leave behind. Every test
// makes a small corpus of its own (make_corpus, a few ms) and uses a tiny model.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "child_process.h"  // Process, Result, TempDir, clean_env, ... (tests/support)

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// The tiny model of the quick runs; 2 heads so that d_model 32 splits evenly.
const std::vector<std::string> kModel = {"--d-model", "32", "--heads", "2", "--layers", "1",
                                         "--feedforward", "64", "--seq-len", "16", "--batch-size", "8"};
constexpr double kCollectiveTimeout = 10;  // KIT_TIMEOUT of every run, seconds

using kit_test::child_with_rank;
using kit_test::nonempty_lines;
using kit_test::Process;
using kit_test::read_file;
using kit_test::Result;

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

struct TempDir : kit_test::TempDir {
  TempDir() : kit_test::TempDir("kit-faults", "KIT_FAULTS_KEEP") {}  // KIT_FAULTS_KEEP: for a post-mortem
};

// Every process the tests start carries this tag in its environment, so that a test can tell
// whether anything of a job is still alive.
const std::string g_tag = "kit-faults-" + std::to_string(::getpid());

// The environment of kit_test::clean_env (ours minus rank/Slurm/KIT_ settings, one thread per
// rank) plus a short collective timeout, the tag and the preloaded test hooks (the KIT_TEST_*
// variables of common/testing/checkpoint_hooks_env.cpp: the trainers read none themselves);
// `extra` wins over all of them.
std::map<std::string, std::string> clean_env(const std::map<std::string, std::string>& extra = {}) {
  return kit_test::clean_env("KIT_FAULTS_TAG", g_tag, extra,
                             {{"KIT_TIMEOUT", std::to_string(static_cast<int>(kCollectiveTimeout))},
                              {"LD_PRELOAD", TEST_HOOKS_LIB}});
}

// Processes that still carry our tag (zombies do not count), other than ourselves.
std::vector<pid_t> tagged_processes() { return kit_test::tagged_processes("KIT_FAULTS_TAG", g_tag); }

// ---------------------------------------------------------------------------------------------
// The training and what it leaves behind
// ---------------------------------------------------------------------------------------------

// A small corpus of its own for every test process: 15 steps per epoch on 2 ranks.
const fs::path& small_corpus() {
  static TempDir dir;
  static bool made = [] {
    Process p({MAKE_CORPUS_EXE, "--out", (dir.path / "data").string(), "--train-tokens", "4000",
               "--valid-tokens", "1200", "--test-tokens", "1200"},
              clean_env(), dir.path, "make_corpus");
    Result r = p.wait(60);
    if (r.exit_code != 0) throw std::runtime_error("make_corpus failed: " + r.err);
    return true;
  }();
  (void)made;
  static fs::path data = dir.path / "data";
  return data;
}

// ddprun --nproc-per-node N -- ex01-solution --data-dir <small> --out-dir OUT <model> ARGS
std::vector<std::string> job(int ranks, const fs::path& out, const std::vector<std::string>& args) {
  fs::create_directories(out);
  std::vector<std::string> argv = {DDPRUN_EXE, "--nproc-per-node", std::to_string(ranks), "--",
                                   TRAINER_EXE, "--data-dir", small_corpus().string(),
                                   "--out-dir", out.string()};
  argv.insert(argv.end(), kModel.begin(), kModel.end());
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

Result run(const std::vector<std::string>& argv, const fs::path& dir, const std::string& name,
           const std::map<std::string, std::string>& env = {}, double timeout_s = 90) {
  Process p(argv, clean_env(env), dir, name);
  return p.wait(timeout_s);
}

struct Row {
  long step;
  std::string loss;  // as written (%.9g): compared as text, i.e. bit for bit
};

// metrics.csv: the header, then one row per step: step,epoch,loss,... (the per-rank rows at each
// epoch's end, with a rank number in column 7 and no loss, are not steps: skipped here).
std::vector<Row> metrics(const fs::path& out, std::string* problem) {
  std::vector<Row> rows;
  auto lines = nonempty_lines(read_file(out / "metrics.csv"));
  if (lines.empty() || lines[0].rfind("step,epoch,loss,", 0) != 0) {
    *problem = "metrics.csv has no header line";
    return rows;
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    std::istringstream f(lines[i]);
    std::string step, epoch, loss;
    std::getline(f, step, ',');
    std::getline(f, epoch, ',');
    std::getline(f, loss, ',');
    std::string column, rank;
    for (int c = 4; c <= 7 && std::getline(f, column, ','); ++c)
      if (c == 7) rank = column;
    if (!rank.empty()) continue;
    rows.push_back({std::atol(step.c_str()), loss});
  }
  return rows;
}

// The rows must be steps 1, 2, ..., n, each exactly once.
::testing::AssertionResult every_step_once(const fs::path& out, long n) {
  std::string problem;
  auto rows = metrics(out, &problem);
  if (!problem.empty()) return ::testing::AssertionFailure() << problem;
  if (static_cast<long>(rows.size()) != n)
    return ::testing::AssertionFailure() << "metrics.csv has " << rows.size() << " rows, expected " << n
                                         << " (steps 1.." << n << " once each):\n"
                                         << read_file(out / "metrics.csv");
  for (long i = 0; i < n; ++i)
    if (rows[static_cast<size_t>(i)].step != i + 1)
      return ::testing::AssertionFailure() << "row " << i + 1 << " of metrics.csv is step "
                                           << rows[static_cast<size_t>(i)].step << ":\n"
                                           << read_file(out / "metrics.csv");
  return ::testing::AssertionSuccess();
}

// Same losses at the same steps (as text, %.9g of a float32: bit for bit), and the same
// model-final.pt bytes.
void expect_same_training(const fs::path& expected, const fs::path& got) {
  std::string p1, p2;
  auto a = metrics(expected, &p1), b = metrics(got, &p2);
  ASSERT_TRUE(p1.empty() && p2.empty()) << p1 << p2;
  ASSERT_EQ(a.size(), b.size()) << "different numbers of steps in metrics.csv";
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].step, b[i].step) << "row " << i + 1;
    EXPECT_EQ(a[i].loss, b[i].loss) << "loss at step " << a[i].step << " differs";
  }
  std::string m1 = read_file(expected / "model-final.pt"), m2 = read_file(got / "model-final.pt");
  ASSERT_FALSE(m1.empty()) << expected / "model-final.pt";
  EXPECT_TRUE(m1 == m2) << "model-final.pt differs from the uninterrupted run's ("
                        << m1.size() << " vs " << m2.size() << " bytes)";
}

// The lines of rank 0 that a resumed run must repeat exactly: epoch summaries and the final loss.
std::vector<std::string> summary_lines(const std::string& out) {
  std::vector<std::string> keep;
  for (auto& l : nonempty_lines(out))
    if (l.rfind("[", 0) == 0 || l.rfind("final test loss", 0) == 0) keep.push_back(l);
  return keep;
}

std::string step_dir(long step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%09ld", step);
  return name;
}

// The checkpoint folders of a run: complete ones (final names) and leftovers (*.tmp*).
struct Checkpoints {
  std::vector<long> complete;
  std::vector<std::string> leftovers;
};
Checkpoints checkpoints(const fs::path& out) {
  Checkpoints c;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(out / "checkpoints", ec)) {
    std::string n = e.path().filename().string();
    if (n.rfind("step-", 0) != 0) continue;
    if (n.find(".tmp") != std::string::npos) c.leftovers.push_back(n);
    else c.complete.push_back(std::atol(n.c_str() + 5));
  }
  std::sort(c.complete.begin(), c.complete.end());
  return c;
}

// How many optimizer steps rank `rank` has finished, from its run trace.
long traced_steps(const fs::path& trace_dir, int rank) {
  return static_cast<long>(count(read_file(trace_dir / ("rank" + std::to_string(rank) + ".trace")), "ddp_step "));
}

// The uninterrupted reference, computed once per test process.
struct Reference {
  fs::path out;
  Result result;
};
const Reference& reference(const std::vector<std::string>& args) {
  static std::map<std::vector<std::string>, Reference> done;
  static TempDir dir;
  auto it = done.find(args);
  if (it != done.end()) return it->second;
  Reference ref;
  ref.out = dir.path / ("ref" + std::to_string(done.size()));
  ref.result = run(job(2, ref.out, args), dir.path, ref.out.filename().string());
  return done.emplace(args, ref).first->second;
}

// ---------------------------------------------------------------------------------------------
// Stop (KIT_TEST_STOP_AFTER_STEP) and resume: bit for bit the uninterrupted run
// ---------------------------------------------------------------------------------------------

// 2 epochs of 15 steps with dropout (so the random-number state matters). Stop after step 7
// (mid epoch 1), resume and stop after 15 (the last step of epoch 1: the epoch's end, with its
// validation and checkpoint, happens in the next run), resume and stop after 23 (mid epoch 2),
// resume to the end.
TEST(Faults, StopAndResumeIsBitIdentical) {
  const std::vector<std::string> args = {"--epochs", "2", "--dropout", "0.1"};
  const Reference& ref = reference(args);
  ASSERT_EQ(ref.result.exit_code, 0) << ref.result;
  std::string problem;
  const long total = static_cast<long>(metrics(ref.out, &problem).size());
  const long per_epoch = total / 2;
  ASSERT_TRUE(problem.empty() && total % 2 == 0 && per_epoch >= 12) << problem << " " << total << " steps";

  TempDir tmp;
  const fs::path out = tmp.path / "run";
  long previous = 0;
  std::string all_out;
  for (long k : {7L, per_epoch, per_epoch + 8}) {
    Result r = run(job(2, out, args), tmp.path, "stop" + std::to_string(k),
                   {{"KIT_TEST_STOP_AFTER_STEP", std::to_string(k)}});
    ASSERT_EQ(r.exit_code, 0) << "a requested stop is a clean exit\n" << r;
    EXPECT_NE(r.out.find("stopping after step " + std::to_string(k) + ": checkpoint " +
                         (out / "checkpoints" / step_dir(k)).string() + " written"),
              std::string::npos) << r;
    if (previous > 0) {
      EXPECT_NE(r.out.find("resuming from " + (out / "checkpoints" / step_dir(previous)).string()),
                std::string::npos) << r;
    }
    EXPECT_EQ(r.out.find("final test loss"), std::string::npos) << "stopped, yet finished?\n" << r;
    auto c = checkpoints(out);
    ASSERT_FALSE(c.complete.empty());
    EXPECT_EQ(c.complete.back(), k);
    EXPECT_TRUE(c.leftovers.empty());
    EXPECT_TRUE(every_step_once(out, k));
    all_out += r.out;
    previous = k;
  }
  Result r = run(job(2, out, args), tmp.path, "last");
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("resuming from " + (out / "checkpoints" / step_dir(per_epoch + 8)).string() +
                       ": epoch 2, step " + std::to_string(per_epoch + 8)), std::string::npos) << r;
  all_out += r.out;
  EXPECT_TRUE(every_step_once(out, total));
  expect_same_training(ref.out, out);
  // Rank 0's epoch and final lines, over all four runs, are the uninterrupted run's.
  EXPECT_EQ(summary_lines(all_out), summary_lines(ref.result.out));
}

// Epochs cut short by --max-steps 4: stop after step 8, the last step of epoch 2. The resumed
// run must end epoch 2 at once (validation, checkpoint) and go on with epoch 3, not train on
// through the rest of epoch 2's batches.
TEST(Faults, StopAtTheLastStepOfAShortEpoch) {
  const std::vector<std::string> args = {"--epochs", "3", "--max-steps", "4"};
  const Reference& ref = reference(args);
  ASSERT_EQ(ref.result.exit_code, 0) << ref.result;

  TempDir tmp;
  const fs::path out = tmp.path / "run";
  Result r = run(job(2, out, args), tmp.path, "stop", {{"KIT_TEST_STOP_AFTER_STEP", "8"}});
  ASSERT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("stopping after step 8: checkpoint"), std::string::npos) << r;
  Result again = run(job(2, out, args), tmp.path, "resumed");
  ASSERT_EQ(again.exit_code, 0) << again;
  EXPECT_NE(again.out.find("resuming from " + (out / "checkpoints" / step_dir(8)).string() +
                           ": epoch 2, step 8"), std::string::npos) << again;
  EXPECT_TRUE(every_step_once(out, 12));
  expect_same_training(ref.out, out);
  EXPECT_EQ(summary_lines(r.out + again.out), summary_lines(ref.result.out));
}

// ---------------------------------------------------------------------------------------------
// A real signal to the launcher, as Slurm's warning (USR1) or scancel (TERM) would send it
// ---------------------------------------------------------------------------------------------

class SignalStop : public ::testing::TestWithParam<int> {};

TEST_P(SignalStop, StopsAndResumesBitIdentical) {
  const int sig = GetParam();
  const std::vector<std::string> args = {"--epochs", "2", "--dropout", "0.1"};
  const Reference& ref = reference(args);
  ASSERT_EQ(ref.result.exit_code, 0) << ref.result;

  TempDir tmp;
  const fs::path out = tmp.path / "run", trace = tmp.path / "trace";
  fs::create_directories(trace);
  // 30 ms per step (test-only pacing): the signal lands in the middle of the training.
  Process p(job(2, out, args),
            clean_env({{"KIT_TRACE_DIR", trace.string()}, {"KIT_TEST_STEP_DELAY_MS", "30"}}), tmp.path, "signalled");
  auto deadline = Clock::now() + std::chrono::seconds(30);
  while (traced_steps(trace, 0) < 5 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GE(traced_steps(trace, 0), 5) << "training did not start\n" << p.wait(1);
  ASSERT_EQ(::kill(p.pid(), sig), 0);
  Result r = p.wait(30);
  // ddprun exits 0 after USR1 (the ranks exited 0); after TERM it reports 128 + 15 itself.
  EXPECT_FALSE(r.timed_out) << r;
  EXPECT_EQ(r.exit_code, sig == SIGUSR1 ? 0 : 128 + SIGTERM) << r;
  auto c = checkpoints(out);
  ASSERT_FALSE(c.complete.empty()) << r;
  const long k = c.complete.back();
  EXPECT_NE(r.out.find("stopping after step " + std::to_string(k) + ": checkpoint"), std::string::npos) << r;
  std::string problem;
  const long total = static_cast<long>(metrics(ref.out, &problem).size());
  EXPECT_LT(k, total) << "the training was over before the signal arrived\n" << r;
  // The ranks look at the signal every 10 steps (Checkpoints::kStopPollSteps, kit/train/checkpoint.h).
  EXPECT_EQ(k % 10, 0) << "a signal stops at a polling step, not after step " << k << "\n" << r;
  EXPECT_TRUE(every_step_once(out, k));

  Result again = run(job(2, out, args), tmp.path, "resumed");
  ASSERT_EQ(again.exit_code, 0) << again;
  EXPECT_NE(again.out.find("resuming from " + (out / "checkpoints" / step_dir(k)).string()),
            std::string::npos) << again;
  EXPECT_TRUE(every_step_once(out, total));
  expect_same_training(ref.out, out);
}

INSTANTIATE_TEST_SUITE_P(Faults, SignalStop, ::testing::Values(SIGUSR1, SIGTERM),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(i.param == SIGUSR1 ? "USR1" : "TERM");
                         });

// ---------------------------------------------------------------------------------------------
// Rank 0 dies in the middle of a save
// ---------------------------------------------------------------------------------------------

// 3 epochs of 4 steps (--max-steps 4): checkpoints at steps 4, 8 and 12. Rank 0 kills itself
// after writing state.pt of a checkpoint and before its MANIFEST and rename:
//   EpochEnd: during the save at the end of epoch 2 (step 8);
//   StopSave: during the save of a stop after step 6 (mid epoch 2; no later save has this name).
// Each time the previous checkpoint (step 4) stays the newest complete one, the half-written one
// is left as a .tmp folder that nothing loads, and the next run resumes from step 4, removes
// the leftover at its first save and ends exactly as the uninterrupted training.
class DieDuringSave : public ::testing::TestWithParam<bool> {};

TEST_P(DieDuringSave, PreviousCheckpointStaysLoadable) {
  const bool stop_save = GetParam();
  const std::vector<std::string> args = {"--epochs", "3", "--max-steps", "4"};
  const Reference& ref = reference(args);
  ASSERT_EQ(ref.result.exit_code, 0) << ref.result;
  const long die_at = stop_save ? 6 : 8;

  TempDir tmp;
  const fs::path out = tmp.path / "run";
  std::map<std::string, std::string> env = {{"KIT_TEST_DIE_DURING_SAVE", std::to_string(die_at)}};
  if (stop_save) env["KIT_TEST_STOP_AFTER_STEP"] = std::to_string(die_at);
  Result r = run(job(2, out, args), tmp.path, "dies", env, 60);
  EXPECT_FALSE(r.timed_out) << r;
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r;
  EXPECT_NE(r.err.find("ddprun: rank 0 "), std::string::npos) << "ddprun must name rank 0\n" << r;
  EXPECT_NE(r.err.find("SIGKILL"), std::string::npos) << r;

  auto c = checkpoints(out);
  ASSERT_EQ(c.complete, std::vector<long>{4}) << r;
  ASSERT_EQ(c.leftovers, std::vector<std::string>{step_dir(die_at) + ".tmp"});
  EXPECT_TRUE(fs::exists(out / "checkpoints" / c.leftovers[0] / "state.pt"));
  EXPECT_FALSE(fs::exists(out / "checkpoints" / c.leftovers[0] / "MANIFEST"));

  Result again = run(job(2, out, args), tmp.path, "resumed");
  ASSERT_EQ(again.exit_code, 0) << again;
  EXPECT_NE(again.out.find("resuming from " + (out / "checkpoints" / step_dir(4)).string() +
                           ": epoch 2, step 4"), std::string::npos) << again;
  c = checkpoints(out);
  EXPECT_TRUE(c.leftovers.empty()) << "the half-written checkpoint " << c.leftovers[0]
                                   << " is still there after the next saves";
  EXPECT_EQ(c.complete, (std::vector<long>{4, 8, 12}));
  EXPECT_TRUE(every_step_once(out, 12));
  expect_same_training(ref.out, out);
}

INSTANTIATE_TEST_SUITE_P(Faults, DieDuringSave, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return std::string(i.param ? "StopSave" : "EpochEnd");
                         });

// ---------------------------------------------------------------------------------------------
// SIGKILL one rank at a random step, 20 times
// ---------------------------------------------------------------------------------------------

// Seed s: 2 ranks for odd s, 4 for even s; the victim and the step (5..24) are drawn from s.
// Epochs of 4 steps, so a checkpoint exists at every multiple of 4. Every time:
//   * ddprun and every rank are gone within the collective timeout after the kill;
//   * ddprun exits non-zero (137) and its line names the killed rank and SIGKILL;
//   * the newest complete checkpoint loads: a follow-up run with --resume continues from it,
//     trains one more epoch and finishes; metrics.csv then has every step exactly once.
class KillRank : public ::testing::TestWithParam<int> {};

TEST_P(KillRank, AtRandomStep) {
  const int seed = GetParam();
  const int ranks = seed % 2 == 1 ? 2 : 4;
  std::mt19937 rng(static_cast<unsigned>(seed) * 7919u);
  const int victim = std::uniform_int_distribution<int>(0, ranks - 1)(rng);
  const long at = std::uniform_int_distribution<long>(5, 24)(rng);
  const long steps_per_epoch = 4;
  SCOPED_TRACE("seed " + std::to_string(seed) + ": " + std::to_string(ranks) + " ranks, SIGKILL rank " +
               std::to_string(victim) + " after step " + std::to_string(at));

  TempDir tmp;
  const fs::path out = tmp.path / "run", trace = tmp.path / "trace";
  fs::create_directories(trace);
  const std::vector<std::string> args = {"--epochs", "1000", "--max-steps", std::to_string(steps_per_epoch)};
  Process p(job(ranks, out, args), clean_env({{"KIT_TRACE_DIR", trace.string()}}), tmp.path, "killed");

  // Training has reached step `at` on the victim when its trace shows that many reduced steps.
  auto deadline = Clock::now() + std::chrono::seconds(60);
  while (traced_steps(trace, victim) < at && Clock::now() < deadline && p.running())
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_GE(traced_steps(trace, victim), at) << "rank " << victim << " never got there\n" << p.wait(1);
  const pid_t pid = child_with_rank(p.pid(), victim);
  ASSERT_GT(pid, 0) << "no rank " << victim << " under ddprun";
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  const auto killed_at = Clock::now();

  Result r = p.wait(60);
  const double after_kill = std::chrono::duration<double>(Clock::now() - killed_at).count();
  std::printf("the job ended %.2f s after the kill of rank %d\n", after_kill, victim);
  EXPECT_FALSE(r.timed_out) << r;
  EXPECT_LT(after_kill, kCollectiveTimeout) << "the job took " << after_kill << " s to end\n" << r;
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r;
  bool named = false;
  for (auto& line : nonempty_lines(r.err))
    if (line.rfind("ddprun: rank ", 0) == 0 && line.find(" died: ") != std::string::npos) {
      named = true;
      EXPECT_NE(line.find("ddprun: rank " + std::to_string(victim) + " (pid " + std::to_string(pid) + ")"),
                std::string::npos) << "the first rank to die was rank " << victim << ": " << line << "\n" << r;
      EXPECT_NE(line.find("SIGKILL"), std::string::npos) << line;
    }
  EXPECT_TRUE(named) << "ddprun did not say which rank died\n" << r;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(tagged_processes().empty()) << "processes of the job are still running";

  auto c = checkpoints(out);
  ASSERT_FALSE(c.complete.empty()) << "no checkpoint after " << at << " steps\n" << r;
  const long newest = c.complete.back();
  EXPECT_EQ(newest % steps_per_epoch, 0);
  EXPECT_GE(newest, (at / steps_per_epoch - 1) * steps_per_epoch) << "checkpoints were lost";
  const long epochs_done = newest / steps_per_epoch;

  std::vector<std::string> more = {"--epochs", std::to_string(epochs_done + 1), "--max-steps",
                                   std::to_string(steps_per_epoch), "--resume"};
  Result again = run(job(ranks, out, more), tmp.path, "resumed");
  ASSERT_EQ(again.exit_code, 0) << again;
  EXPECT_NE(again.out.find("resuming from " + (out / "checkpoints" / step_dir(newest)).string() +
                           ": epoch " + std::to_string(epochs_done + 1) + ", step " + std::to_string(newest)),
            std::string::npos) << again;
  EXPECT_NE(again.out.find("final test loss"), std::string::npos) << again;
  EXPECT_TRUE(fs::exists(out / "model-final.pt"));
  EXPECT_TRUE(every_step_once(out, (epochs_done + 1) * steps_per_epoch));
  EXPECT_TRUE(checkpoints(out).leftovers.empty());
}

INSTANTIATE_TEST_SUITE_P(Faults, KillRank, ::testing::Range(1, 21),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "seed" + std::to_string(i.param) + "_" +
                                  std::to_string(i.param % 2 == 1 ? 2 : 4) + "ranks";
                         });

// ---------------------------------------------------------------------------------------------
// KIT_DEVICE_CHECK=nccl: no host tensor reaches a collective (NCCL's rule, seen on CPU CI)
// ---------------------------------------------------------------------------------------------

// Exercise 01's and 03's solutions (DDP, ZeRO-1 and ZeRO-3) on 2 ranks with KIT_DEBUG_COLLECTIVES=1
// and KIT_DEVICE_CHECK=nccl: every rank trains on fakegpu:0, and every tensor a collective is given
// must be there, as on a GPU with NCCL. The run stops after step 3 (the stop flag's all-reduce
// runs after every step, the debug barrier's descriptor with every save), saves, resumes and
// finishes, and trains as the same job on the CPU does (the same CPU kernels do the work). A
// host tensor anywhere on that path ends the run with "was given a tensor on cpu": the stop
// flag's torch::tensor({...}) and the debug barrier's descriptor did, until kit::control.
struct DeviceRuleCase {
  const char* name;
  const char* exe;
  std::vector<std::string> args;
};
const DeviceRuleCase kDeviceRuleCases[] = {
    {"ex01_ddp", TRAINER_EXE, {}},
    {"ex03_zero1", EX03_EXE, {"--zero-stage", "1"}},
    {"ex03_zero2", EX03_EXE, {"--zero-stage", "2"}},  // reduce-scatters during backward
    {"ex03_zero3", EX03_EXE, {"--zero-stage", "3"}},
};

class NcclDeviceRule : public ::testing::TestWithParam<int> {};

TEST_P(NcclDeviceRule, StopSaveResumeWithNoHostTensor) {
  const DeviceRuleCase& c = kDeviceRuleCases[GetParam()];
  std::vector<std::string> args = {"--epochs", "2", "--max-steps", "4", "--dropout", "0.1"};
  args.insert(args.end(), c.args.begin(), c.args.end());
  auto job_of = [&](const fs::path& out) {
    auto argv = job(2, out, args);
    argv[4] = c.exe;  // ddprun --nproc-per-node 2 -- EXE ...
    return argv;
  };
  TempDir tmp;
  Result cpu = run(job_of(tmp.path / "cpu"), tmp.path, "cpu");
  ASSERT_EQ(cpu.exit_code, 0) << cpu;

  const std::map<std::string, std::string> check = {{"KIT_DEVICE_CHECK", "nccl"},
                                                    {"KIT_DEBUG_COLLECTIVES", "1"}};
  auto with = [&](std::map<std::string, std::string> env, const char* k, const char* v) {
    env[k] = v;
    return env;
  };
  const fs::path out = tmp.path / "fakegpu";
  Result stop = run(job_of(out), tmp.path, "stop", with(check, "KIT_TEST_STOP_AFTER_STEP", "3"));
  ASSERT_EQ(stop.exit_code, 0) << "a host tensor reached a collective?\n" << stop;
  EXPECT_NE(stop.out.find("device fakegpu:0"), std::string::npos) << "the mode was not on\n" << stop;
  EXPECT_NE(stop.out.find("stopping after step 3"), std::string::npos) << stop;
  Result rest = run(job_of(out), tmp.path, "resume", check);
  ASSERT_EQ(rest.exit_code, 0) << "a host tensor reached a collective?\n" << rest;
  EXPECT_NE(rest.out.find("resuming from"), std::string::npos) << rest;
  EXPECT_TRUE(every_step_once(out, 8));
  std::string p1, p2;
  auto a = metrics(tmp.path / "cpu", &p1), b = metrics(out, &p2);
  ASSERT_EQ(a.size(), b.size()) << p1 << p2;
  // DDP's are bit for bit the CPU run's; ZeRO's differ in the last bits from step 4 on (its
  // shard views reach the CPU kernels as copies), so: the same to 1e-5.
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(std::stod(a[i].loss), std::stod(b[i].loss), 1e-5)
        << "loss at step " << a[i].step << " differs from the CPU run's";
}

INSTANTIATE_TEST_SUITE_P(DeviceCheck, NcclDeviceRule, ::testing::Range(0, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(kDeviceRuleCases[i.param].name);
                         });

// A KIT_DEVICE_CHECK that is not a check is one line and a non-zero exit, not a silent CPU run.
TEST(DeviceCheck, UnknownValueIsOneErrorLine) {
  TempDir tmp;
  Result r = run(job(2, tmp.path / "out", {"--epochs", "1", "--max-steps", "1"}), tmp.path, "bad",
                 {{"KIT_DEVICE_CHECK", "cuda"}});
  EXPECT_NE(r.exit_code, 0) << r;
  EXPECT_FALSE(r.timed_out) << r;
  EXPECT_NE(r.err.find("KIT_DEVICE_CHECK=cuda is not a check: use nccl"), std::string::npos) << r;
}

// ---------------------------------------------------------------------------------------------
// Checkpoint folders: rotation, leftovers, which checkpoint the ranks load
// ---------------------------------------------------------------------------------------------

// The trainers of the checkpoint cases: DDP (exercise 01) and every ZeRO stage (exercise 03).
const DeviceRuleCase kTrainerCases[] = {
    {"ddp", TRAINER_EXE, {}},
    {"zero1", EX03_EXE, {"--zero-stage", "1"}},
    {"zero2", EX03_EXE, {"--zero-stage", "2"}},
    {"zero3", EX03_EXE, {"--zero-stage", "3"}},
};

std::vector<std::string> job_with(const DeviceRuleCase& c, const fs::path& out, std::vector<std::string> args) {
  args.insert(args.end(), c.args.begin(), c.args.end());
  auto argv = job(2, out, args);
  argv[4] = c.exe;  // ddprun --nproc-per-node 2 -- EXE ...
  return argv;
}

// Bytes of the files under `dir`, subfolders included.
uintmax_t disk_use(const fs::path& dir) {
  uintmax_t bytes = 0;
  std::error_code ec;
  for (auto& e : fs::recursive_directory_iterator(dir, ec))
    if (e.is_regular_file()) bytes += e.file_size();
  return bytes;
}

// --keep-checkpoints 2 over 5 saves (epochs of 2 steps): only the newest 2 folders stay, and the
// folder holds no more than those two (ZeRO's zero/ of the removed ones included: a
// non-recursive removal left them, so the disk filled with one whole training state per save).
// Every shard is in the MANIFEST with its size and checksum.
class Rotation : public ::testing::TestWithParam<int> {};

TEST_P(Rotation, KeepsOnlyTheNewestFolders) {
  const DeviceRuleCase& c = kTrainerCases[GetParam()];
  TempDir tmp;
  const fs::path out = tmp.path / "run";
  Result r = run(job_with(c, out, {"--epochs", "5", "--max-steps", "2", "--keep-checkpoints", "2"}),
                 tmp.path, "rotate");
  ASSERT_EQ(r.exit_code, 0) << r;
  auto got = checkpoints(out);
  EXPECT_EQ(got.complete, (std::vector<long>{8, 10}));
  EXPECT_TRUE(got.leftovers.empty());
  std::vector<std::string> folders;
  for (auto& e : fs::directory_iterator(out / "checkpoints")) folders.push_back(e.path().filename().string());
  EXPECT_EQ(folders.size(), 2u) << "checkpoints/ holds more than the 2 kept folders";
  const fs::path newest = out / "checkpoints" / step_dir(10);
  EXPECT_LE(disk_use(out / "checkpoints"), 2 * disk_use(newest) + 4096)
      << "checkpoints/ holds more than two checkpoints' worth of bytes";
  const std::string manifest = read_file(newest / "MANIFEST");
  const bool zero = !c.args.empty();
  for (int rank = 0; rank < 2; ++rank) {
    const std::string shard = "file zero/shard-" + std::to_string(rank) + "-of-2.pt ";
    EXPECT_EQ(manifest.find(shard) != std::string::npos, zero) << shard << "in\n" << manifest;
    if (zero) EXPECT_TRUE(fs::exists(newest / "zero" / ("shard-" + std::to_string(rank) + "-of-2.pt")));
  }
  if (zero) EXPECT_NE(manifest.find("file zero/MANIFEST "), std::string::npos) << manifest;
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, Rotation, ::testing::Range(0, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(kTrainerCases[i.param].name);
                         });

// Rank 0 dies half-way through the epoch-end save of step 2 under ZeRO: step-2.tmp is left with
// the shards in zero/. The next run has no checkpoint, trains from the start and saves step 2
// again: the leftover of that very step is removed whole first (a non-recursive removal failed
// on zero/, and then so did the save: "cannot create ...step-000000002.tmp").
class StaleTmp : public ::testing::TestWithParam<int> {};

TEST_P(StaleTmp, DoesNotBreakTheNextSaveOfItsStep) {
  const DeviceRuleCase& c = kTrainerCases[GetParam()];
  TempDir tmp;
  const fs::path out = tmp.path / "run";
  const std::vector<std::string> args = {"--epochs", "2", "--max-steps", "2"};
  Result dies = run(job_with(c, out, args), tmp.path, "dies", {{"KIT_TEST_DIE_DURING_SAVE", "2"}}, 60);
  ASSERT_EQ(dies.exit_code, 128 + SIGKILL) << dies;
  auto got = checkpoints(out);
  ASSERT_TRUE(got.complete.empty());
  ASSERT_EQ(got.leftovers, std::vector<std::string>{step_dir(2) + ".tmp"});
  ASSERT_TRUE(fs::exists(out / "checkpoints" / got.leftovers[0] / "zero" / "shard-1-of-2.pt"));

  Result again = run(job_with(c, out, args), tmp.path, "again");
  ASSERT_EQ(again.exit_code, 0) << again;
  got = checkpoints(out);
  EXPECT_EQ(got.complete, (std::vector<long>{2, 4}));
  EXPECT_TRUE(got.leftovers.empty());
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, StaleTmp, ::testing::Values(1, 3),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(kTrainerCases[i.param].name);
                         });

// Rank 1's listing of the checkpoints folder shows a newer checkpoint that rank 0's does not
// (KIT_TEST_PHANTOM_CHECKPOINT: as a shared file system that shows a folder to one node first
// would). Rank 0 chooses, rank 1 follows: the run resumes from step 2 on both and finishes. When
// every rank chose for itself, rank 1 went for the phantom and the run failed.
class RankZeroChooses : public ::testing::TestWithParam<int> {};

TEST_P(RankZeroChooses, EveryRankLoadsRank0sChoice) {
  const DeviceRuleCase& c = kTrainerCases[GetParam()];
  TempDir tmp;
  const fs::path out = tmp.path / "run";
  Result first = run(job_with(c, out, {"--epochs", "1", "--max-steps", "2"}), tmp.path, "first");
  ASSERT_EQ(first.exit_code, 0) << first;
  Result resumed = run(job_with(c, out, {"--epochs", "2", "--max-steps", "2"}), tmp.path, "resumed",
                       {{"KIT_TEST_PHANTOM_CHECKPOINT", "1"}});
  ASSERT_EQ(resumed.exit_code, 0) << resumed;
  EXPECT_NE(resumed.out.find("resuming from " + (out / "checkpoints" / step_dir(2)).string()),
            std::string::npos) << resumed;
  EXPECT_TRUE(every_step_once(out, 4));
}

// The trainers read no fault-injection variable themselves: without the preloaded hooks, the
// test variables and the names they had before (KIT_STOP_AFTER_STEP, KIT_DIE_DURING_SAVE, read by
// kit/train/checkpoint.cpp until they moved to kit/train/checkpoint_hooks.h) change nothing.
TEST(Checkpoints, TrainersReadNoTestVariables) {
  TempDir tmp;
  for (const DeviceRuleCase& c : {kTrainerCases[0], kTrainerCases[3]}) {
    const fs::path out = tmp.path / c.name;
    Result r = run(job_with(c, out, {"--epochs", "2", "--max-steps", "2"}), tmp.path, c.name,
                   {{"LD_PRELOAD", ""}, {"KIT_STOP_AFTER_STEP", "1"}, {"KIT_DIE_DURING_SAVE", "2"},
                    {"KIT_TEST_STOP_AFTER_STEP", "1"}, {"KIT_TEST_DIE_DURING_SAVE", "2"}});
    ASSERT_EQ(r.exit_code, 0) << r;
    EXPECT_EQ(r.out.find("stopping after step"), std::string::npos) << r;
    EXPECT_EQ(checkpoints(out).complete, (std::vector<long>{2, 4})) << c.name;
  }
}

// Durability, as the preloaded log of fsync() and rename() calls shows it (KIT_TEST_FS_LOG,
// common/testing/fs_calls_env.cpp): everything renamed under the run's folder (each file of a
// checkpoint, the checkpoint's folder, the final model) was flushed after the last rename into it
// and before its own rename, and the folder that receives the new name is flushed after it.
// Otherwise a power cut can leave a complete-looking name over missing bytes, or lose the name.
TEST(Checkpoints, SyncsFilesAndFoldersAroundTheRename) {
  TempDir tmp;
  const fs::path out = tmp.path / "run", log = tmp.path / "fs.log";
  Result r = run(job(2, out, {"--epochs", "2", "--max-steps", "2"}), tmp.path, "fslog",
                 {{"KIT_TEST_FS_LOG", log.string()}});
  ASSERT_EQ(r.exit_code, 0) << r;
  auto path = [](const std::string& p) { return fs::weakly_canonical(p).string(); };
  const std::string root = path(out.string()) + "/";
  std::vector<std::pair<std::string, std::string>> calls;  // (fsync, path) or (from, to)
  for (const std::string& line : nonempty_lines(read_file(log))) {
    std::istringstream in(line);
    std::string kind, a, b;
    in >> kind >> a >> b;
    if (kind == "fsync") calls.push_back({"", path(a)});
    else if (kind == "rename") calls.push_back({path(a), path(b)});
  }
  auto parent = [](const std::string& p) { return fs::path(p).parent_path().string(); };
  size_t checked = 0, folders = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    const auto& [from, to] = calls[i];
    if (from.empty() || to.rfind(root, 0) != 0) continue;
    ++checked;
    folders += parent(to) == path((out / "checkpoints").string());
    size_t last_in = 0;  // after the last rename into `from` (a folder), if any
    for (size_t j = 0; j < i; ++j)
      if (!calls[j].first.empty() && parent(calls[j].second) == from) last_in = j;
    bool synced_before = false, folder_after = false;
    for (size_t j = last_in; j < i; ++j) synced_before |= calls[j].first.empty() && calls[j].second == from;
    for (size_t j = i + 1; j < calls.size(); ++j) folder_after |= calls[j].first.empty() && calls[j].second == parent(to);
    EXPECT_TRUE(synced_before) << "renamed without an fsync of its own before: " << from << " -> " << to;
    EXPECT_TRUE(folder_after) << "its folder not flushed after the rename: " << from << " -> " << to;
  }
  // Two checkpoints (state.pt, MANIFEST, two ranks' rng files, the folder), model-final.pt, and
  // model-best.pt as often as the validation loss improved.
  EXPECT_GE(checked, 11u) << read_file(log);
  EXPECT_EQ(folders, 2u) << read_file(log);
}

// A node failure after a checkpoint is written, before its folder gets its name
// (KIT_TEST_KILL_AT_RENAME: rank 0 dies at the rename of step 4's folder): the previous
// checkpoint loads, and the resumed run trains exactly as the uninterrupted one.
TEST(Checkpoints, CrashBeforeTheRenameKeepsThePreviousCheckpoint) {
  const std::vector<std::string> args = {"--epochs", "3", "--max-steps", "2"};
  const Reference& ref = reference(args);
  ASSERT_EQ(ref.result.exit_code, 0) << ref.result;
  TempDir tmp;
  const fs::path out = tmp.path / "run";
  Result r = run(job(2, out, args), tmp.path, "dies", {{"KIT_TEST_KILL_AT_RENAME", step_dir(4)}}, 60);
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r;
  auto c = checkpoints(out);
  ASSERT_EQ(c.complete, std::vector<long>{2}) << r;
  ASSERT_EQ(c.leftovers, std::vector<std::string>{step_dir(4) + ".tmp"});
  EXPECT_TRUE(fs::exists(out / "checkpoints" / c.leftovers[0] / "MANIFEST")) << "written, not renamed";
  Result again = run(job(2, out, args), tmp.path, "resumed");
  ASSERT_EQ(again.exit_code, 0) << again;
  EXPECT_NE(again.out.find("resuming from " + (out / "checkpoints" / step_dir(2)).string()),
            std::string::npos) << again;
  EXPECT_TRUE(every_step_once(out, 6));
  expect_same_training(ref.out, out);
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, RankZeroChooses, ::testing::Values(0, 2),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(kTrainerCases[i.param].name);
                         });

}  // namespace
