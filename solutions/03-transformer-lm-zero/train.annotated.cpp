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
// --zero-stage 0 (the default) is DDP. The TODOs add one stage at a time; the losses must stay
// DDP's and the bytes each rank holds must shrink as the formula says (`./kit check 03`).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <string>

#include <torch/torch.h>          // tensors, autograd, optimizers

#include "kit/args.h"             // TrainArgs, parse_args(), take_flag(), flag_int(): the flags
#include "kit/checkpoint.h"       // Checkpoints, TrainState: save, resume, stop before the time limit
#include "kit/data_loader.h"      // DataLoader (and DistributedSampler): batches of samples
#include "kit/ddp.h"              // DistributedDataParallel: stage 0
#include "kit/distributed.h"      // setup(), all_reduce(), print0(), save0(), destroy_process_group()
#include "kit/metrics.h"          // Metrics: metrics.csv, progress lines, per-rank reports
#include "kit/sharding.h"         // HeldBytes, bytes_of(): what a rank holds, by category
#include "kit/transformer_lm.h"   // TransformerLM, lm_loss(): the model and its loss
#include "kit/wikitext.h"         // load_wikitext2(), LanguageModelDataset: the data
//@ todo 1
//@ | Include kit/zero.h (ZeroOptimizer: ZeRO-1 and 2), kit/zero3.h (FullyShardedModel: ZeRO-3)
//@ | and kit/zero_checkpoint.h (sharded checkpoints). Their first comments say what each does.
//@ solution
#include "kit/zero.h"             // ZeroOptimizer: AdamW's state, then the gradients, sharded
#include "kit/zero3.h"            // FullyShardedModel: the weights sharded too
#include "kit/zero_checkpoint.h"  // save_zero_checkpoint(), load_zero_checkpoint(): one file a rank
//@ end

using Loader = kit::DataLoader<kit::LanguageModelDataset>;

// What training needs from a stage, whichever it is: the forward pass, zero_grad() and step(),
// the bytes this rank holds, and saving or resuming a checkpoint.
struct Trainer {
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::function<void()> zero_grad, step;
  std::function<kit::HeldBytes()> held;
  std::function<void(kit::TrainState&)> save;
  std::function<kit::TrainState()> resume;
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
    auto input = batch.input.to(device), target = batch.target.to(device);
    trainer.zero_grad();
    auto loss = kit::lm_loss(trainer.forward(input), target);
    loss.backward();
    trainer.step();
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

// A stage whose TODO is not done yet: one line, and no training.
[[noreturn]] void not_done(const char* todo, int stage) {
  std::fprintf(stderr, "error: TODO %s: ZeRO-%d is not done yet\n", todo, stage);
  std::exit(2);
}

int main(int argc, char** argv) {
  // --zero-stage is this exercise's own flag: taken out before exercise 01's flags are parsed.
  const int zero_stage = static_cast<int>(
      kit::flag_int("--zero-stage", kit::take_flag(argc, argv, "--zero-stage", "0",
                                                   "0: DDP; 1, 2, 3: the ZeRO stage (default 0)"),
                    0, 3));
  kit::TrainArgs args = kit::parse_args(argc, argv);
  // Stages whose TODO is missing stop here, before anything else: their TODO is named.
  //@ todo 3
  //@ | ZeRO-1. Remove this line; then, below, give --zero-stage 1 a ZeroOptimizer.
  if (zero_stage == 1) not_done("3", 1);
  //@ solution
  //@ end
  //@ todo 4
  //@ | ZeRO-2. Remove this line; then, below, give --zero-stage 2 its ZeroOptimizer.
  if (zero_stage == 2) not_done("4", 2);
  //@ solution
  //@ end
  //@ todo 5
  //@ | ZeRO-3. Remove this line; then, below, give --zero-stage 3 a FullyShardedModel.
  if (zero_stage == 3) not_done("5", 3);
  //@ solution
  //@ end

  auto [local_rank, rank, device, world_size] = kit::setup(args.seed);
  std::printf("rank %d of %d: local rank %d, device %s\n", rank, world_size, local_rank,
              device.str().c_str());

  kit::WikiText2 corpus = kit::load_wikitext2(args.data_dir);
  kit::LanguageModelDataset train_data(corpus.train, args.seq_len, "train");
  kit::LanguageModelDataset val_data(corpus.valid, args.seq_len, "valid");
  kit::LanguageModelDataset test_data(corpus.test, args.seq_len, "test");
  kit::DistributedSampler train_sampler(train_data, /*shuffle=*/true, args.seed);
  kit::DistributedEvalSampler val_sampler(val_data);  // every sample once: see exercise 01
  kit::DistributedEvalSampler test_sampler(test_data);
  Loader train_loader(train_data, args.batch_size, train_sampler);
  Loader val_loader(val_data, args.eval_batch_size, val_sampler);
  Loader test_loader(test_data, args.eval_batch_size, test_sampler);

  kit::TransformerLM model(kit::TransformerLMOptions::from(args, corpus.vocab.size()));
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
  // Every stage fills the same Trainer, and what it wraps lives for the whole training.
  Trainer trainer;
  std::optional<kit::DistributedDataParallel> ddp;
  std::optional<torch::optim::AdamW> optimizer;
  trainer.forward = [&](const torch::Tensor& x) { return model->forward(x); };
  if (zero_stage == 0) {  // DDP, exercise 01's way
    ddp.emplace(model);
    optimizer.emplace(model->parameters(), adamw);
    trainer.zero_grad = [&] { optimizer->zero_grad(); };
    trainer.step = [&] {  // --clip-grad: after backward, whose end DDP waits for every average
      if (args.clip_grad > 0) torch::nn::utils::clip_grad_norm_(model->parameters(), args.clip_grad);
      optimizer->step();
    };
    trainer.held = [&] { return ddp_held(model, *optimizer); };
    trainer.save = [&](kit::TrainState& s) { checkpoints.save(model, *optimizer, s); };
    trainer.resume = [&, device = device] {  // (C++17 lambdas cannot capture a structured binding)
      return checkpoints.resume(model, *optimizer, device, args.resume);
    };
  }
  //@ todo 3
  //@ | ZeRO-1: for --zero-stage 1, one kit::ZeroOptimizer (stage 1, `adamw`, and max_grad_norm
  //@ | args.clip_grad: --clip-grad, clipped on the averaged gradient) replaces both DDP and
  //@ | torch's AdamW: it broadcasts rank 0's weights and averages the gradients itself (the
  //@ | kit refuses DDP and ZeRO on one model). Its zero_grad(), step() and held() fill the
  //@ | Trainer; the forward stays model->forward.
  //@ solution
  std::optional<kit::ZeroOptimizer> zero;  // stages 1 and 2
  if (zero_stage == 1) {
    zero.emplace(model, kit::ZeroOptions{.stage = 1, .adamw = adamw, .max_grad_norm = args.clip_grad});
    trainer.zero_grad = [&] { zero->zero_grad(); };
    trainer.step = [&] { zero->step(); };
    trainer.held = [&] { return zero->held(); };
  }
  //@ end
  //@ todo 4
  //@ | ZeRO-2: the gradients are reduce-scattered, and each rank keeps only its averaged shard
  //@ | of them. The same ZeroOptimizer does it with stage 2. Compare the two stages' byte lines.
  //@ solution
  if (zero_stage == 2) {
    zero.emplace(model, kit::ZeroOptions{.stage = 2, .adamw = adamw, .max_grad_norm = args.clip_grad});
    trainer.zero_grad = [&] { zero->zero_grad(); };
    trainer.step = [&] { zero->step(); };
    trainer.held = [&] { return zero->held(); };
  }
  //@ end
  //@ todo 5
  //@ | ZeRO-3: wrap the model in a kit::FullyShardedModel (stage 3, `adamw`, args.clip_grad).
  //@ | It keeps only this rank's shard of every unit's weights, so model->forward no longer
  //@ | works: the Trainer's forward must go through the wrapper (training and evaluation alike).
  //@ solution
  std::optional<kit::FullyShardedModel> sharded;
  if (zero_stage == 3) {
    sharded.emplace(model, kit::ZeroOptions{.stage = 3, .adamw = adamw, .max_grad_norm = args.clip_grad});
    trainer.forward = [&](const torch::Tensor& x) { return sharded->forward(x); };
    trainer.zero_grad = [&] { sharded->zero_grad(); };
    trainer.step = [&] { sharded->step(); };
    trainer.held = [&] { return sharded->held(); };
  }
  //@ end
  //@ todo 6
  //@ | Sharded checkpoints: under ZeRO no rank holds the whole model and optimizer, so each rank
  //@ | saves its own shard. Fill trainer.save with checkpoints.save_sharded() and trainer.resume
  //@ | with checkpoints.resume_sharded(), each given a function of the folder that calls
  //@ | kit::save_zero_checkpoint or kit::load_zero_checkpoint on the ZeroOptimizer or the
  //@ | FullyShardedModel. Until then ZeRO runs neither save nor resume.
  if (zero_stage > 0) {
    trainer.save = [](kit::TrainState&) {};
    trainer.resume = [] { return kit::TrainState(); };
  }
  //@ solution
  if (zero_stage > 0) {
    // Each rank writes, or reads back, its shard of whichever of the two this stage uses.
    kit::Checkpoints::ShardIO save_shard = [&](const std::string& dir) {
      if (zero) kit::save_zero_checkpoint(dir, *zero);
      else kit::save_zero_checkpoint(dir, *sharded);
    };
    kit::Checkpoints::ShardIO load_shard = [&](const std::string& dir) {
      if (zero) kit::load_zero_checkpoint(dir, *zero);
      else kit::load_zero_checkpoint(dir, *sharded);
    };
    trainer.save = [&, save_shard](kit::TrainState& s) { checkpoints.save_sharded(save_shard, s); };
    trainer.resume = [&, load_shard, device = device] {
      return checkpoints.resume_sharded(load_shard, device, args.resume);
    };
  }
  //@ end

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
    // Under ZeRO-3 no rank has the whole model: its checkpoint is the shards.
    if (val_loss < state.best_val_loss) {
      state.best_val_loss = val_loss;
      if (zero_stage < 3) kit::save0(model, args.out_dir + "/model-best.pt");
    }
    state.next_epoch();
    trainer.save(state);
  }

  if (state.stopped) {
    trainer.save(state);
  } else {
    double test_loss = evaluate(model, test_loader, trainer, device).item<double>();
    kit::print0("final test loss %.5f (perplexity %.2f)\n", test_loss, std::exp(test_loss));
    if (zero_stage < 3) kit::save0(model, args.out_dir + "/model-final.pt");
  }
  const kit::HeldBytes held = trainer.held();
  const std::string name = zero_stage == 0 ? "DDP" : "ZeRO-" + std::to_string(zero_stage);
  //@ todo 2
  //@ | What does this rank hold? Under ZeRO every rank holds a different share, so rank 0's line
  //@ | says nothing of the others: print it on EVERY rank, with std::printf and the rank first,
  //@ | "rank R: " then the rest of this line unchanged (`kit check 03` reads it).
  kit::print0("%s holds params %lld grads %lld optimizer %lld gathered %lld bytes\n", name.c_str(),
              static_cast<long long>(held.params), static_cast<long long>(held.grads),
              static_cast<long long>(held.optimizer), static_cast<long long>(held.gathered_peak));
  //@ solution
  std::printf("rank %d: %s holds params %lld grads %lld optimizer %lld gathered %lld bytes\n",
              rank, name.c_str(), static_cast<long long>(held.params),
              static_cast<long long>(held.grads), static_cast<long long>(held.optimizer),
              static_cast<long long>(held.gathered_peak));
  //@ end
  kit::destroy_process_group();
  return 0;
}
