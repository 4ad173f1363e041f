// What a checkpoint costs in memory: a save holds the training state plus one bounded buffer, a
// resume the state plus the one copy it loads, and a file's checksum is read a chunk at a time.
// Live bytes are CPU tensors and the C++ heap together: common/bench/heap_count.cpp replaces
// operator new and delete in this binary only and charges kit/train/memory.h's counters.
// One process, no process group (rank 0 writes everything, as a single trainer does).
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kit/train/checkpoint.h"
#include "kit/runtime/files.h"
#include "kit/train/memory.h"

namespace fs = std::filesystem;

namespace {

// Room for what a save makes besides the tensors and the one chunk: LibTorch's description of
// the archive (per tensor a name, a pickled entry and a zip directory entry; the archive's types
// written as code: hundreds of bytes per tensor, and this checkpoint has about 20), the RNG
// state (5 KB) and the MANIFEST's text. 1 MiB is ample, and 24 times less than one more copy of
// this model's state.pt (25 MB), which the old save held 2.3 times over.
constexpr int64_t kDescription = int64_t{1} << 20;
// The same for a resume, whose reader also compiles the archive's types back from their code (as
// TorchScript loads any archive): 1.5 MB with LibTorch 2.13. 4 MiB leaves room for another
// LibTorch, and is still 6 times less than one more copy of state.pt.
constexpr int64_t kReader = int64_t{4} << 20;

struct Temp {
  fs::path path = fs::temp_directory_path() / ("kit-ckpt-memory-" + std::to_string(::getpid()));
  Temp() { fs::create_directories(path); }
  ~Temp() { fs::remove_all(path); }
};

// The most live bytes while `body` runs, above those live when it starts.
template <typename F>
int64_t peak_above_live(F&& body) {
  const int64_t before = kit::memory::live_bytes();
  kit::memory::reset_peak();
  body();
  return kit::memory::peak_live_bytes() - before;
}

// Two 1024 x 1024 layers (2.1 M parameters, 8.4 MB) after one AdamW step: weights, gradients and
// AdamW's two moments live, as between two steps of a training.
struct Trained {
  torch::nn::Sequential model{torch::nn::Linear(1024, 1024), torch::nn::Linear(1024, 1024)};
  torch::optim::AdamW optimizer{model->parameters(), torch::optim::AdamWOptions(1e-3)};
  int64_t weight_bytes = 0;
  Trained() {
    model->forward(torch::randn({4, 1024})).sum().backward();
    optimizer.step();
    for (auto& p : model->parameters()) weight_bytes += p.numel() * p.element_size();
  }
};

// Without the heap counter linked in, a whole file read into a string would go unseen and the
// tests below would pass whatever the code does.
// (The string's address is published: a compiler may otherwise leave out an unused allocation.)
std::string* volatile g_published = nullptr;
TEST(CheckpointMemory, TheHeapIsCounted) {
  const int64_t grew = peak_above_live([] {
    std::string big(8 << 20, 'x');
    g_published = &big;
    g_published = nullptr;
  });
  EXPECT_GE(grew, 8 << 20);
}

// The save's peak: the state plus one chunk and the archive's description. Before, rank 0 read
// state.pt back into one string to sum it for the MANIFEST (ostringstream: up to 2.3 copies).
TEST(CheckpointMemory, ASaveHoldsTheStatePlusOneChunk) {
  Temp tmp;
  Trained t;
  kit::Checkpoints checkpoints(tmp.path.string(), "test");
  kit::TrainState state;
  state.global_step = 1;
  const int64_t above = peak_above_live([&] { checkpoints.save(t.model, t.optimizer, state); });
  const int64_t bound = static_cast<int64_t>(kit::kFileChunk) + kDescription;
  EXPECT_LE(above, bound) << "a save of " << 3 * t.weight_bytes << " bytes of weights and AdamW "
                          << "state held " << above << " bytes above the training state";
  std::printf("save: %lld bytes above the state (bound %lld)\n", (long long)above, (long long)bound);
}

// The resume's peak: the one copy of the saved tensors that it loads (weights and AdamW's two
// moments: 3x the weights), plus one chunk to verify each file and the reader's own structures.
// Before, every file was read into one string to check its sum (state.pt: 2.3 copies of it).
TEST(CheckpointMemory, AResumeVerifiesInChunksAndLoadsOneCopy) {
  Temp tmp;
  kit::TrainState state;
  state.global_step = 1;
  Trained saved;
  kit::Checkpoints(tmp.path.string(), "test").save(saved.model, saved.optimizer, state);
  Trained t;
  const int64_t above = peak_above_live([&] {
    kit::Checkpoints(tmp.path.string(), "test").resume(t.model, t.optimizer, torch::kCPU, true);
  });
  const int64_t bound = 3 * t.weight_bytes + static_cast<int64_t>(kit::kFileChunk) + kReader;
  EXPECT_LE(above, bound) << "the resume held " << above << " bytes above the training state";
  for (size_t i = 0; i < t.model->parameters().size(); ++i)
    EXPECT_TRUE(torch::equal(t.model->parameters()[i], saved.model->parameters()[i])) << i;
  std::printf("resume: %lld bytes above the state (bound %lld)\n", (long long)above, (long long)bound);
}

// sum_file reads one chunk at a time, and its sum is the MANIFEST's of old: FNV-1a over the
// bytes with the kit's constants (written out here, so a change of the algorithm, which would
// refuse every existing checkpoint, fails), the same whatever the pieces.
TEST(CheckpointMemory, AFileIsSummedInChunksAsTheManifestAlwaysDid) {
  Temp tmp;
  const std::string file = (tmp.path / "bytes").string();
  std::string bytes(5 * kit::kFileChunk / 2, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 7919) >> 3);
  std::ofstream(file, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  char expected[17];
  std::snprintf(expected, sizeof expected, "%016llx", static_cast<unsigned long long>(h));

  kit::FileSum sum;
  bool ok = false;
  const int64_t above = peak_above_live([&] { ok = kit::sum_file(file, sum); });
  ASSERT_TRUE(ok);
  EXPECT_EQ(sum.bytes, static_cast<int64_t>(bytes.size()));
  EXPECT_EQ(sum.hex(), expected);
  EXPECT_LE(above, static_cast<int64_t>(kit::kFileChunk) + 4096) << "more than one chunk";
  kit::FileSum pieces;  // as write_atomically feeds it: in whatever pieces the writer hands over
  pieces.add(bytes.data(), 3);
  pieces.add(bytes.data() + 3, bytes.size() - 3);
  EXPECT_EQ(pieces.hex(), expected);
  EXPECT_EQ(kit::FileSum{}.hex(), "14650fb0739d0383");  // no bytes: the starting value
  EXPECT_FALSE(kit::sum_file((tmp.path / "missing").string(), sum));
}

}  // namespace
