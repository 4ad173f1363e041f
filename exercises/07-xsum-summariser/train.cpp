// Capstone — a news summariser on XSum: from the login node to many nodes, with fewer hints.
//
// As shipped this is a complete single-GPU trainer: an encoder-decoder Transformer reads a BBC
// article and writes its one-sentence summary. It reads one HDF5 file, prepared on the login node
// (`./kit data xsum DIR`: compute nodes have no internet), and reports the loss and the ROUGE
// scores of the summaries it generates. The TODOs are coarse on purpose: you have done each step
// in exercises 01 and 03; here you decide how. `./kit check 07` judges what your build does on
// 1, 2 and 4 ranks; `./kit hint 07 N` points the way when you are stuck.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "kit/data/xsum.h"                // XsumDataset: documents, summaries and the tokenizer's pieces
#include "kit/seq2seq/batches.h"          // length_buckets(), pad_batch(): batches of similar length
#include "kit/seq2seq/model.h"            // Seq2Seq, seq2seq_loss(): the model and its loss
#include "kit/seq2seq/rouge.h"            // rouge_score(): ROUGE-1, -2, -L as the rouge-score package
#include "kit/train/clip.h"               // clip_grad_norm_(): --clip-grad
#include "kit/train/metrics.h"            // Metrics: metrics.csv, progress lines, per-rank reports
#include "kit/train/summariser_args.h"    // SummariserArgs: the flags
// TODO 1: Make it distributed: every rank a process of its own, on its own device. The kit's headers
//         for that are the ones of exercise 01 (and of 03 for TODO 5, of 04 for TODO 6).

// One batch on the device: the documents, the summaries' inputs (<s> and the summary) and their
// targets (the summary and </s>), each padded with the pad id to its longest row.
struct Batch {
  torch::Tensor src, tgt_in, tgt_out;
  std::vector<torch::Tensor> summaries;  // the references, unpadded, for ROUGE
};

Batch make_batch(const kit::XsumDataset& data, const std::vector<int64_t>& rows,
                 torch::Device device) {
  const auto& vocab = data.vocab();
  const auto bos = torch::full({1}, vocab.bos(), torch::kLong);
  const auto eos = torch::full({1}, vocab.eos(), torch::kLong);
  std::vector<torch::Tensor> documents, inputs, targets;
  Batch b;
  for (int64_t row : rows) {
    kit::XsumExample e = data.get(static_cast<size_t>(row));
    documents.push_back(e.document);
    inputs.push_back(torch::cat({bos, e.summary}));
    targets.push_back(torch::cat({e.summary, eos}));
    b.summaries.push_back(e.summary);
  }
  b.src = kit::pad_batch(documents, vocab.pad()).to(device);
  b.tgt_in = kit::pad_batch(inputs, vocab.pad()).to(device);
  b.tgt_out = kit::pad_batch(targets, vocab.pad()).to(device);
  return b;
}

// The first `examples` documents' lengths (-1: all), what batches are cut by.
torch::Tensor lengths_of(const kit::XsumDataset& data, int64_t examples) {
  auto lengths = data.document_lengths();
  return examples < 0 ? lengths : lengths.narrow(0, 0, std::min(examples, lengths.size(0)));
}

// The training forward (documents, summary inputs) -> logits: model->forward, or through DDP.
using Forward = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>;
// One optimizer step and the reset of the gradients, whichever optimizer main() chose.
struct Update {
  std::function<void()> step, zero_grad;
};

// One pass over the training examples. Returns the mean training loss of the pass.
torch::Tensor train_one_epoch(kit::Seq2Seq& model, const Forward& forward, const Update& update,
                              const kit::XsumDataset& data, const kit::SummariserArgs& args,
                              int64_t epoch, int rank, int world_size, torch::Device device,
                              kit::Metrics& metrics) {
  model->train();
  // Batches of documents of similar length (less padding), in an order that the seed and the
  // epoch decide: the same list on every process that asks with the same seed.
  auto batches = kit::length_buckets(lengths_of(data, args.train_examples), args.batch_size,
                                     args.seed + static_cast<uint64_t>(epoch));
  // TODO 2: Shard the data: each rank trains on its own batches, none twice, and every rank takes
  //         the same number of steps (a rank with one step more would wait for the others forever
  //         in its gradients' collective). TODO 2 has a second part in evaluate().
  std::vector<std::vector<int64_t>> mine = batches;
  const int64_t steps_per_epoch = static_cast<int64_t>(
      args.max_steps > 0 ? std::min<size_t>(mine.size(), args.max_steps) : mine.size());
  auto total = torch::zeros({}, torch::TensorOptions().device(device));
  int64_t step = 0;
  for (const auto& rows : mine) {
    Batch b = make_batch(data, rows, device);
    update.zero_grad();
    auto loss = kit::seq2seq_loss(forward(b.src, b.tgt_in), b.tgt_out, data.vocab().pad());
    loss.backward();
    update.step();
    total += loss.detach();
    ++step;
    metrics.step(epoch, loss, step, steps_per_epoch);
    if (step == steps_per_epoch) break;
  }
  auto mean = total / static_cast<double>(std::max<int64_t>(step, 1));
  // TODO 4: Report for the whole job: every rank trained on other batches, so each one's mean is its
  //         own. The number printed must be the same on every rank and describe all of them.
  return mean;
}

struct Scores {
  double loss = 0, rouge1 = 0, rouge2 = 0, rougeL = 0;
};

// The loss of every summary token of the split's first `examples` examples, and the ROUGE
// F-measures of greedy summaries against the references, averaged over the examples. Rank 0 prints
// `args.show` of them. The batches do not depend on the number of ranks: so neither do the scores.
Scores evaluate(kit::Seq2Seq& model, const kit::XsumDataset& data, int64_t examples,
                const kit::SummariserArgs& args, int rank, int world_size,
                torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto& vocab = data.vocab();
  auto batches = kit::length_buckets(lengths_of(data, examples), args.eval_batch_size, /*seed=*/0);
  auto loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  auto tokens = torch::zeros_like(loss_sum);
  double rouge1 = 0, rouge2 = 0, rougeL = 0, scored = 0;
  for (size_t k = 0; k < batches.size(); ++k) {
    // TODO 2: Here too: each rank evaluates its own batches, and together the ranks every batch
    //         exactly once (no step of DDP waits here: the ranks may do different numbers).
    Batch b = make_batch(data, batches[k], device);
    auto logits = model->forward(b.src, b.tgt_in);
    loss_sum += torch::nn::functional::cross_entropy(
                    logits.flatten(0, 1), b.tgt_out.flatten(),
                    torch::nn::functional::CrossEntropyFuncOptions()
                        .ignore_index(vocab.pad())
                        .reduction(torch::kSum))
                    .to(torch::kDouble);
    tokens += b.tgt_out.ne(vocab.pad()).sum().to(torch::kDouble);
    // Summaries by beam search (--beam; 1, the default, is greedy), at most one token longer than
    // the longest reference may be (</s>).
    auto generated = model->beam_decode(b.src, args.max_summary_len + 1, args.beam).cpu();
    for (size_t i = 0; i < b.summaries.size(); ++i) {
      const std::string reference = vocab.decode(b.summaries[i]);
      const std::string summary = vocab.decode(generated[static_cast<int64_t>(i)]);
      const kit::RougeScores s = kit::rouge_score(reference, summary, /*use_stemmer=*/true);
      rouge1 += s.rouge1.fmeasure;
      rouge2 += s.rouge2.fmeasure;
      rougeL += s.rougeL.fmeasure;
      scored += 1;
      // The first batch's first summaries beside their references: whoever holds batch 0.
      if (k == 0 && static_cast<int64_t>(i) < args.show)
        std::printf("  %s summary %zu\n    reference: %s\n    generated: %s\n", data.name().c_str(),
                    i + 1, reference.c_str(), summary.c_str());
    }
  }
  auto loss = torch::stack({loss_sum, tokens});
  auto rouge = torch::tensor({rouge1, rouge2, rougeL, scored}, torch::kDouble).to(device);
  // TODO 4: Every rank scored other examples: add the sums up over all ranks, so that the ratios below
  //         are those of the whole split, the same on every rank.
  loss = loss.cpu();
  rouge = rouge.cpu();
  const double n = std::max(rouge[3].item<double>(), 1.0);
  return {(loss[0] / loss[1]).item<double>(), rouge[0].item<double>() / n,
          rouge[1].item<double>() / n, rouge[2].item<double>() / n};
}

int main(int argc, char** argv) {
  kit::SummariserArgs args = kit::parse_summariser_args(argc, argv);

  // TODO 1: Join the job: who this process is (its rank of how many) and the device it drives, and a
  //         line from every rank that says so. The rest of main() reads rank, world_size and device.
  torch::manual_seed(args.seed);
  const int rank = 0, world_size = 1;  // one process
  torch::Device device = torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  std::printf("training on %s\n", device.str().c_str());

  // The file the login node prepared: no network here, no tokenizer library either (the pieces
  // in the file turn ids back into text). Documents and summaries longer than the flags allow
  // are cut, and counted in the report.
  kit::XsumOptions lengths{.max_document_len = args.max_document_len,
                           .max_summary_len = args.max_summary_len};
  kit::XsumDataset train(args.data_dir, "train", lengths);
  kit::XsumDataset valid(args.data_dir, "validation", lengths);
  kit::XsumDataset test(args.data_dir, "test", lengths);
  std::printf("%s\n", train.report().c_str());

  const auto& vocab = train.vocab();
  kit::Seq2Seq model(kit::Seq2SeqOptions{
      .vocab_size = vocab.size(), .d_model = args.d_model, .heads = args.heads,
      .encoder_layers = args.encoder_layers, .decoder_layers = args.decoder_layers,
      .feedforward = args.feedforward, .dropout = args.dropout,
      .max_len = std::max(args.max_document_len, args.max_summary_len + 1),
      .pad_id = vocab.pad(), .bos_id = vocab.bos(), .eos_id = vocab.eos(), .seed = args.seed});
  model->to(device);

  // What a step runs: the model's forward, AdamW on every gradient (clipped first with
  // --clip-grad). TODOs 3, 5 and 6 change who computes and who keeps what.
  Forward forward = [&](const torch::Tensor& src, const torch::Tensor& tgt) {
    return model->forward(src, tgt);
  };
  // Evaluating and saving use the model's own methods (beam_decode, save0), which read every
  // weight on this rank: whole_model() gives a guard that holds them there while it lives.
  // Nothing to hold while every rank keeps its whole copy.
  std::function<std::shared_ptr<void>()> whole_model = [] { return std::shared_ptr<void>(); };
  // Who shares out the training batches (TODO 2): every rank its own, unless the ranks of one
  // model must read the same ones (TODO 6).
  int data_rank = rank, data_ranks = world_size;
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(args.lr));
  Update update{[&] {
                  if (args.clip_grad > 0) kit::clip_grad_norm_(model->parameters(), args.clip_grad);
                  adamw.step();
                },
                [&] { adamw.zero_grad(); }};
  // TODO 3: Keep the copies identical (--strategy ddp, the default): every rank's gradients averaged
  //         over all ranks in every backward. The forward above is not the only one of its kind.
  // TODO 5: Shard the state. --strategy zero2: no rank keeps all of AdamW's moments or all of the
  //         averaged gradients, only its share; the weights stay whole on every rank. --strategy
  //         zero3: the weights too, each part gathered only while it computes (the model is a chain
  //         of units: Seq2Seq::units()). Exercise 03 did both with the kit's ZeRO. The step, the
  //         clipping and the forward change with them; DDP goes; whole_model() has work to do.
  if (args.strategy == "zero2" || args.strategy == "zero3") {
    std::fprintf(stderr, "error: --strategy %s needs TODO 5 (shard the state)\n",
                 args.strategy.c_str());
    return 2;
  }
  // TODO 6: Split the model (--strategy tp, --tp N): every attention's heads and every feed-forward
  //         layer's columns over N ranks, as in exercise 04 (its mesh; this model's split layers are
  //         in kit/seq2seq/parallel.h). The N ranks of one split model compute on the same batches;
  //         the copies of each slice (N ranks apart) stay alike as in TODO 3; the clipping must see
  //         the whole model's gradient. Evaluation and saving still use the whole model.
  if (args.strategy == "tp") {
    std::fprintf(stderr, "error: --strategy tp needs TODO 6 (split the model)\n");
    return 2;
  }

  kit::Metrics metrics(args.out_dir, args.batch_size, device, 0);
  // Its samples/s count each batch once: the ranks of one split model (TODO 6) share theirs.
  metrics.data_ranks(data_ranks);
  double best = std::numeric_limits<double>::infinity();
  for (int64_t epoch = 0; epoch < args.epochs; ++epoch) {
    const double train_loss = train_one_epoch(model, forward, update, train, args, epoch,
                                              data_rank, data_ranks, device, metrics)
                                  .item<double>();
    metrics.end_epoch(epoch);  // every rank's device, samples/s and peak memory, shown by rank 0
    auto whole = whole_model();  // until the end of this epoch's evaluation and saving
    const Scores v = evaluate(model, valid, args.eval_examples, args, rank, world_size, device);
    // TODO 4: One line for the job, not one per rank.
    std::printf("[%ld/%ld] train loss %.5f, validation loss %.5f, ROUGE-1 %.5f, ROUGE-2 %.5f, "
                "ROUGE-L %.5f\n", epoch + 1, args.epochs, train_loss, v.loss, v.rouge1, v.rouge2,
                v.rougeL);
    if (v.loss < best) {
      best = v.loss;
      // TODO 4: One file, written once.
      torch::save(model, args.out_dir + "/model-best.pt");
    }
  }
  auto whole = whole_model();
  const Scores t = evaluate(model, test, args.eval_examples, args, rank, world_size, device);
  // TODO 4: Here too.
  std::printf("final test loss %.5f, ROUGE-1 %.5f, ROUGE-2 %.5f, ROUGE-L %.5f\n", t.loss,
              t.rouge1, t.rouge2, t.rougeL);
  torch::save(model, args.out_dir + "/model-final.pt");
  // TODO 1: Leave the job cleanly.
  return 0;
}
