// Exercise 03 — beyond DDP: shard the training state with ZeRO-1, ZeRO-2 and ZeRO-3.
//
// Under DDP every rank holds the whole training state: the weights (4 bytes a parameter in
// fp32), their gradients (4 more) and AdamW's two moments (8 more), 16 bytes a parameter on
// every rank. ZeRO cuts that state into one shard per rank:
//   ZeRO-1  each rank keeps AdamW's moments for its shard only, updates its shard of the
//           weights, and the ranks all-gather the updated weights;
//   ZeRO-2  the gradients are reduce-scattered instead of all-reduced: each rank receives (and
//           keeps) only its shard of the averaged gradient;
//   ZeRO-3  even the weights stay sharded: each Transformer block is all-gathered just for its
//           forward and again for its backward, then freed.
// This program trains the same small Transformer on the same batches four times: with DDP (given,
// the reference), then ZeRO-1, ZeRO-2 and ZeRO-3. Each run prints its loss at every step and
// each rank the bytes it holds, by category. The TODOs replace DDP by each ZeRO stage in turn;
// the losses must stay DDP's and the bytes must shrink as the formula says
// (`./kit check 03` checks both). Run it on 2 ranks:
//     build/bin/ddprun --nproc-per-node 2 -- build/bin/ex03-exercise
#include <cstdio>
#include <string>
#include <utility>

#include <torch/torch.h>          // tensors, autograd, optimizers

#include "kit/args.h"             // parse_flags(), flag_int(): the command-line flags
#include "kit/ddp.h"              // DistributedDataParallel: the reference run
#include "kit/distributed.h"      // setup(), all_reduce(), print0(), destroy_process_group()
#include "kit/sharding.h"         // HeldBytes, bytes_of(): what a rank holds, by category
#include "kit/transformer_lm.h"   // TransformerLM, lm_loss(): the model and its loss
//@ todo 1
//@ | Include kit/zero.h (ZeroOptimizer: ZeRO-1 and ZeRO-2) and kit/zero3.h
//@ | (FullyShardedModel: ZeRO-3). Read their first comments: they say what each one does.
//@ solution
#include "kit/zero.h"             // ZeroOptimizer: AdamW's state, then the gradients, sharded
#include "kit/zero3.h"            // FullyShardedModel: the weights sharded too
//@ end

struct Config {
  int64_t steps = 3, batch = 8, seq_len = 16, d_model = 32, layers = 2, vocab = 101;
};

// Dropout off: every run then computes exactly the same function, and the losses compare.
kit::TransformerLMOptions model_options(const Config& c) {
  kit::TransformerLMOptions o;
  o.vocab_size = c.vocab;
  o.d_model = c.d_model;
  o.heads = 2;
  o.layers = c.layers;
  o.feedforward = 2 * c.d_model;
  o.dropout = 0.0;
  o.max_len = c.seq_len;
  return o;
}

// eps 1e-3, not AdamW's 1e-8: a gradient that is zero up to rounding (the attention key bias)
// would otherwise become a full-size update whose sign depends on the order of summation, and
// a reduce-scatter sums in another order than an all-reduce.
torch::optim::AdamWOptions adamw_options() {
  return torch::optim::AdamWOptions(1e-3).weight_decay(0.01).eps(1e-3);
}

// The same weights for every run (seeded), on this rank's device.
kit::TransformerLM make_model(const Config& c, torch::Device device) {
  torch::manual_seed(42);
  kit::TransformerLM model(model_options(c));
  model->to(device);
  return model;
}

// Step k's global batch of random word ids, the same on every rank and in every run; rank r
// trains on its own rows of it, as a DistributedSampler would give them.
std::pair<torch::Tensor, torch::Tensor> batch(const Config& c, int64_t k, int rank, int world,
                                              torch::Device device) {
  auto gen = at::detail::createCPUGenerator(1000 + k);
  auto ids = torch::randint(0, c.vocab, {c.batch, c.seq_len + 1}, gen, torch::kLong);
  auto mine = ids.narrow(0, rank * (c.batch / world), c.batch / world);
  return {mine.narrow(1, 0, c.seq_len).to(device), mine.narrow(1, 1, c.seq_len).to(device)};
}

// One training step with a model whose forward is model->forward: DDP's, ZeRO-1's and ZeRO-2's.
template <typename Optimizer>
torch::Tensor step(kit::TransformerLM& model, Optimizer& optimizer, const torch::Tensor& input,
                   const torch::Tensor& target) {
  optimizer.zero_grad();
  auto loss = kit::lm_loss(model->forward(input), target);
  loss.backward();
  optimizer.step();
  return loss;
}

// Runs c.steps steps of `one_step`; rank 0 prints each step's loss, averaged over the ranks.
template <typename OneStep>
void train(const std::string& name, const Config& c, int rank, int world, torch::Device device,
           OneStep one_step) {
  for (int64_t k = 0; k < c.steps; ++k) {
    auto [input, target] = batch(c, k, rank, world, device);
    torch::Tensor loss = one_step(input, target).detach();
    kit::all_reduce(loss, kit::ReduceOp::AVG);
    kit::print0("%s step %ld loss %.6f\n", name.c_str(), static_cast<long>(k + 1),
                loss.item<double>());
  }
}

// Every rank prints what it holds after training.
void report(const std::string& name, int rank, const kit::HeldBytes& b) {
  std::printf("rank %d: %s holds params %lld grads %lld optimizer %lld gathered %lld bytes\n",
              rank, name.c_str(), static_cast<long long>(b.params),
              static_cast<long long>(b.grads), static_cast<long long>(b.optimizer),
              static_cast<long long>(b.gathered_peak));
}

// What a rank holds under DDP: every weight, every gradient, both moments of every weight.
kit::HeldBytes held(kit::TransformerLM& model, torch::optim::AdamW& optimizer) {
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
// A sharded optimizer counts its own (a template: this file compiles before kit/zero.h is in).
template <typename Sharded>
kit::HeldBytes held(kit::TransformerLM&, Sharded& sharded) {
  return sharded.held();
}

// The reference: DDP with torch's AdamW.
void run_ddp(const Config& c, int rank, int world, torch::Device device) {
  kit::TransformerLM model = make_model(c, device);
  kit::DistributedDataParallel ddp(model);
  torch::optim::AdamW optimizer(model->parameters(), adamw_options());
  train("DDP", c, rank, world, device,
        [&](const torch::Tensor& in, const torch::Tensor& tg) { return step(model, optimizer, in, tg); });
  report("DDP", rank, held(model, optimizer));
}

// ZeRO-1 (stage 1) and ZeRO-2 (stage 2).
void run_zero(int stage, const Config& c, int rank, int world, torch::Device device) {
  kit::TransformerLM model = make_model(c, device);
  //@ todo 2
  //@ | ZeRO-1 and ZeRO-2: replace DDP and torch's AdamW by one kit::ZeroOptimizer for this
  //@ | `stage`, with adamw_options(). It takes DDP's place too (it broadcasts rank 0's weights
  //@ | and averages the gradients itself), so no DistributedDataParallel: the kit refuses both
  //@ | on one model. Its zero_grad() and step() are called as torch's are.
  kit::DistributedDataParallel ddp(model);
  torch::optim::AdamW optimizer(model->parameters(), adamw_options());
  //@ solution
  kit::ZeroOptimizer optimizer(model, {stage, adamw_options()});
  //@ end
  const std::string name = "ZeRO-" + std::to_string(stage);
  train(name, c, rank, world, device,
        [&](const torch::Tensor& in, const torch::Tensor& tg) { return step(model, optimizer, in, tg); });
  report(name, rank, held(model, optimizer));
}

// ZeRO-3: the weights sharded too.
void run_zero3(const Config& c, int rank, int world, torch::Device device) {
  kit::TransformerLM model = make_model(c, device);
  //@ todo 3
  //@ | ZeRO-3: wrap the model in a kit::FullyShardedModel (stage 3, adamw_options()) in place
  //@ | of DDP and AdamW. It keeps only this rank's shard of every block's weights, so
  //@ | model->forward no longer works: the step calls the wrapper's forward, then backward,
  //@ | then the wrapper's step() and zero_grad(). The bytes held come from its held().
  kit::DistributedDataParallel ddp(model);
  torch::optim::AdamW optimizer(model->parameters(), adamw_options());
  train("ZeRO-3", c, rank, world, device,
        [&](const torch::Tensor& in, const torch::Tensor& tg) { return step(model, optimizer, in, tg); });
  report("ZeRO-3", rank, held(model, optimizer));
  //@ solution
  kit::FullyShardedModel sharded(model, {3, adamw_options()});
  train("ZeRO-3", c, rank, world, device, [&](const torch::Tensor& in, const torch::Tensor& tg) {
    sharded.zero_grad();
    auto loss = kit::lm_loss(sharded.forward(in), tg);  // each block gathered for its forward
    loss.backward();  // each block gathered again, recomputed, its gradients reduce-scattered
    sharded.step();   // AdamW on this rank's shards: no communication
    return loss;
  });
  report("ZeRO-3", rank, sharded.held());
  //@ end
}

int main(int argc, char** argv) {
  Config c;
  kit::parse_flags(argc, argv, {
      // Accepted as every exercise's programs accept it (kit check passes it); this one writes
      // nothing but its output lines.
      {"--out-dir", "where a run may write (unused here)", [](auto) {}},
      {"--steps", "training steps of each run (1 to 1000)",
       [&](auto v) { c.steps = kit::flag_int("--steps", v, 1, 1000); }},
      {"--d-model", "the model's width (an even number, 2 to 1024)",
       [&](auto v) { c.d_model = kit::flag_int("--d-model", v, 2, 1024); }},
      {"--layers", "Transformer blocks (1 to 24)",
       [&](auto v) { c.layers = kit::flag_int("--layers", v, 1, 24); }},
  });
  if (c.d_model % 2 != 0) kit::flag_error("--d-model must be even (two attention heads)");

  auto [local_rank, rank, device, world_size] = kit::setup();
  if (c.batch % world_size != 0)
    kit::flag_error("the global batch of " + std::to_string(c.batch) + " sequences must divide by "
                    "the " + std::to_string(world_size) + " ranks");
  // The model's size, and how its parameters fall into units (ZeRO-3 shards each on its own).
  {
    kit::TransformerLM model = make_model(c, device);
    std::string units;
    int64_t all = 0;
    for (auto& u : model->units()) {
      int64_t n = 0;
      for (auto& p : u.module->parameters()) n += p.numel();
      units += " " + std::to_string(n);
      all += n;
    }
    kit::print0("parameters %lld in units%s on %d ranks\n", static_cast<long long>(all),
                units.c_str(), world_size);
  }
  run_ddp(c, rank, world_size, device);
  run_zero(1, c, rank, world_size, device);
  run_zero(2, c, rank, world_size, device);
  run_zero3(c, rank, world_size, device);
  kit::destroy_process_group();
  (void)local_rank;
  return 0;
}
