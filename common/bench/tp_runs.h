// common/bench/tp_runs.h — train N in-process ranks (threads on one local Gloo world) on a dp x cp
// x tp mesh (kit::ParallelTransformerLM, DDP on the mesh's dp x cp group, torch's AdamW), and the
// same steps with exercise 01's kit::TransformerLM on one rank, the reference; record per rank the
// losses, the gradients after the first backward, the bytes held, the peak of live tensor bytes
// (kit/train/memory.h) and what each group's collectives were handed in one step. Shared by the
// tensor-parallel report (common/bench/tp_report.cpp) and the tests (tests/parallel/).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "kit/ddp/ddp.h"                 // DistributedDataParallel on the dp x cp group
#include "kit/models/transformer_lm.h"   // TransformerLM: the reference, lm_loss
#include "kit/parallel/context.h"        // cp_shard
#include "kit/parallel/mesh.h"           // Mesh
#include "kit/parallel/parallel_lm.h"    // ParallelTransformerLM
#include "kit/runtime/process_group.h"   // local_groups, CommStats
#include "kit/train/memory.h"            // Account: each rank's live tensor bytes

namespace kit_bench {

inline torch::optim::AdamWOptions tp_adamw() { return torch::optim::AdamWOptions(1e-3).weight_decay(0.01); }

// What to train: the model, the mesh, the global batch of random tokens, how many steps.
struct TpSetup {
  kit::TransformerLMOptions model;  // max_len: the sequence length
  int world = 1, tp = 1, cp = 1;
  std::string order = "tp-cp-dp";
  kit::CpSplit split = kit::CpSplit::contiguous;
  int64_t global_batch = 4, steps = 3;
  uint64_t seed = 1;
  // Keep copies of the starting weights and of the first gradients (TpRankRun::initial,
  // first_grads): for the tests; the report leaves them out, they would count in its peak.
  bool record = true;
};

// Step k's global batch (inputs, targets), the same for every run: [global_batch, seq] each.
inline std::pair<torch::Tensor, torch::Tensor> tp_batch(const TpSetup& s, int64_t k) {
  auto gen = at::detail::createCPUGenerator(1000 + k);
  const int64_t seq = s.model.max_len;
  auto ids = torch::randint(0, s.model.vocab_size, {s.global_batch, seq + 1}, gen, torch::kLong);
  return {ids.narrow(1, 0, seq).contiguous(), ids.narrow(1, 1, seq).contiguous()};
}

// What one group's collectives were handed in one step, by kind (kit::CommStats).
struct GroupTraffic {
  std::string ranks;  // the group's name: its world ranks
  std::map<std::string, int64_t> calls, bytes;
};

struct TpRankRun {
  int tp_rank = 0, cp_rank = 0, dp_rank = 0;
  std::vector<double> losses;  // per step: the global batch's loss (averaged over dp x cp)
  // After the first backward (and DDP's average): every parameter's gradient, by its name.
  std::map<std::string, torch::Tensor> first_grads;
  std::map<std::string, torch::Tensor> initial;  // the weights before the first step
  int64_t params = 0;  // elements held by this rank
  int64_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  int64_t activation_bytes = 0;  // live bytes after the forward minus before it (first step)
  int64_t peak = 0;              // the most live tensor bytes during a step, over the steps
  std::map<std::string, GroupTraffic> traffic;  // "tp", "cp", "dp-cp": forward + backward of one step
  double step_seconds = 0;       // the last step's wall time on this rank
};

inline std::vector<std::string> on_ranks(int n, const std::function<void(int)>& body) {
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

// The live bytes of `account` once they have stood still for 5 ms (at most 200 ms): Gloo's worker
// thread drops its reference to a collective's tensors a moment after wait() returns, and frees
// charged to the rank that made them would otherwise land inside a measured window or not, by
// chance.
inline int64_t settled_live(const kit::memory::Account& account) {
  int64_t last = account.live();
  auto still_since = std::chrono::steady_clock::now();
  const auto give_up = still_since + std::chrono::milliseconds(200);
  while (std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const int64_t now = account.live();
    if (now != last) {
      last = now;
      still_since = std::chrono::steady_clock::now();
    } else if (std::chrono::steady_clock::now() - still_since >= std::chrono::milliseconds(5)) {
      break;
    }
  }
  return last;
}

inline std::map<std::string, torch::Tensor> named(const torch::nn::Module& m, bool grads) {
  std::map<std::string, torch::Tensor> out;
  for (auto& p : m.named_parameters())
    out[p.key()] = (grads ? p.value().grad() : p.value()).detach().clone();
  return out;
}

// Trains s.world ranks on the mesh of s.tp, s.cp (dp the rest); `errors`, if given, receives each
// rank's exception text ("" if none). The models are made on this thread, one after the other
// (ParallelTransformerLM's rule), each on its rank's memory account.
inline std::vector<TpRankRun> train_tp(const TpSetup& s, std::vector<std::string>* errors_out = nullptr) {
  const int n = s.world;
  auto world = kit::ProcessGroup::local_groups(n, std::chrono::seconds(60));
  std::vector<std::unique_ptr<kit::Mesh>> meshes(n);
  std::vector<std::unique_ptr<kit::memory::Account>> accounts;
  for (int r = 0; r < n; ++r) accounts.push_back(std::make_unique<kit::memory::Account>());
  auto errors = on_ranks(n, [&](int r) {
    meshes[r] = std::make_unique<kit::Mesh>(
        kit::MeshOptions{.tp = s.tp, .cp = s.cp, .order = s.order, .ranks_per_node = n}, *world[r]);
  });
  std::vector<kit::ParallelTransformerLM> models;
  for (int r = 0; r < n && errors[0].empty(); ++r) {
    kit::memory::Account::Charge charge(*accounts[r]);
    models.emplace_back(s.model, *meshes[r], kit::ParallelLMOptions{.seed = s.seed, .cp_split = s.split});
  }
  std::vector<TpRankRun> runs(n);
  for (auto& e : errors)
    if (!e.empty()) {
      if (errors_out) *errors_out = errors;
      return runs;
    }
  errors = on_ranks(n, [&](int r) {
    kit::Mesh& mesh = *meshes[r];
    kit::memory::Account::Charge charge(*accounts[r]);
    TpRankRun& run = runs[r];
    run.tp_rank = mesh.tp_rank();
    run.cp_rank = mesh.cp_rank();
    run.dp_rank = mesh.dp_rank();
    auto& model = models[r];
    if (s.record) run.initial = named(*model, false);
    kit::DistributedDataParallel ddp(model, kit::DDPOptions{.group = &mesh.dp_cp()});
    torch::optim::AdamW adamw(model->parameters(), tp_adamw());
    const int64_t rows = s.global_batch / mesh.dp_size();
    for (int64_t k = 0; k < s.steps; ++k) {
      auto [input, target] = tp_batch(s, k);
      // This rank's data: its dp rank's rows, its cp rank's positions.
      auto x = kit::cp_shard(input.narrow(0, mesh.dp_rank() * rows, rows), 1, mesh, s.split);
      auto y = kit::cp_shard(target.narrow(0, mesh.dp_rank() * rows, rows), 1, mesh, s.split);
      std::map<std::string, std::map<std::string, int64_t>> calls, bytes;
      for (auto dims : {"tp", "cp", "dp-cp"}) {
        calls[dims] = mesh.group(dims).stats().calls;
        bytes[dims] = mesh.group(dims).stats().bytes;
      }
      const int64_t before = k == 0 ? settled_live(*accounts[r]) : 0;
      accounts[r]->reset_peak();
      const auto start = std::chrono::steady_clock::now();
      auto logits = ddp.forward(x);
      auto loss = kit::lm_loss(logits, y);
      if (k == 0) {  // (the first step's time includes these waits; the report shows the last's)
        run.activation_bytes = settled_live(*accounts[r]) - before;
      }
      loss.backward();
      if (k == 0 && s.record) run.first_grads = named(*model, true);
      adamw.step();
      run.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      run.peak = std::max(run.peak, accounts[r]->peak());
      for (auto dims : {"tp", "cp", "dp-cp"}) {
        auto& g = mesh.group(dims);
        GroupTraffic t{g.name(), {}, {}};
        for (auto& [kind, c] : g.stats().calls)
          if (c - calls[dims][kind] > 0) {
            t.calls[kind] = c - calls[dims][kind];
            t.bytes[kind] = g.stats().bytes.at(kind) - bytes[dims][kind];
          }
        run.traffic[dims] = t;
      }
      // The global batch's loss: the mean over dp x cp of the ranks' means (equal token counts).
      run.losses.push_back(
          kit::control::all_reduce(mesh.dp_cp(), loss.detach(), kit::ReduceOp::AVG).item<double>());
      if (k + 1 < s.steps) adamw.zero_grad();
    }
    for (auto& p : model->parameters()) {
      run.params += p.numel();
      run.param_bytes += p.nbytes();
      if (p.grad().defined()) run.grad_bytes += p.grad().nbytes();
    }
    for (auto& [key, state] : adamw.state()) {
      auto& a = static_cast<torch::optim::AdamWParamState&>(*state);
      run.optimizer_bytes += a.exp_avg().nbytes() + a.exp_avg_sq().nbytes();
    }
  });
  if (errors_out) *errors_out = errors;
  return runs;
}

// The reference: exercise 01's model, made after torch::manual_seed(s.seed), trained on the whole
// global batch on one rank with the same AdamW. One TpRankRun (losses, first_grads, initial).
inline TpRankRun train_reference(const TpSetup& s) {
  torch::manual_seed(s.seed);
  kit::TransformerLM model(s.model);
  TpRankRun run;
  run.initial = named(*model, false);
  torch::optim::AdamW adamw(model->parameters(), tp_adamw());
  for (int64_t k = 0; k < s.steps; ++k) {
    auto [x, y] = tp_batch(s, k);
    auto loss = kit::lm_loss(model->forward(x), y);
    loss.backward();
    if (k == 0) run.first_grads = named(*model, true);
    adamw.step();
    adamw.zero_grad();
    run.losses.push_back(loss.item<double>());
  }
  return run;
}

}  // namespace kit_bench
