// common/bench/zero_runs.h — train N in-process ranks (threads on one local Gloo world) at a ZeRO
// stage (0: DDP + torch::optim::AdamW; 1, 2: kit::ZeroOptimizer; 3: kit::FullyShardedModel) on
// random tokens, and record per rank the losses, the bytes of training state held (measured on
// the tensors), the peak of live tensor bytes in a step (kit/train/memory.h) and the bytes handed
// to each collective in one step. Shared by the ZeRO report
// (common/bench/zero_report.cpp) and the equivalence tests (tests/ddp/zero_test.cpp).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "kit/ddp/ddp.h"                // DistributedDataParallel: stage 0
#include "kit/train/clip.h"             // clip_grad_norm_: stage 0's --clip-grad
#include "kit/train/memory.h"           // Account: each rank's live tensor bytes
#include "kit/runtime/process_group.h"  // local_groups, CommStats
#include "kit/sharding/sharding.h"      // HeldBytes, bytes_of
#include "kit/models/transformer_lm.h"  // TransformerLM, lm_loss
#include "kit/sharding/zero.h"          // ZeroOptimizer: stages 1 and 2
#include "kit/sharding/zero3.h"         // FullyShardedModel: stage 3

namespace kit_bench {

inline torch::optim::AdamWOptions adamw() {
  // AdamW's default eps (1e-8): TransformerLM holds the attention's key bias, whose gradient
  // would be rounding noise, at zero (kit/models/transformer_lm.h).
  return torch::optim::AdamWOptions(1e-3).weight_decay(0.01);
}

// What to train: the model, the global batch of random tokens, how many steps.
struct Setup {
  kit::TransformerLMOptions model;
  int64_t global_batch = 8, steps = 4;
  double max_grad_norm = 0;  // > 0: gradients clipped to this global norm (DDP: kit::clip_grad_norm_)
  bool recompute = false;    // stage 3: FullyShardedOptions::recompute
  // Set: the learning rate of step k (0-based), set before it (DDP: torch's param groups'
  // set_lr; ZeRO: set_lr()). Unset: adamw()'s, constant.
  std::function<double(int64_t)> lr;
};

// Step k's global batch (inputs, targets), the same for every run; rank r reads its rows.
inline std::pair<torch::Tensor, torch::Tensor> batch(const Setup& s, int64_t k, int n, int r) {
  auto gen = at::detail::createCPUGenerator(1000 + k);
  const int64_t seq = s.model.max_len;
  auto ids = torch::randint(0, s.model.vocab_size, {s.global_batch, seq + 1}, gen, torch::kLong);
  auto mine = ids.narrow(0, r * (s.global_batch / n), s.global_batch / n);
  return {mine.narrow(1, 0, seq), mine.narrow(1, 1, seq)};
}

struct RankRun {
  std::vector<double> losses;   // this rank's, per step
  std::vector<torch::Tensor> weights;  // per unit: the full flat weights after the last step
                                       // (ZeRO-3: padded to its layout)
  kit::HeldBytes held;          // after the last step
  int64_t peak = 0;             // the most bytes of live tensors during a step, over the steps
  std::map<std::string, int64_t> step_bytes;  // handed to each kind of collective in one step
  int64_t P = 0, padded = 0;
  std::vector<double> grad_norms;  // with max_grad_norm: the global norm before clipping, per step
};

inline std::vector<std::string> on_every_rank(int n, const std::function<void(int)>& body) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// Each unit's parameters end to end (no padding): what the sharded runs are compared on.
inline std::vector<torch::Tensor> unit_weights(kit::TransformerLM& model) {
  std::vector<torch::Tensor> out;
  for (auto& u : model->units()) {
    std::vector<torch::Tensor> parts;
    for (auto& p : u.module->parameters()) parts.push_back(p.detach().reshape(-1));
    out.push_back(torch::cat(parts));
  }
  return out;
}

// Trains N ranks for s.steps at `stage` (0: DDP) and returns each rank's record; `errors`, if
// given, receives each rank's exception text ("" if none).
inline std::vector<RankRun> train(const Setup& s, int stage, int n,
                                  std::vector<std::string>* errors_out = nullptr) {
  auto groups = kit::ProcessGroup::local_groups(n, std::chrono::seconds(30));
  std::vector<kit::TransformerLM> models;
  // Each rank's tensors, its model's included (made here, in order, for the seeds), on its own
  // account: the ranks are threads of one process.
  std::vector<std::unique_ptr<kit::memory::Account>> accounts;
  for (int r = 0; r < n; ++r) {
    accounts.push_back(std::make_unique<kit::memory::Account>());
    kit::memory::Account::Charge charge(*accounts[r]);
    torch::manual_seed(r == 0 ? 1 : 100 + r);  // rank 0's weights must reach everybody
    models.emplace_back(s.model);
  }
  std::vector<RankRun> runs(n);
  auto errors = on_every_rank(n, [&](int r) {
    kit::ProcessGroup& g = *groups[r];
    kit::memory::Account::Charge charge(*accounts[r]);
    kit::ZeroOptions o{stage, adamw(), &g};
    o.max_grad_norm = s.max_grad_norm;
    std::unique_ptr<kit::DistributedDataParallel> ddp;
    std::unique_ptr<torch::optim::AdamW> torch_adamw;
    std::unique_ptr<kit::ZeroOptimizer> zero;
    std::unique_ptr<kit::FullyShardedModel> zero3;
    if (stage == 0) {
      kit::DDPOptions d;
      d.group = &g;
      ddp = std::make_unique<kit::DistributedDataParallel>(models[r], d);
      torch_adamw = std::make_unique<torch::optim::AdamW>(models[r]->parameters(), adamw());
    } else if (stage < 3) {
      zero = std::make_unique<kit::ZeroOptimizer>(models[r], o);
    } else {
      zero3 = std::make_unique<kit::FullyShardedModel>(models[r], o,
                                                       kit::FullyShardedOptions{s.recompute});
    }
    for (int64_t k = 0; k < s.steps; ++k) {
      auto before = g.stats().bytes;
      accounts[r]->reset_peak();
      if (s.lr) {
        if (torch_adamw)
          for (auto& group : torch_adamw->param_groups()) group.options().set_lr(s.lr(k));
        if (zero) zero->set_lr(s.lr(k));
        if (zero3) zero3->set_lr(s.lr(k));
      }
      auto [input, target] = batch(s, k, n, r);
      // Under DDP through the wrapper, as a trainer (kit/ddp/ddp.h: the forward prepares backward).
      auto logits = zero3 ? zero3->forward(input) : ddp ? ddp->forward(input) : models[r]->forward(input);
      auto loss = kit::lm_loss(logits, target);
      loss.backward();
      // Under DDP backward returns once every average is in: each rank clips the same gradient
      // (as the trainers do, with the norm left on the device; read here for the record).
      if (torch_adamw && s.max_grad_norm > 0)
        runs[r].grad_norms.push_back(
            kit::clip_grad_norm_(models[r]->parameters(), s.max_grad_norm).item<double>());
      if (torch_adamw) torch_adamw->step();
      if (zero) zero->step();
      if (zero3) zero3->step();
      if (!torch_adamw && s.max_grad_norm > 0)
        runs[r].grad_norms.push_back((zero ? zero->grad_norm() : zero3->grad_norm()).item<double>());
      runs[r].losses.push_back(loss.item<double>());
      runs[r].peak = std::max(runs[r].peak, accounts[r]->peak());
      runs[r].step_bytes.clear();
      for (auto& [kind, b] : g.stats().bytes) runs[r].step_bytes[kind] = b - before[kind];
      if (k + 1 < s.steps) {  // the last step's gradients stay, for held()
        if (torch_adamw) torch_adamw->zero_grad();
        if (zero) zero->zero_grad();
        if (zero3) zero3->zero_grad();
      }
    }
    RankRun& run = runs[r];
    if (stage == 0) {
      auto params = models[r]->parameters();
      run.held.params = kit::bytes_of(params);
      std::vector<torch::Tensor> grads, state;
      for (auto& p : params) grads.push_back(p.grad());
      for (auto& [key, s] : torch_adamw->state()) {
        auto& a = static_cast<torch::optim::AdamWParamState&>(*s);
        state.push_back(a.exp_avg());
        state.push_back(a.exp_avg_sq());
      }
      run.held.grads = kit::bytes_of(grads);
      run.held.optimizer = kit::bytes_of(state);
      run.P = run.padded = kit::bytes_of(params) / 4;
    } else if (zero) {
      run.held = zero->held();
      run.P = zero->layout().numel();
      run.padded = zero->layout().padded();
    } else {
      run.held = zero3->held();
      run.P = zero3->numel();
      run.padded = zero3->padded();
    }
    if (!zero3) {
      run.weights = unit_weights(models[r]);
    } else {  // nobody holds them whole: each unit's shards gathered (padded), after the steps
      for (auto& shard : zero3->shards()) {
        auto full = torch::empty({shard.numel() * n}, shard.options().requires_grad(false));
        g.all_gather(full, shard.detach());
        run.weights.push_back(full);
      }
    }
  });
  if (errors_out) *errors_out = errors;
  return runs;
}

}  // namespace kit_bench
