// Bad input to the real trainer (ex01-solution) and launcher (ddprun): every mistake must end
// the process with a non-zero exit and ONE clear line on stderr, well within a timeout, never a
// hang. The programs run as subprocesses with a clean, explicit environment.
//
// No LibTorch in this file: it only starts programs and reads what they print.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "child_process.h"  // Process, Result, TempDir, clean_env, ... (tests/support)

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// Quick settings: a tiny model and three steps. The tests are about failing, not training.
const std::vector<std::string> kQuick = {"--epochs", "1", "--max-steps", "3", "--d-model", "32",
                                         "--layers", "1", "--seq-len", "16"};

using kit_test::child_with_rank;
using kit_test::free_port;
using kit_test::Process;
using kit_test::read_file;
using kit_test::Result;

struct TempDir : kit_test::TempDir {
  TempDir() : kit_test::TempDir("kit-badinput") {}
};

// Every child carries this tag in its environment (KIT_BADINPUT_TAG), so that a test can find
// every process it started; see kit_test::clean_env for the rest of the environment.
const std::string g_tag = "kit-badinput-" + std::to_string(::getpid());

std::map<std::string, std::string> clean_env(const std::map<std::string, std::string>& extra) {
  return kit_test::clean_env("KIT_BADINPUT_TAG", g_tag, extra);
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

// exe: exercise 01's solution, or exercise 03's (ZERO_TRAINER_EXE) for the ZeRO cases, or
// exercise 05's (PP_TRAINER_EXE) for the pipeline cases.
std::vector<std::string> trainer(std::vector<std::string> args, bool quick = true,
                                 const char* exe = TRAINER_EXE) {
  std::vector<std::string> argv = {exe};
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
std::vector<pid_t> tagged_processes() { return kit_test::tagged_processes("KIT_BADINPUT_TAG", g_tag); }

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

// A new --out-dir is made; one that cannot be (a file is in the way) is one line, exit 2.
TEST(BadInput, OutDirThatCannotBeCreated) {
  TempDir tmp;
  const fs::path blocker = tmp.path / "a-file";
  std::ofstream(blocker) << "not a folder";
  const std::string out = (blocker / "run").string();
  Process p(trainer({"--data-dir", KIT_CORPUS_DIR, "--out-dir", out}), clean_env({}), tmp.path, "t");
  Result r = p.wait(20);
  EXPECT_EQ(r.exit_code, 2);
  expect_one_clear_line(r, {"--out-dir", out, "cannot be created"});
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
  const auto killed = Clock::now();

  Result r = job.wait(40);
  const double after_kill = std::chrono::duration<double>(Clock::now() - killed).count();
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
  // ddprun sees rank 1 die at once and stops rank 0: SIGTERM, then SIGKILL after its 5 s grace.
  // So the job ends within the grace and a margin for a busy machine, well before rank 0 could
  // have given up on a collective by itself (KIT_TIMEOUT, 20 s).
  EXPECT_LT(after_kill, 12) << r;
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

TEST(BadInput, ZeroStageOutOfRange) {
  TempDir tmp;
  Process p(trainer({"--data-dir", KIT_CORPUS_DIR, "--zero-stage", "4"}, true, ZERO_TRAINER_EXE),
            clean_env({}), tmp.path, "t");
  Result r = p.wait(20);
  expect_one_clear_line(r, {"--zero-stage", "[0, 3]", "'4'"});
  EXPECT_EQ(r.exit_code, 2) << r;
}

// --clip-grad is off unless given: a norm of 0 or below (no gradient, or a flipped one) is
// refused in one line, by exercise 01's and 03's trainers alike (the flag is parse_args()').
TEST(BadInput, ClipGradZeroOrNegative) {
  for (const char* exe : {TRAINER_EXE, ZERO_TRAINER_EXE})
    for (std::string v : {"0", "-1", "0.0", "x"}) {
      SCOPED_TRACE(std::string(exe) + " --clip-grad " + v);
      TempDir tmp;
      Process p(trainer({"--data-dir", KIT_CORPUS_DIR, "--clip-grad", v}, true, exe), clean_env({}),
                tmp.path, "t");
      Result r = p.wait(20);
      expect_one_clear_line(r, {"--clip-grad", "> 0", "'" + v + "'"});
      EXPECT_EQ(r.exit_code, 2) << r;
    }
}

// Not bad input, but its other side: a flag the trainer refuses must be one --help lists.
// Exercise 03's --zero-stage is taken out of argv before exercise 01's flags are parsed.
TEST(BadInput, HelpListsTheZeroStage) {
  TempDir tmp;
  Process p(trainer({"--help"}, false, ZERO_TRAINER_EXE), clean_env({}), tmp.path, "t");
  Result r = p.wait(20);
  EXPECT_EQ(r.exit_code, 0) << r;
  EXPECT_NE(r.out.find("--epochs"), std::string::npos) << r;
  EXPECT_NE(r.out.find("--zero-stage"), std::string::npos) << r;
}

TEST(BadInput, UnknownFlag) {
  TempDir tmp;
  Process p(trainer({"--data-dir", KIT_CORPUS_DIR, "--nope"}), clean_env({}), tmp.path, "t");
  Result r = p.wait(20);
  expect_one_clear_line(r, {"--nope"});
  EXPECT_EQ(r.exit_code, 2) << r;
}

// ---------------------------------------------------------------------------------------------
// Exercise 02's trainer (the image classifier): its own flags, and the CIFAR-10 reader's errors
// as the trainer reports them
// ---------------------------------------------------------------------------------------------

Result run_image_trainer(const TempDir& tmp, std::vector<std::string> args) {
  std::vector<std::string> argv = {IMAGE_TRAINER_EXE, "--epochs", "1", "--max-steps", "1",
                                   "--out-dir", (tmp.path / "out").string()};
  argv.insert(argv.end(), args.begin(), args.end());
  Process p(argv, clean_env({}), tmp.path, "t");
  return p.wait(20);
}

TEST(BadInput, ImageTrainerNegativeWorkers) {
  TempDir tmp;
  Result r = run_image_trainer(tmp, {"--data-dir", KIT_IMAGES_DIR, "--workers", "-1"});
  expect_one_clear_line(r, {"--workers", "-1"});
  EXPECT_EQ(r.exit_code, 2) << r;
}

TEST(BadInput, ImageTrainerUnknownLrRule) {
  TempDir tmp;
  Result r = run_image_trainer(tmp, {"--data-dir", KIT_IMAGES_DIR, "--lr-scaling", "cubic"});
  expect_one_clear_line(r, {"--lr-scaling", "cubic", "none, linear or sqrt"});
  EXPECT_EQ(r.exit_code, 2) << r;
}

TEST(BadInput, ImageTrainerAccumulationThatDoesNotDivideTheBatch) {
  TempDir tmp;
  Result r = run_image_trainer(tmp, {"--data-dir", KIT_IMAGES_DIR, "--batch-size", "10",
                                     "--accum-steps", "4"});
  expect_one_clear_line(r, {"--accum-steps 4", "10"});
  // The same through --global-batch, whose per-rank batch is only known after setup().
  r = run_image_trainer(tmp, {"--data-dir", KIT_IMAGES_DIR, "--global-batch", "6",
                              "--accum-steps", "4"});
  expect_one_clear_line(r, {"--accum-steps 4", "6 images per rank"});
}

// A training file cut short (an interrupted copy) and a label outside 0..9 (another data set,
// e.g. CIFAR-100's fine labels): one line that names the file.
TEST(BadInput, ImageTrainerDamagedData) {
  TempDir tmp;
  const fs::path data = tmp.path / "data";
  fs::copy(KIT_IMAGES_DIR, data);
  fs::resize_file(data / "data_batch_3.bin", fs::file_size(data / "data_batch_3.bin") - 100);
  Result r = run_image_trainer(tmp, {"--data-dir", data.string()});
  expect_one_clear_line(r, {"data_batch_3.bin", "expected"});
  fs::copy_file(KIT_IMAGES_DIR "/data_batch_3.bin", data / "data_batch_3.bin",
                fs::copy_options::overwrite_existing);
  {
    std::fstream f(data / "test_batch.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.put(static_cast<char>(57));  // the first record's label
  }
  r = run_image_trainer(tmp, {"--data-dir", data.string()});
  expect_one_clear_line(r, {"test_batch.bin", "57"});
}

// ---------------------------------------------------------------------------------------------
// Backends
// ---------------------------------------------------------------------------------------------

// KIT_BACKEND=nccl where NCCL cannot run: one line that says why, before anything trains. The
// GPUs are hidden, so the test means the same on a GPU node; the reason is "a CPU build without
// NCCL" or "needs a GPU", depending on the LibTorch of this build.
TEST(BadInput, NcclBackendWithoutAGpu) {
  TempDir tmp;
  Process p(trainer({"--data-dir", KIT_CORPUS_DIR, "--out-dir", tmp.path.string()}),
            clean_env({{"KIT_BACKEND", "nccl"}, {"CUDA_VISIBLE_DEVICES", ""}}), tmp.path, "t");
  Result r = p.wait(20);
  expect_one_clear_line(r, {"KIT_BACKEND=nccl", "gloo"});
  EXPECT_FALSE(fs::exists(tmp.path / "metrics.csv")) << "it trained before refusing";
}

TEST(BadInput, UnknownBackend) {
  TempDir tmp;
  Process p(trainer({"--data-dir", KIT_CORPUS_DIR, "--out-dir", tmp.path.string()}),
            clean_env({{"KIT_BACKEND", "mpi"}}), tmp.path, "t");
  Result r = p.wait(20);
  expect_one_clear_line(r, {"KIT_BACKEND=mpi", "nccl or gloo"});
}

// ---------------------------------------------------------------------------------------------
// Checkpoints: damaged, truncated or foreign ones are refused before anything is loaded
// ---------------------------------------------------------------------------------------------

// A run folder with one checkpoint (step-000000003, 2 ranks, the quick settings), made by a real
// 2-rank run under ddprun; each test damages its own copy.
// exe and extra: another trainer and its flags (exercise 03 with --zero-stage N).
fs::path checkpointed_run(const fs::path& dir, const char* exe = TRAINER_EXE,
                          std::vector<std::string> extra = {}) {
  const fs::path out = dir / "run";
  fs::create_directories(out);
  std::vector<std::string> argv = {DDPRUN_EXE, "--nproc-per-node", "2", "--"};
  std::vector<std::string> args = {"--data-dir", KIT_CORPUS_DIR, "--out-dir", out.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  for (auto& a : trainer(args, true, exe)) argv.push_back(a);
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
// Runs `ranks` ranks of `exe` (quick settings plus `args`) in `dir`, each rank a process of its
// own with its own stderr (KIT_TIMEOUT 20 s), and returns their results in rank order.
std::vector<Result> run_ranks(const fs::path& dir, int ranks, const std::vector<std::string>& args,
                              const char* exe) {
  const int port = free_port();
  std::vector<std::unique_ptr<Process>> procs;
  for (int r = 0; r < ranks; ++r)
    procs.push_back(std::make_unique<Process>(trainer(args, true, exe), clean_env(rank_env(r, ranks, port, {{"KIT_TIMEOUT", "20"}})),
                                              dir, "rank" + std::to_string(r)));
  std::vector<Result> results;
  for (auto& p : procs) results.push_back(p->wait(40));
  return results;
}

void expect_refused(const fs::path& dir, const fs::path& out, int ranks,
                    std::initializer_list<std::string> words, std::vector<std::string> extra = {},
                    const char* exe = TRAINER_EXE) {
  std::vector<std::string> args = {"--data-dir", KIT_CORPUS_DIR, "--out-dir", out.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  const std::vector<Result> results = run_ranks(dir, ranks, args, exe);
  for (int r = 0; r < ranks; ++r) {
    const Result& res = results[static_cast<size_t>(r)];
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

// Exercise 03: a ZeRO-2 run's sharded checkpoint (each rank's shard under zero/) is refused on 3
// ranks, and by a run of another ZeRO stage.
TEST(BadInput, ShardedCheckpointOfAnotherRankCount) {
  TempDir tmp;
  const fs::path out = checkpointed_run(tmp.path, ZERO_TRAINER_EXE, {"--zero-stage", "2"});
  EXPECT_TRUE(fs::exists(checkpoint_dir(out) / "zero" / "shard-1-of-2.pt"));
  expect_refused(tmp.path, out, 3, {"was written by 2 ranks; this run has 3", "nothing was loaded"},
                 {"--zero-stage", "2"}, ZERO_TRAINER_EXE);
}

// For every ZeRO stage: its checkpoint is refused by a run of the next stage, by exercise 03's
// DDP (--zero-stage 0) and on 3 ranks.
class ShardedCheckpoint : public ::testing::TestWithParam<int> {};

TEST_P(ShardedCheckpoint, OfAnotherZeroStageOrRankCount) {
  const int stage = GetParam(), other = stage % 3 + 1;
  const std::string flag = std::to_string(stage);
  TempDir tmp;
  const fs::path out = checkpointed_run(tmp.path, ZERO_TRAINER_EXE, {"--zero-stage", flag});
  expect_refused(tmp.path, out, 2, {"another configuration", "zero-stage " + flag, "zero-stage " + std::to_string(other)},
                 {"--zero-stage", std::to_string(other)}, ZERO_TRAINER_EXE);
  expect_refused(tmp.path, out, 2, {"another configuration", "zero-stage " + flag, "zero-stage 0"},
                 {"--zero-stage", "0"}, ZERO_TRAINER_EXE);
  expect_refused(tmp.path, out, 3, {"was written by 2 ranks; this run has 3", "nothing was loaded"},
                 {"--zero-stage", flag}, ZERO_TRAINER_EXE);
}

// Rank 1's shard is damaged (64 bytes in its middle overwritten). It is in the MANIFEST with its
// checksum, each rank checks its own shard, and the ranks agree before the load's first
// collective: one line on both ranks, at once. Unchecked, rank 1 failed alone (or loaded the
// damage) while rank 0 waited in ZeRO's all-gather until the timeout.
TEST_P(ShardedCheckpoint, WithADamagedShardOfAnotherRank) {
  const std::string flag = std::to_string(GetParam());
  TempDir tmp;
  const fs::path out = checkpointed_run(tmp.path, ZERO_TRAINER_EXE, {"--zero-stage", flag});
  const fs::path shard = checkpoint_dir(out) / "zero" / "shard-1-of-2.pt";
  ASSERT_TRUE(fs::exists(shard));
  overwrite(shard, static_cast<std::streamoff>(fs::file_size(shard) / 2), std::string(64, 'x'));
  expect_refused(tmp.path, out, 2, {"is damaged", "zero/shard-1-of-2.pt", "nothing was loaded"},
                 {"--zero-stage", flag}, ZERO_TRAINER_EXE);
}

// The same with rank 1's shard cut short: unchecked, rank 1 failed to read it and left, and rank
// 0 waited for it in the load's all-gather until KIT_TIMEOUT (20 s here; expect_refused wants
// every rank's line within 15 s).
TEST_P(ShardedCheckpoint, WithATruncatedShardOfAnotherRank) {
  const std::string flag = std::to_string(GetParam());
  TempDir tmp;
  const fs::path out = checkpointed_run(tmp.path, ZERO_TRAINER_EXE, {"--zero-stage", flag});
  const fs::path shard = checkpoint_dir(out) / "zero" / "shard-1-of-2.pt";
  ASSERT_TRUE(fs::exists(shard));
  fs::resize_file(shard, fs::file_size(shard) / 2);
  expect_refused(tmp.path, out, 2, {"is damaged", "zero/shard-1-of-2.pt", "nothing was loaded"},
                 {"--zero-stage", flag}, ZERO_TRAINER_EXE);
}

INSTANTIATE_TEST_SUITE_P(BadInput, ShardedCheckpoint, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& i) { return "zero" + std::to_string(i.param); });

TEST(BadInput, ResumeWithoutCheckpoint) {
  TempDir tmp;
  Process p(trainer({"--data-dir", KIT_CORPUS_DIR, "--out-dir", tmp.path.string(), "--resume"}), clean_env({}),
            tmp.path, "t");
  Result r = p.wait(20);
  expect_one_clear_line(r, {"--resume: no checkpoint in " + (tmp.path / "checkpoints").string()});
  EXPECT_LT(r.seconds, 15) << r;
}

// ---------------------------------------------------------------------------------------------
// Exercise 05: a pipeline the flags cannot make, and a checkpoint of another split
// ---------------------------------------------------------------------------------------------

// Each case on 2 ranks, every rank a process of its own: every rank ends within seconds with one
// line naming the flag and what is wrong, before any step (nothing is written).
struct PipelineFlagCase {
  const char* name;
  std::vector<std::string> args;
  std::vector<std::string> words;
};

void PrintTo(const PipelineFlagCase& c, std::ostream* os) { *os << c.name; }  // ctest's test names

class PipelineFlags : public ::testing::TestWithParam<PipelineFlagCase> {};

TEST_P(PipelineFlags, AreOneLineOnEveryRank) {
  TempDir tmp;
  std::vector<std::string> args = {"--data-dir", KIT_CORPUS_DIR, "--out-dir", (tmp.path / "run").string()};
  args.insert(args.end(), GetParam().args.begin(), GetParam().args.end());
  const std::vector<Result> results = run_ranks(tmp.path, 2, args, PP_TRAINER_EXE);
  for (size_t r = 0; r < results.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const Result& res = results[r];
    EXPECT_FALSE(res.timed_out) << res;
    EXPECT_EQ(res.signal, 0) << res;
    EXPECT_NE(res.exit_code, 0) << res;
    const auto lines = res.err_lines();
    ASSERT_EQ(lines.size(), 1u) << "expected exactly one line on stderr\n" << res;
    for (const auto& w : GetParam().words)
      EXPECT_NE(lines[0].find(w), std::string::npos) << "'" << w << "' missing in: " << lines[0];
    EXPECT_LT(res.seconds, 15) << res;
    EXPECT_EQ(res.out.find("[1/1]"), std::string::npos) << "it trained\n" << res;
  }
  EXPECT_FALSE(fs::exists(tmp.path / "run" / "checkpoints")) << "a refused run wrote a checkpoint";
}

// kQuick has 1 layer: the cases that need a pipeline to be possible ask for 2.
INSTANTIATE_TEST_SUITE_P(
    BadInput, PipelineFlags,
    ::testing::Values(
        PipelineFlagCase{"UnknownSchedule", {"--layers", "2", "--pp", "2", "--schedule", "foo"},
                         {"--schedule", "unknown pipeline schedule 'foo'", "gpipe, 1f1b, interleaved"}},
        PipelineFlagCase{"ChunksWithoutInterleaved", {"--layers", "2", "--pp", "2", "--chunks", "2"},
                         {"1f1b runs one chunk per rank, not 2", "interleaved"}},
        PipelineFlagCase{"MicroBatchesThatDoNotDivideTheBatch", {"--layers", "2", "--pp", "2", "--micro-batches", "3"},
                         {"--micro-batches 3 does not divide --batch-size 16"}},
        PipelineFlagCase{"MoreStagesThanRanks", {"--layers", "4", "--pp", "3"},
                         {"kit::Mesh", "does not divide the 2 ranks"}},
        PipelineFlagCase{"FewerBlocksThanChunks", {"--pp", "2"}, {"2 chunks for 1 blocks"}},
        PipelineFlagCase{"ZeroStages", {"--pp", "0"}, {"--pp needs a whole number >= 1, got '0'"}}),
    [](const ::testing::TestParamInfo<PipelineFlagCase>& i) { return std::string(i.param.name); });

// A checkpoint belongs to one split (kit/train/pp_checkpoint.h: a file per rank of its stages):
// resumed with another --pp, every rank refuses it before loading anything, naming both splits,
// and the checkpoint stays.
TEST(BadInput, PipelineCheckpointOfAnotherSplit) {
  TempDir tmp;
  const fs::path out = checkpointed_run(tmp.path, PP_TRAINER_EXE, {"--layers", "2", "--pp", "2"});
  expect_refused(tmp.path, out, 2,
                 {"was written for another configuration", "pp 2 chunks 1), not this one", "pp 1 chunks 1)",
                  "nothing was loaded"},
                 {"--layers", "2", "--resume"}, PP_TRAINER_EXE);
}

// Rank 1's stage file cut short: rank 0, whose own files are fine, refuses too.
TEST(BadInput, PipelineCheckpointWithATruncatedFileOfAnotherRank) {
  TempDir tmp;
  const fs::path out = checkpointed_run(tmp.path, PP_TRAINER_EXE, {"--layers", "2", "--pp", "2"});
  const fs::path shard = checkpoint_dir(out) / "zero" / "shard-1-of-2.pt";
  ASSERT_TRUE(fs::exists(shard));
  fs::resize_file(shard, fs::file_size(shard) / 2);
  expect_refused(tmp.path, out, 2, {"is damaged", "zero/shard-1-of-2.pt", "nothing was loaded"},
                 {"--layers", "2", "--pp", "2", "--resume"}, PP_TRAINER_EXE);
}

}  // namespace
