// Exercise 03 — beyond DDP: shard the training state with ZeRO-1, ZeRO-2 and ZeRO-3.
//
// As shipped this is exercise 01's finished trainer: DDP on WikiText-2, with samplers,
// metrics.csv and checkpoints. Under DDP every rank holds the whole training state: the weights
// (4 bytes a parameter in fp32), their gradients (4 more) and AdamW's two moments (8 more),
// 16 bytes a parameter on every rank. ZeRO cuts that state into one shard per rank:
//   --zero-stage 1  each rank keeps AdamW's moments for its shard only, updates its shard of the
//                   weights, and the ranks all-gather the updated weights;
//   --zero-stage 2  the gradients are reduce-scattered: each rank keeps only its shard of them;
//   --zero-stage 3  even the weights stay sharded: each Transformer block is all-gathered just
//                   for its forward and again for its backward, then freed.
// --zero-stage 0 (the default) is DDP. The TODOs are ZeRO's decisions, one stage at a time: what
// each stage shards, where its collectives go, what a unit is, what a checkpoint holds. The kit
// does the work (kit/sharding/zero.h, kit/sharding/zero3.h), and the C++ wiring around the TODOs is
// given. The losses must stay DDP's, and the bytes each rank holds, and its peak in a step, must
// shrink as the formula says (`./kit check 03`).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <string>

#include <torch/torch.h>          // tensors, autograd, optimizers

#include "kit/train/args.h"                // TrainArgs, parse_args(), take_flag(), flag_int(): the flags
#include "kit/train/checkpoint.h"          // Checkpoints, TrainState: save, resume, stop before the time limit
#include "kit/train/clip.h"                // clip_grad_norm_(): --clip-grad under DDP, the norm left on the device
#include "kit/data/data_loader.h"          // DataLoader (and DistributedSampler): batches of samples
#include "kit/ddp/ddp.h"                   // DistributedDataParallel: stage 0
#include "kit/runtime/distributed.h"       // setup(), all_reduce(), print0(), save0(), destroy_process_group()
#include "kit/train/memory.h"              // the peak of live tensor bytes in a step (a counting allocator)
#include "kit/train/metrics.h"             // Metrics: metrics.csv, progress lines, per-rank reports
#include "kit/sharding/sharding.h"         // HeldBytes, bytes_of(): what a rank holds, by category
#include "kit/models/transformer_lm.h"     // TransformerLM, lm_loss(): the model and its loss
#include "kit/data/wikitext.h"             // load_wikitext2(), LanguageModelDataset: the data
#include "kit/sharding/zero.h"             // ZeroOptimizer: AdamW's state, then the gradients, sharded
#include "kit/sharding/zero3.h"            // FullyShardedModel: the weights sharded too
#include "kit/train/zero_checkpoint.h"     // save_zero_checkpoint(), load_zero_checkpoint(): one file a rank

using Loader = kit::DataLoader<kit::LanguageModelDataset>;

// What training needs from a stage, whichever it is: the forward pass, zero_grad() and step(),
// the bytes this rank holds, and saving or resuming a checkpoint; and what the loop measures.
struct Trainer {
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::function<void()> zero_grad, step;
  std::function<kit::HeldBytes()> held;
  std::function<void(kit::TrainState&)> save;
  std::function<kit::TrainState()> resume;
  // The most bytes of live CPU tensors this rank had during a training step (from zero_grad() to
  // the end of step()), over all steps: what the rank needs at its highest, which held() (what
  // it keeps between steps) does not show. On a GPU it counts the host's tensors only (metrics'
  // peak_mem_mib has the GPU's).
  int64_t peak = 0;
};

// Exercise 01's loop, with the stage's forward and optimizer. Returns the mean training loss.
torch::Tensor train_one_epoch(kit::TransformerLM& model, const Loader& loader, Trainer& trainer,
                              torch::Device device, kit::TrainState& state,
                              kit::Checkpoints& checkpoints, kit::Metrics& metrics,
                              int64_t max_steps) {
  model->train();
  auto total = state.epoch_loss_sum.defined()
                   ? state.epoch_loss_sum
                   : torch::zeros({}, torch::TensorOptions().device(device));
  const size_t first = max_steps > 0 && state.step_in_epoch >= max_steps
                           ? loader.size()
                           : static_cast<size_t>(state.step_in_epoch);
  const auto steps_per_epoch = static_cast<int64_t>(
      max_steps > 0 ? std::min<size_t>(loader.size(), max_steps) : loader.size());
  for (kit::Batch batch : loader.from(first)) {
    // A pinned batch, copied without the host waiting for it (exercise 01).
    auto input = batch.input.to(device, /*non_blocking=*/true);
    auto target = batch.target.to(device, /*non_blocking=*/true);
    trainer.zero_grad();
    kit::memory::reset_peak();  // the step's peak, from what is live now (weights, state, batch)
    auto loss = kit::lm_loss(trainer.forward(input), target);
    loss.backward();
    trainer.step();
    trainer.peak = std::max(trainer.peak, kit::memory::peak_live_bytes());
    total += loss.detach();
    state.epoch_loss_sum = total;
    ++state.step_in_epoch;
    ++state.global_step;
    metrics.step(state.epoch, loss, state.step_in_epoch, steps_per_epoch);
    if (checkpoints.stop_requested(state)) return {};
    if (state.step_in_epoch == max_steps) break;
  }
  auto mean = total / static_cast<double>(state.step_in_epoch);
  kit::all_reduce(mean, kit::ReduceOp::AVG);
  return mean;
}

// The loss over a whole validation or test split (exercise 01's evaluate()): the loss summed
// over every word and the words counted, both added up over the ranks, then divided.
torch::Tensor evaluate(kit::TransformerLM& model, const Loader& loader, Trainer& trainer,
                       torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto options = torch::TensorOptions().dtype(torch::kDouble).device(device);
  // The evaluation samplers do not pad, so a rank may have one batch fewer than another. ZeRO-3's
  // forward is collective (each unit's weights are all-gathered from every rank's shard): a rank
  // out of batches runs forwards on a one-word input, unused, as long as the busiest rank runs
  // real ones. Every rank learns that count before the first forward, or the ranks' collectives
  // would interleave (a forward's all_gather on one rank, this all_reduce on another).
  auto most = torch::full({}, static_cast<double>(loader.size()), options);
  kit::all_reduce(most, kit::ReduceOp::MAX);
  const auto batches = static_cast<size_t>(most.item<double>());
  auto loss_sum = torch::zeros({}, options), words = torch::zeros({}, options);
  for (kit::Batch batch : loader) {
    auto target = batch.target.to(device);
    auto loss = kit::lm_loss(trainer.forward(batch.input.to(device)), target);
    loss_sum += loss.to(torch::kDouble) * target.numel();
    words += target.numel();
  }
  for (size_t k = loader.size(); k < batches; ++k)
    trainer.forward(torch::zeros({1, 1}, torch::TensorOptions().dtype(torch::kLong).device(device)));
  auto totals = torch::stack({loss_sum, words});
  kit::all_reduce(totals, kit::ReduceOp::SUM);  // the sums and counts of all ranks, on every rank
  return totals[0] / totals[1];
}

// What a rank holds under DDP: every weight, every gradient, both moments of every weight.
kit::HeldBytes ddp_held(kit::TransformerLM& model, torch::optim::AdamW& optimizer) {
  kit::HeldBytes b;
  std::vector<torch::Tensor> grads, moments;
  for (auto& p : model->parameters()) grads.push_back(p.grad());
  for (auto& [key, state] : optimizer.state()) {
    auto& s = static_cast<torch::optim::AdamWParamState&>(*state);
    moments.push_back(s.exp_avg());
    moments.push_back(s.exp_avg_sq());
  }
  b.params = kit::bytes_of(model->parameters());
  b.grads = kit::bytes_of(grads);
  b.optimizer = kit::bytes_of(moments);
  return b;
}

int64_t numel_of(const std::vector<torch::Tensor>& params) {
  int64_t n = 0;
  for (auto& p : params) n += p.numel();
  return n;
}

// A stage whose TODO is not done yet (it made nothing to train with): one line, and no training.
[[noreturn]] void not_done(int stage) {
  std::fprintf(stderr, "error: TODO %d: ZeRO-%d is not done yet\n", stage + 1, stage);
  std::exit(2);
}

int main(int argc, char** argv) {
  // --zero-stage is this exercise's own flag: taken out before exercise 01's flags are parsed.
  const int zero_stage = static_cast<int>(
      kit::flag_int("--zero-stage", kit::take_flag(argc, argv, "--zero-stage", "0",
                                                   "0: DDP; 1, 2, 3: the ZeRO stage (default 0)"),
                    0, 3));
  kit::TrainArgs args = kit::parse_args(argc, argv);
  // Count every tensor from here on (the model's too), for the peak of each step
  // (kit/train/memory.h).
  kit::memory::install();
  const kit::Setup me = kit::setup(args.seed);  // fields by name: no positional unpacking
  const int local_rank = me.local_rank, rank = me.rank, world_size = me.world_size;
  const torch::Device device = me.device;
  std::printf("rank %d of %d: local rank %d, device %s\n", rank, world_size, local_rank,
              device.str().c_str());

  kit::WikiText2 corpus = kit::load_wikitext2(args.data_dir);
  kit::LanguageModelDataset train_data(corpus.train, args.seq_len, "train");
  kit::LanguageModelDataset val_data(corpus.valid, args.seq_len, "valid");
  kit::LanguageModelDataset test_data(corpus.test, args.seq_len, "test");
  kit::DistributedSampler train_sampler(train_data, /*shuffle=*/true, args.seed);
  kit::DistributedEvalSampler val_sampler(val_data);  // every sample once: see exercise 01
  kit::DistributedEvalSampler test_sampler(test_data);
  Loader train_loader(train_data, args.batch_size, train_sampler, kit::LoaderOptions{.pin_memory = true});
  Loader val_loader(val_data, args.eval_batch_size, val_sampler);
  Loader test_loader(test_data, args.eval_batch_size, test_sampler);

  kit::TransformerLM model(kit::lm_options(args, corpus.vocab.size()));
  model->to(device);
  // The model's units (ZeRO-3 shards each on its own): the check computes the formula from them.
  std::string units;
  for (auto& u : model->units()) units += " " + std::to_string(numel_of(u.module->parameters()));
  kit::print0("parameters %lld in units%s on %d ranks\n",
              static_cast<long long>(numel_of(model->parameters())), units.c_str(), world_size);

  // Exercise 01's AdamW: every stage below trains with these options, as DDP does.
  const auto adamw = torch::optim::AdamWOptions(args.lr);
  // A checkpoint belongs to one stage: another stage's is refused.
  kit::Checkpoints checkpoints(
      args.out_dir,
      kit::config_fingerprint(args, corpus.vocab.size()) + " zero-stage " + std::to_string(zero_stage),
      args.keep_checkpoints);
  // What each stage trains with: DDP and torch's AdamW (stage 0), a ZeroOptimizer (stages 1 and
  // 2) or a FullyShardedModel (stage 3). They live for the whole training; the TODOs decide which
  // a ZeRO stage makes, and how, and the wiring after them calls whichever holds a value.
  std::optional<kit::DistributedDataParallel> ddp;
  std::optional<torch::optim::AdamW> optimizer;
  std::optional<kit::ZeroOptimizer> zero;
  std::optional<kit::FullyShardedModel> sharded;
  Trainer trainer;
  trainer.forward = [&](const torch::Tensor& x) { return model->forward(x); };
  if (zero_stage == 0) {  // DDP, exercise 01's way: the forward through the wrapper
    ddp.emplace(model);
    optimizer.emplace(model->parameters(), adamw);
    trainer.forward = [&](const torch::Tensor& x) { return ddp->forward(x); };
  }
  // TODO 2: ZeRO-1 shards what only the update reads: AdamW's two moments (8 of the 16 bytes a
  //         parameter). Each rank updates only its shard of the weights, so it needs only its shard of
  //         the averaged gradient (which collective replaces DDP's all-reduce?) and then the others'
  //         new shards (which collective?). kit::ZeroOptimizer does both in step(), in place of DDP
  //         and AdamW: for --zero-stage 1 make `zero` with the stage that shards the optimizer state,
  //         `adamw` and .max_grad_norm = args.clip_grad.
  // TODO 3: ZeRO-2: where in the step does that reduce-scatter go? In ZeRO-1's step(), so every rank
  //         holds all its gradients until then. Done during backward, as they come, it leaves each
  //         rank only its averaged shard: the gradients are sharded too. For --zero-stage 2 make
  //         `zero` with the stage that does that (options as in TODO 2).
  // TODO 4: ZeRO-3 shards the weights too. A unit's full weights are all-gathered just before its
  //         forward (and again for its backward), then freed: what is a unit? The model's units()
  //         (the embedding, each Transformer block, the output layer), so that one of them at a time
  //         is whole, never the model. For --zero-stage 3 make `sharded` from the model and them
  //         (stage 3, options as in TODO 2) and send trainer.forward through it: the model's own
  //         weights are empty.
  // The wiring: the Trainer calls whatever this stage made.
  if (ddp) {
    trainer.zero_grad = [&] { optimizer->zero_grad(); };
    trainer.step = [&] {  // --clip-grad: after backward, whose end DDP waits for every average
      if (args.clip_grad > 0) kit::clip_grad_norm_(model->parameters(), args.clip_grad);
      optimizer->step();
    };
    trainer.held = [&] { return ddp_held(model, *optimizer); };
  } else if (zero) {
    trainer.zero_grad = [&] { zero->zero_grad(); };
    trainer.step = [&] { zero->step(); };
    trainer.held = [&] { return zero->held(); };
  } else if (sharded) {
    trainer.zero_grad = [&] { sharded->zero_grad(); };
    trainer.step = [&] { sharded->step(); };
    trainer.held = [&] { return sharded->held(); };
  } else {
    not_done(zero_stage);
  }
  // A ZeRO rank's shard of the training state, written to or read from a checkpoint's folder.
  kit::Checkpoints::ShardIO save_shard = [&](const std::string& dir) {
    if (zero) kit::save_zero_checkpoint(dir, *zero);
    else kit::save_zero_checkpoint(dir, *sharded);
  };
  kit::Checkpoints::ShardIO load_shard = [&](const std::string& dir) {
    if (zero) kit::load_zero_checkpoint(dir, *zero);
    else kit::load_zero_checkpoint(dir, *sharded);
  };
  trainer.save = [&](kit::TrainState& s) {
    if (ddp) return checkpoints.save(model, *optimizer, s);  // rank 0 writes the whole model
    // TODO 5: Checkpoints: under DDP rank 0 has everything and writes it alone. Under ZeRO nobody
    //         has: every rank writes its own shard (checkpoints.save_sharded with save_shard) and, in
    //         trainer.resume below, reads it back (resume_sharded with load_shard). Until then ZeRO
    //         saves nothing.
  };
  trainer.resume = [&] {
    if (ddp) return checkpoints.resume(model, *optimizer, device, args.resume);
    // TODO 5: (second place) each rank reads its own shard back: resume_sharded with load_shard.
    return kit::TrainState();
  };

  // The model's file, in save0's format at every stage. Under ZeRO-3 no rank has the whole model:
  // save0 gathers it to rank 0 one unit at a time (FSDP's full state dict), and every rank calls it.
  auto save_model = [&](const std::string& path) {
    if (sharded) kit::save0(*sharded, path);
    else kit::save0(model, path);
  };

  kit::TrainState state = trainer.resume();
  kit::Metrics metrics(args.out_dir, args.batch_size, device, state.global_step);

  while (state.epoch < args.epochs) {
    const int64_t epoch = state.epoch;
    train_sampler.set_epoch(epoch);
    torch::Tensor train_mean = train_one_epoch(model, train_loader, trainer, device, state,
                                               checkpoints, metrics, args.max_steps);
    if (state.stopped) break;
    metrics.end_epoch(epoch);
    double train_loss = train_mean.item<double>();
    double val_loss = evaluate(model, val_loader, trainer, device).item<double>();
    kit::print0("[%ld/%ld] train loss %.5f, validation loss %.5f (perplexity %.2f)\n", epoch + 1,
                args.epochs, train_loss, val_loss, std::exp(val_loss));
    if (val_loss < state.best_val_loss) {
      state.best_val_loss = val_loss;
      save_model(args.out_dir + "/model-best.pt");
    }
    state.next_epoch();
    trainer.save(state);
  }

  if (state.stopped) {
    trainer.save(state);
  } else {
    double test_loss = evaluate(model, test_loader, trainer, device).item<double>();
    kit::print0("final test loss %.5f (perplexity %.2f)\n", test_loss, std::exp(test_loss));
    save_model(args.out_dir + "/model-final.pt");
  }
  const kit::HeldBytes held = trainer.held();
  const std::string name = zero_stage == 0 ? "DDP" : "ZeRO-" + std::to_string(zero_stage);
  // TODO 1: What does this rank hold, and what did it need at its peak? Under ZeRO every rank holds a
  //         different share, so rank 0's line says nothing of the others: print it on EVERY rank,
  //         with std::printf and the rank first, "rank R: " then the rest of this line unchanged
  //         (`kit check 03` reads it).
  kit::print0("%s holds params %lld grads %lld optimizer %lld gathered %lld bytes, peak %lld\n",
              name.c_str(), static_cast<long long>(held.params),
              static_cast<long long>(held.grads), static_cast<long long>(held.optimizer),
              static_cast<long long>(held.gathered_peak), static_cast<long long>(trainer.peak));
  kit::destroy_process_group();
  return 0;
}
