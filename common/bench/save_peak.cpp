// save_peak — what a checkpoint costs in memory, beside what a step costs: each rank (a process,
// started by ddprun) trains a Transformer for a few steps under DDP and ZeRO-1/2/3, then saves a
// checkpoint (kit::Checkpoints: save, or save_sharded under ZeRO) and resumes from it, and rank 0
// prints per stage and rank
//   state   the bytes live between steps (weights, gradients, AdamW state, the rest of the process);
//   step    the most bytes live during a step (forward, backward, optimizer step);
//   save    the most bytes live during the save;
//   resume  the most bytes live during the resume (the files verified, the saved state loaded).
// "Live bytes" are CPU tensors and the C++ heap together (kit/train/memory.h with heap_count.cpp
// linked in), per process, so per rank, at the same moment.
//
//   ddprun --nproc-per-node 2 -- save_peak [--d-model 128] [--heads 4] [--layers 4]
//          [--feedforward 4 d] [--vocab 2000] [--seq 32] [--batch 8] [--steps 2] [--stage S]
//          [--out DIR]
// --batch: the global batch; --stage: one stage only (0 = DDP); --out: the checkpoints' folder
// (default save-peak.out, removed at the end). Bad flags: one line, exit 2.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "kit/ddp/ddp.h"
#include "kit/models/transformer_lm.h"
#include "kit/runtime/distributed.h"
#include "kit/sharding/zero.h"
#include "kit/sharding/zero3.h"
#include "kit/train/zero_checkpoint.h"
#include "kit/train/checkpoint.h"
#include "kit/train/memory.h"

namespace {

int usage(const std::string& why) {
  std::fprintf(stderr, "save_peak: %s (flags: --d-model N --heads N --layers N --feedforward N "
                       "--vocab N --seq N --batch N --steps N --stage S --out DIR)\n", why.c_str());
  return 2;
}

// The most bytes live while `body` runs (from the bytes live when it starts).
template <typename F>
int64_t peak_of(F&& body) {
  kit::memory::reset_peak();
  body();
  return kit::memory::peak_live_bytes();
}

struct Figures {
  int64_t state = 0, step = 0, save = 0, resume = 0;
};

// One stage on this rank: `steps` steps, a save, a resume. The objects live only in here.
Figures run(int stage, const kit::TransformerLMOptions& options, int64_t global_batch, int64_t steps,
            const std::string& out) {
  const int rank = kit::get_rank(), world = kit::get_world_size();
  torch::manual_seed(1);  // every rank the same weights, as DDP's broadcast would make them
  kit::TransformerLM model(options);
  const auto adamw = torch::optim::AdamWOptions(1e-3);
  std::optional<kit::DistributedDataParallel> ddp;
  std::optional<torch::optim::AdamW> optimizer;
  std::optional<kit::ZeroOptimizer> zero;
  std::optional<kit::FullyShardedModel> sharded;
  if (stage == 0) {
    ddp.emplace(model);
    optimizer.emplace(model->parameters(), adamw);
  } else if (stage < 3) {
    zero.emplace(model, kit::ZeroOptions{.stage = stage, .adamw = adamw});
  } else {
    sharded.emplace(model, kit::ZeroOptions{.stage = 3, .adamw = adamw});
  }
  Figures f;
  for (int64_t k = 0; k < steps; ++k) {
    auto gen = at::detail::createCPUGenerator(1000 + k);
    auto ids = torch::randint(0, options.vocab_size, {global_batch, options.max_len + 1}, gen, torch::kLong)
                   .narrow(0, rank * (global_batch / world), global_batch / world);
    const auto input = ids.narrow(1, 0, options.max_len), target = ids.narrow(1, 1, options.max_len);
    f.step = std::max(f.step, peak_of([&] {
      if (optimizer) optimizer->zero_grad();
      if (zero) zero->zero_grad();
      if (sharded) sharded->zero_grad();
      auto logits = sharded ? sharded->forward(input) : model->forward(input);
      kit::lm_loss(logits, target).backward();
      if (optimizer) optimizer->step();
      if (zero) zero->step();
      if (sharded) sharded->step();
    }));
  }
  const std::string dir = out + "/stage" + std::to_string(stage);
  std::filesystem::create_directories(dir);  // every rank: a rank of another node sees its own disk
  kit::Checkpoints checkpoints(dir, "save_peak", 1);
  kit::TrainState state;
  state.global_step = steps;
  auto save_shard = [&](const std::string& dir) {
    if (zero) kit::save_zero_checkpoint(dir, *zero);
    else kit::save_zero_checkpoint(dir, *sharded);
  };
  auto load_shard = [&](const std::string& dir) {
    if (zero) kit::load_zero_checkpoint(dir, *zero);
    else kit::load_zero_checkpoint(dir, *sharded);
  };
  f.state = kit::memory::live_bytes();
  f.save = peak_of([&] {
    if (optimizer) checkpoints.save(model, *optimizer, state);
    else checkpoints.save_sharded(save_shard, state);
  });
  f.resume = peak_of([&] {
    if (optimizer) checkpoints.resume(model, *optimizer, torch::kCPU, true);
    else checkpoints.resume_sharded(load_shard, torch::kCPU, true);
  });
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  kit::TransformerLMOptions options;
  options.vocab_size = 2000;
  options.d_model = 128;
  options.heads = 4;
  options.layers = 4;
  options.dropout = 0.0;
  options.max_len = 32;
  int64_t global_batch = 8, steps = 2, feedforward = 0;
  int only = -1;
  std::string out = "save-peak.out";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage("flag " + a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--out") { out = v; continue; }
    char* end = nullptr;
    const long x = std::strtol(v.c_str(), &end, 10);
    if (a == "--stage") {
      if (v.empty() || *end != '\0' || x < 0 || x > 3) return usage("--stage wants 0, 1, 2 or 3, not '" + v + "'");
      only = static_cast<int>(x);
      continue;
    }
    if (*end != '\0' || x <= 0) return usage(a + " wants a positive whole number, not '" + v + "'");
    if (a == "--d-model") options.d_model = x;
    else if (a == "--heads") options.heads = x;
    else if (a == "--layers") options.layers = x;
    else if (a == "--feedforward") feedforward = x;
    else if (a == "--vocab") options.vocab_size = x;
    else if (a == "--seq") options.max_len = x;
    else if (a == "--batch") global_batch = x;
    else if (a == "--steps") steps = x;
    else return usage("unknown flag " + a);
  }
  if (options.d_model % options.heads != 0) return usage("--d-model must be a multiple of --heads");
  options.feedforward = feedforward > 0 ? feedforward : 4 * options.d_model;
  kit::memory::install();  // before any tensor is made, so that every one is counted
  const kit::Setup me = kit::setup(0);
  if (global_batch % me.world_size != 0) return usage("--batch does not divide by the ranks");

  const char* names[] = {"DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"};
  kit::print0("%-6s %4s | %12s %12s %12s %12s\n", "stage", "rank", "state", "step", "save", "resume");
  for (int stage = 0; stage <= 3; ++stage) {
    if (only >= 0 && stage != only) continue;
    const Figures f = run(stage, options, global_batch, steps, out);
    // Every rank's figures to rank 0, which prints them (made after the measurements).
    auto mine = torch::tensor({f.state, f.step, f.save, f.resume}, torch::kLong);
    auto all = torch::empty({me.world_size * 4}, torch::kLong);
    kit::all_gather(all, mine);
    for (int r = 0; r < me.world_size; ++r)
      kit::print0("%-6s %4d | %12lld %12lld %12lld %12lld\n", names[stage], r,
                  (long long)all[4 * r].item<int64_t>(), (long long)all[4 * r + 1].item<int64_t>(),
                  (long long)all[4 * r + 2].item<int64_t>(), (long long)all[4 * r + 3].item<int64_t>());
  }
  kit::print0("bytes of live CPU tensors and C++ heap per rank (process): state between steps, the "
              "peak of a step, of a save and of a resume\n");
  kit::barrier();
  if (me.rank == 0) std::filesystem::remove_all(out);
  kit::destroy_process_group();
  return 0;
}
