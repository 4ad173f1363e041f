// kit_seq2seq_tp_probe — the summariser's model split over tp (kit::ParallelSeq2Seq) trained for a
// few SGD steps on padded batches, written out for tests/oracle/oracle_seq2seq_tp.py to replay
// with PyTorch's own tensor parallelism (DTensor). Run under ddprun, one rank per tp rank (tp =
// the world; no dp):
//
//   ddprun --nproc-per-node N -- kit_seq2seq_tp_probe --out DIR [--steps 3] [--seed 5]
//
// writes, into DIR:
//   weights.pt   rank 0: the weights the run starts from (kit::Seq2Seq's, torch's names) and the
//                position codes
//   batches.pt   rank 0: "src<k>", "tgt_in<k>", "tgt_out<k>" of every step, int64, padded with 0
//   rank<r>.pt   every rank: "loss<k>" (the step's loss, a 0-dim tensor) and "final/<name>",
//                every weight after the last step, gathered by write_full()
// With KIT_TRACE_DIR set, the trace lists every collective with its group and the line of this
// file that made the model (the oracle counts the all-reduces there). Dropout is off: a mask
// could not be replayed. Errors: one line, exit 1 (bad flags: exit 2).
#include <cstdio>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "kit/parallel/mesh.h"
#include "kit/parallel/random.h"
#include "kit/runtime/distributed.h"
#include "kit/seq2seq/batches.h"   // pad_batch
#include "kit/seq2seq/parallel.h"  // ParallelSeq2Seq
#include "kit/train/args.h"        // parse_flags
#include "probe_io.h"  // probe::write_tensors

int main(int argc, char** argv) {
  std::string out;
  int64_t steps = 3, seed = 5;
  auto whole = [](const char* flag, int64_t& to) {
    return [flag, &to](const std::string& v) { to = kit::flag_int(flag, v, 1); };
  };
  kit::parse_flags(argc, argv,
                   {{"--out", "folder for the records", [&](const std::string& v) { out = v; }},
                    {"--steps", "steps", whole("--steps", steps)},
                    {"--seed", "the model's seed", whole("--seed", seed)}});
  if (out.empty()) kit::flag_error("--out is required");
  const kit::Setup me = kit::setup(static_cast<uint64_t>(seed));
  const kit::Seq2SeqOptions o{.vocab_size = 37, .d_model = 32, .heads = 4, .encoder_layers = 2,
                              .decoder_layers = 2, .feedforward = 48, .dropout = 0.0,
                              .max_len = 16, .pad_id = 0, .bos_id = 1, .eos_id = 2,
                              .seed = static_cast<uint64_t>(seed)};
  kit::Mesh mesh({.tp = me.world_size});
  kit::RandomStreams streams(static_cast<uint64_t>(seed), mesh);
  kit::Seq2Seq full(o);  // the same weights on every rank (the same seed)
  kit::ParallelSeq2Seq model(full, mesh, streams);
  model->train();
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.5));
  if (me.rank == 0) {
    c10::Dict<std::string, torch::Tensor> w;
    for (auto& p : full->named_parameters()) w.insert(p.key(), p.value().detach());
    for (auto& b : full->named_buffers()) w.insert(b.key(), b.value().detach());
    probe::write_tensors(out + "/weights.pt", w, "kit_seq2seq_tp_probe");
  }
  c10::Dict<std::string, torch::Tensor> batches, mine;
  for (int64_t k = 0; k < steps; ++k) {
    // Four rows, mostly padding: documents of 11, 4, 7 and 9 tokens, summaries of 2 to 6.
    auto gen = at::detail::createCPUGenerator(1000 + k);
    std::vector<torch::Tensor> src, in, target;
    const int64_t doc_len[] = {11, 4, 7, 9}, sum_len[] = {2, 6, 3, 5};
    for (int r = 0; r < 4; ++r) {
      src.push_back(torch::randint(3, o.vocab_size, {doc_len[r]}, gen, torch::kLong));
      auto summary = torch::randint(3, o.vocab_size, {sum_len[r]}, gen, torch::kLong);
      in.push_back(torch::cat({torch::full({1}, o.bos_id, torch::kLong), summary}));
      target.push_back(torch::cat({summary, torch::full({1}, o.eos_id, torch::kLong)}));
    }
    auto s = kit::pad_batch(src, o.pad_id), ti = kit::pad_batch(in, o.pad_id),
         to = kit::pad_batch(target, o.pad_id);
    batches.insert("src" + std::to_string(k), s);
    batches.insert("tgt_in" + std::to_string(k), ti);
    batches.insert("tgt_out" + std::to_string(k), to);
    auto loss = kit::seq2seq_loss(model->forward(s, ti), to, o.pad_id);
    loss.backward();
    sgd.step();
    sgd.zero_grad();
    mine.insert("loss" + std::to_string(k), loss.detach());
  }
  model->write_full(full);
  for (auto& p : full->named_parameters()) mine.insert("final/" + p.key(), p.value().detach());
  if (me.rank == 0) probe::write_tensors(out + "/batches.pt", batches, "kit_seq2seq_tp_probe");
  probe::write_tensors(out + "/rank" + std::to_string(me.rank) + ".pt", mine,
                       "kit_seq2seq_tp_probe");
  kit::destroy_process_group();
  return 0;
}
