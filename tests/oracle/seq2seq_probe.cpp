// seq2seq_probe: the summariser's model (kit/seq2seq/model.h) on one padded batch, for
// oracle_seq2seq.py: writes its weights, the batch, the logits, the loss, every parameter's
// gradient, and the greedy decoding of the same model trained on the batch, to one file of named tensors (torch::pickle_save of a dict,
// torch.load in Python).
//
//   seq2seq_probe OUT.pt
#include <iostream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "kit/seq2seq/batches.h"
#include "kit/seq2seq/model.h"
#include "probe_io.h"  // probe::write_tensors

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: seq2seq_probe OUT.pt\n";
    return 2;
  }
  torch::set_num_threads(1);  // a tiny model: threads only cost time on a busy machine
  torch::manual_seed(0);      // the batch's ids; the weights come from options.seed
  kit::Seq2SeqOptions o{.vocab_size = 23, .d_model = 16, .heads = 2, .encoder_layers = 2,
                        .decoder_layers = 2, .feedforward = 32, .dropout = 0.0, .max_len = 20,
                        .pad_id = 0, .bos_id = 1, .eos_id = 2, .seed = 7};
  kit::Seq2Seq model(o);
  // Four documents of different lengths and their summaries: most rows padded, so that a mask
  // left out moves the numbers.
  std::vector<torch::Tensor> docs, sums_in, sums_out;
  for (int64_t n : {11, 4, 7, 9}) docs.push_back(torch::randint(3, o.vocab_size, {n}, torch::kLong));
  for (int64_t n : {5, 2, 6, 3}) {
    auto s = torch::randint(3, o.vocab_size, {n}, torch::kLong);
    sums_in.push_back(torch::cat({torch::tensor({o.bos_id}), s}));
    sums_out.push_back(torch::cat({s, torch::tensor({o.eos_id})}));
  }
  auto src = kit::pad_batch(docs, o.pad_id), tgt_in = kit::pad_batch(sums_in, o.pad_id);
  auto tgt_out = kit::pad_batch(sums_out, o.pad_id);

  auto logits = model->forward(src, tgt_in);
  auto loss = kit::seq2seq_loss(logits, tgt_out, o.pad_id);
  loss.backward();

  c10::Dict<std::string, torch::Tensor> out;
  out.insert("options", torch::tensor({o.vocab_size, o.d_model, o.heads, o.encoder_layers,
                                       o.decoder_layers, o.feedforward, o.max_len, o.pad_id,
                                       o.bos_id, o.eos_id}));
  for (const auto& p : model->named_parameters()) {
    out.insert("param." + p.key(), p.value().detach().clone());
    out.insert("grad." + p.key(), p.value().grad().clone());
  }
  for (const auto& b : model->named_buffers()) out.insert("param." + b.key(), b.value().clone());

  // Greedy decoding from a model that has learnt this batch's summaries (60 Adam steps): rows
  // that end at different steps, on eos, rather than the one token a fresh model repeats.
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  for (int step = 0; step < 60; ++step) {
    opt.zero_grad();
    kit::seq2seq_loss(model->forward(src, tgt_in), tgt_out, o.pad_id).backward();
    opt.step();
  }
  for (const auto& p : model->named_parameters())
    out.insert("trained." + p.key(), p.value().detach().clone());
  model->eval();
  auto greedy = model->greedy_decode(src, 12);
  out.insert("src", src);
  out.insert("tgt_in", tgt_in);
  out.insert("tgt_out", tgt_out);
  out.insert("logits", logits.detach());
  out.insert("loss", loss.detach());
  out.insert("greedy", greedy);
  try {
    probe::write_tensors(argv[1], out, "seq2seq_probe");
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
