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
// --zero-stage 0 (the default) is DDP. The TODOs are ZeRO's decisions, one stage at a time: the
// bytes each stage should leave a rank (your formula, printed beside what the rank holds), ZeRO-1's
// step written by you with the kit's collectives on the model's weights and gradients as flat
// buffers (kit/sharding/flat.h), which buffer ZeRO-2 frees and when, what a unit is for ZeRO-3
// (kit/sharding/zero3.h does its machinery), what a checkpoint holds. The C++ wiring around the
// TODOs is given. The losses must stay DDP's, every step's weights too, and the bytes each rank
// holds, and its peak in a step, must shrink as the formula says (`./kit check 03`).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <string>

#include <torch/torch.h>          // tensors, autograd, optimizers

#include "kit/train/args.h"                // TrainArgs, parse_args(), take_flag(), flag_int(): the flags
#include "kit/train/lr_rule.h"             // scale_lr(), warmup_factor(): exercise 02's learning rate
#include "kit/train/checkpoint.h"          // Checkpoints, TrainState: save, resume, stop before the time limit
#include "kit/train/clip.h"                // clip_grad_norm_(): --clip-grad under DDP, the norm left on the device
#include "kit/data/data_loader.h"          // DataLoader (and DistributedSampler): batches of samples
#include "kit/ddp/ddp.h"                   // DistributedDataParallel: stage 0
#include "kit/runtime/distributed.h"       // setup(), all_reduce(), print0(), save0(), destroy_process_group()
#include "kit/train/memory.h"              // the peak of live tensor bytes in a step (a counting allocator)
#include "kit/train/metrics.h"             // Metrics: metrics.csv, progress lines, per-rank reports
#include "kit/sharding/sharding.h"         // ShardLayout, ShardedAdamW, HeldBytes: shards and bytes
#include "kit/sharding/clip.h"             // clip_shard_grads_(): --clip-grad on a sharded gradient
#include "kit/sharding/flat.h"             // FlatParameters: the weights and gradients as flat buffers
#include "kit/models/transformer_lm.h"     // TransformerLM, lm_loss(): the model and its loss
#include "kit/data/wikitext.h"             // load_wikitext2(), LanguageModelDataset: the data
#include "kit/sharding/zero3.h"            // FullyShardedModel: the weights sharded too
#include "kit/train/zero_checkpoint.h"     // save_zero_checkpoint(), load_zero_checkpoint(): one file a rank

using Loader = kit::DataLoader<kit::LanguageModelDataset>;

// What training needs from a stage, whichever it is: the forward pass, zero_grad() and step(),
// the learning rate of the next step, the bytes this rank holds, and saving or resuming a
// checkpoint; and what the loop measures.
struct Trainer {
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::function<void()> zero_grad, step;
  std::function<void(double)> set_lr;
  // The rate of optimizer step `step` (counted from 0 over the whole run): exercise 02's rule.
  std::function<double(int64_t)> lr_at;
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
    trainer.set_lr(trainer.lr_at(state.global_step));  // warm-up, as exercise 02
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

// What a rank should hold at the end of training under `stage` (0: DDP), by the formula: fp32
// weights and gradients, 4 bytes a parameter each, AdamW's two moments, 8; for P parameters
// (`units`: ZeRO-3's units, their sizes, in chain order) on N ranks. The program prints it
// beside what the rank really holds (trainer.held()).
kit::HeldBytes predicted_bytes(int stage, int64_t P, int64_t N, const std::vector<int64_t>& units) {
  kit::HeldBytes b;
  //@ todo 1
  //@ | The formula, before you measure: how many bytes of params, grads and optimizer state
  //@ | does one rank hold at each stage, and how many bytes of weights does ZeRO-3 gather at
  //@ | once (gathered_peak; 0 at the other stages)? A sharded category holds one shard: the
  //@ | flat vector padded with zeros to N equal shards (kit/sharding/sharding.h, ShardLayout),
  //@ | ceil(P / N) elements; under ZeRO-3 each unit is a flat vector of its own, padded and
  //@ | sharded on its own, and gathered whole, padding included. Fill in b.params, b.grads,
  //@ | b.optimizer and b.gathered_peak; the bytes line below prints them beside what the rank
  //@ | really holds, and `kit check 03` compares both with its own formula.
  b = kit::HeldBytes{-1, -1, -1, -1};  // not predicted yet
  //@ solution
  const int64_t S = (P + N - 1) / N;  // one shard of the flat vector, padding included
  int64_t S3 = 0, largest = 0;        // ZeRO-3: a shard of every unit; the largest unit, padded
  for (int64_t u : units) {
    S3 += (u + N - 1) / N;
    largest = std::max(largest, (u + N - 1) / N * N);
  }
  b.params = 4 * (stage == 3 ? S3 : P);
  b.grads = 4 * (stage == 3 ? S3 : stage == 2 ? S : P);
  b.optimizer = 8 * (stage == 3 ? S3 : stage >= 1 ? S : P);
  b.gathered_peak = stage == 3 ? 4 * largest : 0;
  //@ end
  return b;
}

// "params A grads G optimizer O gathered X": the four figures of a HeldBytes, for the bytes line.
std::string figures(const kit::HeldBytes& b) {
  char text[160];
  std::snprintf(text, sizeof text, "params %lld grads %lld optimizer %lld gathered %lld",
                static_cast<long long>(b.params), static_cast<long long>(b.grads),
                static_cast<long long>(b.optimizer), static_cast<long long>(b.gathered_peak));
  return text;
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

// A stage whose TODO is not done yet: one line, and no training.
[[noreturn]] void not_done(int todo, const char* what) {
  std::fprintf(stderr, "error: TODO %d: %s is not done yet\n", todo, what);
  std::exit(2);
}

int main(int argc, char** argv) {
  // This exercise's own flags, taken out before exercise 01's flags are parsed: the stage, and
  // exercise 02's learning-rate rule and warm-up (kit/train/lr_rule.h), for every stage.
  const int zero_stage = static_cast<int>(
      kit::flag_int("--zero-stage", kit::take_flag(argc, argv, "--zero-stage", "0",
                                                   "0: DDP; 1, 2, 3: the ZeRO stage (default 0)"),
                    0, 3));
  const int64_t warmup_steps = kit::flag_int(
      "--warmup-steps", kit::take_flag(argc, argv, "--warmup-steps", "0",
                                       "climb to the rate linearly over this many steps (default 0)"),
      0);
  const std::string scaling = kit::take_flag(
      argc, argv, "--lr-scaling", "none",
      "none, linear or sqrt: scale --lr (tuned for one process) for the global batch (default none)");
  kit::TrainArgs args = kit::parse_args(argc, argv);
  kit::LrScaling lr_scaling = kit::LrScaling::none;
  try {
    lr_scaling = kit::parse_lr_scaling(scaling);
  } catch (const std::invalid_argument& e) {
    kit::flag_error(std::string("--lr-scaling: ") + e.what());
  }
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
  const int64_t P = numel_of(model->parameters());  // before ZeRO-3 empties the model's tensors

  // Exercise 02's rule: --lr was tuned for one process; a step sees batch x world_size samples.
  const double lr = kit::scale_lr(args.lr, lr_scaling, args.batch_size * world_size, args.batch_size);
  // Exercise 01's AdamW: every stage below trains with these options, as DDP does.
  const auto adamw = torch::optim::AdamWOptions(lr);
  // A checkpoint belongs to one stage and one learning-rate rule: another's is refused.
  kit::Checkpoints checkpoints(
      args.out_dir,
      kit::config_fingerprint(args, corpus.vocab.size()) + " zero-stage " +
          std::to_string(zero_stage) + " lr-scaling " + kit::to_string(lr_scaling) +
          " warmup-steps " + std::to_string(warmup_steps),
      args.keep_checkpoints);
  // What each stage trains with: DDP and torch's AdamW (stage 0); the model's weights and
  // gradients as flat buffers, with AdamW's state for this rank's shard, and your step (stages 1
  // and 2); a FullyShardedModel (stage 3). They live for the whole training; the TODOs decide what
  // a ZeRO stage does, and the wiring after them calls whichever holds a value.
  std::optional<kit::DistributedDataParallel> ddp;
  std::optional<torch::optim::AdamW> optimizer;
  std::optional<kit::FlatParameters> flat;
  std::optional<kit::ShardedAdamW> adamw_shard;
  torch::Tensor kept_grad;  // a gradient kept from one step() to the next zero_grad() (TODO 3)
  std::optional<kit::FullyShardedModel> sharded;
  Trainer trainer;
  trainer.lr_at = [&](int64_t step) { return lr * kit::warmup_factor(step, warmup_steps); };
  trainer.forward = [&](const torch::Tensor& x) { return model->forward(x); };
  if (zero_stage == 0) {  // DDP, exercise 01's way: the forward through the wrapper
    ddp.emplace(model);
    optimizer.emplace(model->parameters(), adamw);
    trainer.forward = [&](const torch::Tensor& x) { return ddp->forward(x); };
  }
  if (zero_stage == 1 || zero_stage == 2) {
    // Rank 0's weights everywhere, every parameter a view of flat->params(), every .grad (after
    // backward) a view of flat->grads(); AdamW's two moments for this rank's shard only.
    flat.emplace(model);
    adamw_shard.emplace(adamw, flat->layout().own(flat->params()));
  }
  // ZeRO-1's step, yours (TODO 2), which ZeRO-2 changes (TODO 3). Backward has left this rank's
  // own gradient (not the average) in flat->grads(), N S elements in flat->layout()'s order.
  auto zero_step = [&] {
    torch::NoGradGuard no_grad;  // the update is not part of the model's graph
    //@ todo 2
    //@ | ZeRO-1 shards what only the update reads: AdamW's two moments (adamw_shard: this
    //@ | rank's shard only). Write its step with the kit's collectives (kit/runtime/
    //@ | distributed.h) on the flat buffers (flat->layout(): kit/sharding/sharding.h).
    //@ | (1) This rank needs only its shard of the AVERAGED gradient: which collective, with
    //@ | which op, gives it that from flat->grads(), into a new tensor of shard() elements?
    //@ | (2) --clip-grad (args.clip_grad > 0): clip by the norm of the WHOLE averaged
    //@ | gradient, which no rank holds: kit::clip_shard_grads_ (kit/sharding/clip.h).
    //@ | (3) adamw_shard->update() this rank's shard of the weights, in place, with it.
    //@ | (4) Every rank then needs the others' updated shards: which collective, into which
    //@ | buffer? (Its input: a copy of your own shard, which is part of the output.)
    not_done(2, "ZeRO-1's step");
    //@ solution
    auto grad = torch::empty({flat->layout().shard()}, flat->params().options());
    kit::reduce_scatter(grad, flat->grads(), kit::ReduceOp::AVG);
    //@ end
    //@ todo 3
    //@ | ZeRO-2 shards the gradients too. From here on, which gradient buffer does this step
    //@ | still need, and which has served its purpose? Under --zero-stage 2 free what has
    //@ | served (FlatParameters::drop_grads(), kit/sharding/flat.h), now, before AdamW's
    //@ | temporaries, and keep what remains (in kept_grad) as this rank's gradient until the
    //@ | next zero_grad(). Compare the ZeRO-1 and ZeRO-2 bytes lines: which category shrank?
    //@ solution
    if (zero_stage == 2) {
      flat->drop_grads();
      kept_grad = grad;
    }
    //@ end
    //@ todo 2
    //@ | (steps 2 to 4 of ZeRO-1's step)
    //@ solution
    if (args.clip_grad > 0) kit::clip_shard_grads_({grad}, args.clip_grad, flat->group());
    adamw_shard->update(flat->layout().own(flat->params()), grad);
    kit::all_gather(flat->params(), flat->layout().own(flat->params()).clone());
    //@ end
  };
  if (zero_stage == 3) {
    //@ todo 4
    //@ | ZeRO-3 shards the weights too: kit::FullyShardedModel (kit/sharding/zero3.h) gathers
    //@ | a unit's full weights just before its forward (and again for its backward), then
    //@ | frees them. What is a unit? Your choice, in forward's order: model->units() lists the
    //@ | model's pieces (the embedding, each Transformer block, the output layer), one
    //@ | ShardedUnit can hold several; the whole model as one unit gathers everything at once.
    //@ | The largest unit is what a rank gathers at its peak (the bytes line's 'gathered',
    //@ | your formula's gathered_peak), each unit costs three collectives a step. Make
    //@ | `sharded` from the model and your units (stage 3, `adamw`, .max_grad_norm =
    //@ | args.clip_grad) and send trainer.forward through it: the model's own weights are
    //@ | empty.
    not_done(4, "ZeRO-3");
    //@ solution
    sharded.emplace(model, model->units(),
                    kit::ZeroOptions{.stage = 3, .adamw = adamw, .max_grad_norm = args.clip_grad});
    trainer.forward = [&](const torch::Tensor& x) { return sharded->forward(x); };
    //@ end
  }
  // The wiring: the Trainer calls whatever this stage made.
  if (ddp) {
    trainer.zero_grad = [&] { optimizer->zero_grad(); };
    trainer.step = [&] {  // --clip-grad: after backward, whose end DDP waits for every average
      if (args.clip_grad > 0) kit::clip_grad_norm_(model->parameters(), args.clip_grad);
      optimizer->step();
    };
    trainer.held = [&] { return ddp_held(model, *optimizer); };
    trainer.set_lr = [&](double rate) {
      for (auto& group : optimizer->param_groups()) group.options().set_lr(rate);
    };
  } else if (flat) {
    trainer.zero_grad = [&] {
      flat->drop_grads();
      kept_grad = torch::Tensor();
    };
    trainer.step = zero_step;
    trainer.held = [&] { return flat->held(*adamw_shard, kept_grad); };
    trainer.set_lr = [&](double rate) { adamw_shard->set_lr(rate); };
  } else {
    trainer.zero_grad = [&] { sharded->zero_grad(); };
    trainer.step = [&] { sharded->step(); };
    trainer.held = [&] { return sharded->held(); };
    trainer.set_lr = [&](double rate) { sharded->set_lr(rate); };
  }
  // The parameters in the units ZeRO-3 shards each on its own (the model's units() at the other
  // stages): the formula needs them, and the check computes its own from this line.
  std::vector<int64_t> unit_sizes;
  if (sharded) unit_sizes = sharded->unit_numels();
  else for (auto& u : model->units()) unit_sizes.push_back(numel_of(u.module->parameters()));
  std::string units;
  for (int64_t n : unit_sizes) units += " " + std::to_string(n);
  kit::print0("parameters %lld in units%s on %d ranks\n", static_cast<long long>(P), units.c_str(),
              world_size);
  // A ZeRO rank's shard of the training state, written to or read from a checkpoint's folder.
  kit::Checkpoints::ShardIO save_shard = [&](const std::string& dir) {
    if (flat) kit::save_zero_checkpoint(dir, *flat, *adamw_shard, zero_stage);
    else kit::save_zero_checkpoint(dir, *sharded);
  };
  kit::Checkpoints::ShardIO load_shard = [&](const std::string& dir) {
    if (flat) kit::load_zero_checkpoint(dir, *flat, *adamw_shard, zero_stage);
    else kit::load_zero_checkpoint(dir, *sharded);
  };
  trainer.save = [&](kit::TrainState& s) {
    if (ddp) return checkpoints.save(model, *optimizer, s);  // rank 0 writes the whole model
    //@ todo 5
    //@ | Checkpoints: under DDP rank 0 has everything and writes it alone. Under ZeRO nobody
    //@ | has: every rank writes its own shard (checkpoints.save_sharded with save_shard) and,
    //@ | in trainer.resume below, reads it back (resume_sharded with load_shard). Until then
    //@ | ZeRO saves nothing.
    //@ solution
    checkpoints.save_sharded(save_shard, s);
    //@ end
  };
  trainer.resume = [&] {
    if (ddp) return checkpoints.resume(model, *optimizer, device, args.resume);
    //@ todo 5
    //@ | (second place) each rank reads its own shard back: resume_sharded with load_shard.
    return kit::TrainState();
    //@ solution
    return checkpoints.resume_sharded(load_shard, device, args.resume);
    //@ end
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
  const std::string held = figures(trainer.held());
  const std::string formula = figures(predicted_bytes(zero_stage, P, world_size, unit_sizes));
  const std::string name = zero_stage == 0 ? "DDP" : "ZeRO-" + std::to_string(zero_stage);
  //@ todo 1
  //@ | (second place) What does this rank hold, and what did it need at its peak? Under ZeRO
  //@ | every rank holds a different share, so rank 0's line says nothing of the others: print
  //@ | it on EVERY rank, with std::printf and the rank first, "rank R: " then the rest of this
  //@ | line unchanged (`kit check 03` reads it).
  kit::print0("%s holds %s bytes, peak %lld; the formula: %s\n", name.c_str(), held.c_str(),
              static_cast<long long>(trainer.peak), formula.c_str());
  //@ solution
  std::printf("rank %d: %s holds %s bytes, peak %lld; the formula: %s\n", rank, name.c_str(),
              held.c_str(), static_cast<long long>(trainer.peak), formula.c_str());
  //@ end
  kit::destroy_process_group();
  return 0;
}
