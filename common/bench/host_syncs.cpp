// common/bench/host_syncs.cpp — host synchronisations per training step: exercise 01's loop
// (its model, DDP, AdamW, --clip-grad, metrics.csv, the stop poll of the checkpoints) on random
// tokens, counting every call that makes the host wait for the device
// (kit/runtime/device_check.h: count_host_syncs()).
//
//   KIT_DEVICE_CHECK=nccl build/bin/ddprun --nproc-per-node 2 -- build/bin/host_syncs
//   build/bin/ddprun --nproc-per-node 1 -- build/bin/host_syncs     (on a GPU: CUDA's count)
//
// Each rank prints one line per step, "inside" (from zero_grad to the end of optimizer.step:
// forward, backward and DDP's averaging, the clip, AdamW) and "between" (the batch's copy to the
// device, metrics.step, the stop poll), the polls (the ranks' all-reduce of the stop flag), then
// its totals. Step 1 is apart: DDP's first backward rebuilds its buckets in rank 0's order, one
// broadcast through the host, once. Under KIT_DEVICE_CHECK=nccl the device is fakegpu (host
// memory); without it and without a GPU, on the CPU, nothing can be waited for and every count
// is 0. --check: exit 1 unless, from step 2 on, no step has a sync inside it and syncs between
// steps come only at the steps that poll, one poll per Checkpoints::kStopPollSteps steps.
// Flags: --steps N (default 24), --d-model N, --layers N, --seq N, --batch N (per rank),
// --clip-grad X (default 1; 0: off), --out-dir DIR (metrics.csv and checkpoints; default a
// fresh folder under /tmp, removed at the end), --check. Bad flags: one line, exit 2.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "kit/data/data_loader.h"         // DataLoader, DistributedSampler
#include "kit/data/wikitext.h"            // LanguageModelDataset
#include "kit/ddp/ddp.h"                  // DistributedDataParallel
#include "kit/models/transformer_lm.h"    // TransformerLM, lm_loss
#include "kit/runtime/device_check.h"     // count_host_syncs, host_syncs
#include "kit/runtime/distributed.h"      // setup, default_group
#include "kit/train/args.h"               // parse_flags
#include "kit/train/checkpoint.h"         // Checkpoints: the stop poll
#include "kit/train/clip.h"               // clip_grad_norm_, the norm on the device
#include "kit/train/metrics.h"            // Metrics: metrics.csv

int main(int argc, char** argv) {
  int64_t steps = 24, d_model = 32, layers = 1, seq = 16, batch = 4;
  double clip = 1.0;
  std::string out_dir;
  bool check = false;
  kit::parse_flags(argc, argv,
                   {{"--steps", "steps to train (default 24)", [&](auto v) { steps = kit::flag_int("--steps", v, 2, 100000); }},
                    {"--d-model", "model width (default 32)", [&](auto v) { d_model = kit::flag_int("--d-model", v, 2, 4096); }},
                    {"--layers", "Transformer blocks (default 1)", [&](auto v) { layers = kit::flag_int("--layers", v, 1, 64); }},
                    {"--seq", "tokens per sample (default 16)", [&](auto v) { seq = kit::flag_int("--seq", v, 2, 4096); }},
                    {"--batch", "samples per rank and step (default 4)", [&](auto v) { batch = kit::flag_int("--batch", v, 1, 4096); }},
                    {"--clip-grad", "clip to this global norm (default 1; 0: off)", [&](auto v) { clip = kit::flag_real("--clip-grad", v, 0, 1e9); }},
                    {"--out-dir", "metrics.csv and checkpoints (default: a fresh folder under /tmp)", [&](auto v) { out_dir = v; }},
                    {"--check", "exit 1 unless no step from step 2 on syncs inside, and only polling steps sync between", [&](auto) { check = true; }, true}});
  const kit::Setup me = kit::setup(1234);
  const torch::Device device = me.device;
  const bool own_dir = out_dir.empty();
  if (own_dir) {
    // One folder for all ranks: rank 0 makes it and tells the others its name.
    std::string made;
    if (me.rank == 0) {
      char name[] = "/tmp/kit-host-syncs-XXXXXX";
      made = ::mkdtemp(name) ? name : "";
    }
    auto bytes = torch::zeros({256}, torch::kUInt8);
    std::snprintf(static_cast<char*>(bytes.data_ptr()), 256, "%s", made.c_str());
    bytes = kit::control::broadcast(kit::default_group(), bytes, 0);
    out_dir = static_cast<const char*>(bytes.data_ptr());
    if (out_dir.empty()) kit::flag_error("cannot make a folder under /tmp (give --out-dir)");
  }

  // Random tokens, enough for `steps` batches on every rank.
  const int64_t vocab = 97;
  torch::manual_seed(7);
  auto ids = torch::randint(0, vocab, {steps * batch * me.world_size * (seq + 1)}, torch::kLong);
  kit::LanguageModelDataset data(ids, seq, "train");
  kit::DistributedSampler sampler(data, /*shuffle=*/true, 1234);
  kit::DataLoader<kit::LanguageModelDataset> loader(data, static_cast<size_t>(batch), sampler,
                                                    kit::LoaderOptions{.pin_memory = true});

  kit::TransformerLMOptions options;
  options.vocab_size = vocab;
  options.d_model = d_model;
  options.heads = 2;
  options.layers = layers;
  options.feedforward = 2 * d_model;
  options.max_len = seq;
  options.dropout = 0.1;
  kit::TransformerLM model(options);
  model->to(device);
  kit::DistributedDataParallel ddp(model);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  kit::Checkpoints checkpoints(out_dir, "host_syncs");
  kit::TrainState state;
  // No progress line by time (KIT_PROGRESS_S still sets one): the counts do not depend on speed.
  kit::Metrics metrics(out_dir, batch, device, 0, 1e9);
  auto total = torch::zeros({}, torch::TensorOptions().device(device));

  kit::device_check::count_host_syncs(device);
  auto polls = [] { return kit::default_group().stats().calls.count("all_reduce")
                               ? kit::default_group().stats().calls.at("all_reduce") : 0; };
  int64_t inside_after_1 = 0, between_all = 0, polls_all = 0, bad = 0;
  int64_t step = 0;
  for (kit::Batch b : loader) {
    const int64_t s0 = kit::device_check::host_syncs();
    auto input = b.input.to(device, /*non_blocking=*/true);
    auto target = b.target.to(device, /*non_blocking=*/true);
    const int64_t s1 = kit::device_check::host_syncs();
    optimizer.zero_grad();
    auto loss = kit::lm_loss(ddp.forward(input), target);
    loss.backward();
    if (clip > 0) kit::clip_grad_norm_(model->parameters(), clip);
    optimizer.step();
    const int64_t s2 = kit::device_check::host_syncs();
    total += loss.detach();
    state.epoch_loss_sum = total;
    ++state.step_in_epoch;
    ++state.global_step;
    ++step;
    metrics.step(0, loss, step, steps);
    const int64_t p0 = polls();
    const bool stop = checkpoints.stop_requested(state);
    const int64_t poll = polls() - p0;
    const int64_t s3 = kit::device_check::host_syncs();
    const int64_t inside = s2 - s1, between = (s1 - s0) + (s3 - s2);
    std::printf("rank %d step %ld: inside %ld, between %ld, polls %ld\n", me.rank,
                static_cast<long>(step), static_cast<long>(inside), static_cast<long>(between),
                static_cast<long>(poll));
    if (step > 1) inside_after_1 += inside;
    between_all += between;
    polls_all += poll;
    // What --check requires: nothing inside a step (after the first), nothing between steps but
    // at the steps that poll, and those poll once (on one rank there is nobody to ask).
    const bool polling = step % kit::Checkpoints::kStopPollSteps == 0;
    if ((step > 1 && inside != 0) || (!polling && between != 0) ||
        poll != (polling && me.world_size > 1 ? 1 : 0))
      ++bad;
    if (stop || step == steps) break;
  }
  std::printf("HOSTSYNCS rank %d ranks %d device %s steps %ld: inside the step %ld in steps 2..%ld "
              "(%.2f per step), between steps %ld (%.2f per step), polls %ld\n",
              me.rank, me.world_size, device.str().c_str(), static_cast<long>(step),
              static_cast<long>(inside_after_1), static_cast<long>(step),
              static_cast<double>(inside_after_1) / static_cast<double>(step - 1),
              static_cast<long>(between_all), static_cast<double>(between_all) / static_cast<double>(step),
              static_cast<long>(polls_all));
  std::fflush(stdout);
  kit::barrier();
  if (own_dir && me.rank == 0) std::filesystem::remove_all(out_dir);
  kit::destroy_process_group();
  if (check && bad > 0) {
    std::fprintf(stderr, "host_syncs: rank %d: %ld of %ld steps break the rule (no sync inside a "
                 "step after the first; between steps only at a polling step, every %ld steps)\n",
                 me.rank, static_cast<long>(bad), static_cast<long>(step),
                 static_cast<long>(kit::Checkpoints::kStopPollSteps));
    return 1;
  }
  return 0;
}
