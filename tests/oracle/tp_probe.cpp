// kit_tp_probe — the kit's tensor-parallel language model trained for a few steps, written out for
// tests/oracle/oracle_tp.py to replay with PyTorch's own tensor parallelism (DTensor). Run under
// ddprun, one rank per tp rank (tp = the world; no dp, no cp):
//
//   ddprun --nproc-per-node N -- kit_tp_probe --out DIR [--steps 3] [--seed 5] [--d-model 32]
//       [--heads 4] [--layers 2] [--feedforward 64] [--vocab 97] [--seq 16] [--batch 4]
//
// writes, into DIR:
//   weights.pt          rank 0: the weights the run starts from, gathered from the tp ranks into
//                       a TransformerLM (its parameter names), and the position codes
//   batches.pt          rank 0: "input<k>", "target<k>" of every step, [batch, seq] int64
//   rank<r>.pt          every rank: "loss<k>" (the step's loss, a 0-dim tensor); for every
//                       parameter p after the first backward, "grad/p" (this rank's shard of its
//                       gradient), "index/p" (where the shard's elements sit in the flat tp = 1
//                       tensor) and "full/p" (that tensor's TransformerLM name, as a uint8 tensor)
// With KIT_TRACE_DIR set, the trace lists every collective with its group and the line of this
// file that made the model (the oracle counts Megatron's all-reduces there). Dropout is off: a
// mask could not be replayed. Errors: one line, exit 1 (bad flags: exit 2).
#include <cstdio>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "kit/ddp/ddp.h"
#include "kit/models/transformer_lm.h"
#include "kit/parallel/mesh.h"
#include "kit/parallel/parallel_lm.h"
#include "kit/runtime/distributed.h"
#include "kit/train/args.h"  // parse_flags
#include "probe_io.h"  // probe::write_tensors

namespace {

torch::Tensor text(const std::string& s) {
  return torch::tensor(std::vector<int64_t>(s.begin(), s.end()), torch::kLong).to(torch::kUInt8);
}

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  int64_t steps = 3, seed = 5, batch = 4;
  kit::TransformerLMOptions o;
  o.d_model = 32;
  o.heads = 4;
  o.layers = 2;
  o.feedforward = 64;
  o.vocab_size = 97;
  o.max_len = 16;
  o.dropout = 0.0;
  auto whole = [](const char* flag, int64_t& to) {
    return [flag, &to](const std::string& v) { to = kit::flag_int(flag, v, 1); };
  };
  kit::parse_flags(argc, argv,
                   {{"--out", "folder for the records", [&](const std::string& v) { out = v; }},
                    {"--steps", "steps", whole("--steps", steps)},
                    {"--seed", "the model's seed", whole("--seed", seed)},
                    {"--d-model", "width", whole("--d-model", o.d_model)},
                    {"--heads", "heads", whole("--heads", o.heads)},
                    {"--layers", "blocks", whole("--layers", o.layers)},
                    {"--feedforward", "MLP width", whole("--feedforward", o.feedforward)},
                    {"--vocab", "vocabulary", whole("--vocab", o.vocab_size)},
                    {"--seq", "sequence length", whole("--seq", o.max_len)},
                    {"--batch", "sequences per step", whole("--batch", batch)}});
  if (out.empty()) kit::flag_error("--out is required");
  const kit::Setup me = kit::setup(static_cast<uint64_t>(seed));
  kit::Mesh mesh({.tp = me.world_size});
  kit::ParallelTransformerLM model(o, mesh, {.seed = static_cast<uint64_t>(seed)});
  kit::DistributedDataParallel ddp(model, {.group = &mesh.dp_cp()});
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.01));

  kit::TransformerLM full(o);  // the starting weights, gathered from the shards
  model->gather_into(full);
  if (me.rank == 0) {
    c10::Dict<std::string, torch::Tensor> w;
    for (auto& p : full->named_parameters()) w.insert(p.key(), p.value().detach());
    for (auto& b : full->named_buffers()) w.insert(b.key(), b.value().detach());
    probe::write_tensors(out + "/weights.pt", w, "kit_tp_probe");
  }
  c10::Dict<std::string, torch::Tensor> batches, mine;
  auto names = full->named_parameters();
  for (int64_t k = 0; k < steps; ++k) {
    auto gen = at::detail::createCPUGenerator(1000 + k);
    auto ids = torch::randint(0, o.vocab_size, {batch, o.max_len + 1}, gen, torch::kLong);
    auto x = ids.narrow(1, 0, o.max_len).contiguous(), y = ids.narrow(1, 1, o.max_len).contiguous();
    batches.insert("input" + std::to_string(k), x);
    batches.insert("target" + std::to_string(k), y);
    auto loss = kit::lm_loss(ddp.forward(x), y);
    loss.backward();
    if (k == 0)
      for (auto& p : model->named_parameters()) {
        const std::string whole_name = model->full_name(p.key());
        const auto& like = names[whole_name];
        auto where = torch::arange(like.numel(), torch::kLong).view(like.sizes());
        mine.insert("grad/" + p.key(), p.value().grad().detach().clone());
        mine.insert("index/" + p.key(), model->slice_of(p.key(), where).reshape({-1}).contiguous());
        mine.insert("full/" + p.key(), text(whole_name));
      }
    adamw.step();
    adamw.zero_grad();
    mine.insert("loss" + std::to_string(k), loss.detach());
  }
  if (me.rank == 0) probe::write_tensors(out + "/batches.pt", batches, "kit_tp_probe");
  probe::write_tensors(out + "/rank" + std::to_string(me.rank) + ".pt", mine, "kit_tp_probe");
  kit::destroy_process_group();
  return 0;
}
