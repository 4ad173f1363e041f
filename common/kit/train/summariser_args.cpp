// kit/train/summariser_args.cpp — the capstone's flags (see summariser_args.h).
#include "kit/train/summariser_args.h"

#include <cstdlib>
#include <filesystem>

#include "kit/train/args.h"  // parse_flags(), flag_int(), flag_real(), flag_error()

namespace kit {

SummariserArgs parse_summariser_args(int argc, char** argv) {
  SummariserArgs a;
  if (const char* d = std::getenv("XSUM_DIR"); d && *d) a.data_dir = d;
  auto whole = [](const char* flag, int64_t lo, int64_t& into) {
    return [flag, lo, &into](const std::string& v) { into = flag_int(flag, v, lo); };
  };
  auto text = [](std::string& into) { return [&into](const std::string& v) { into = v; }; };
  parse_flags(argc, argv, {
      {"--data-dir", "the folder `./kit data xsum` prepared (holds xsum.h5; default $XSUM_DIR)", text(a.data_dir)},
      {"--out-dir", "where model-best.pt, model-final.pt and metrics.csv are written", text(a.out_dir)},
      {"--epochs", "passes over the training examples", whole("--epochs", 1, a.epochs)},
      {"--max-steps", "stop each epoch after this many steps (0: no limit)", whole("--max-steps", 0, a.max_steps)},
      {"--batch-size", "examples per step and rank", whole("--batch-size", 1, a.batch_size)},
      {"--eval-batch-size", "examples per evaluation batch", whole("--eval-batch-size", 1, a.eval_batch_size)},
      {"--lr", "AdamW's learning rate", [&](auto v) { a.lr = flag_real("--lr", v, 0, 10); }},
      {"--clip-grad", "clip the gradients' global norm to this (0: off)", [&](auto v) { a.clip_grad = flag_real("--clip-grad", v, 0, 1e9); }},
      {"--seed", "random seed", [&](auto v) { a.seed = static_cast<uint64_t>(flag_int("--seed", v, 0)); }},
      {"--train-examples", "use the first N training examples (-1: all)", whole("--train-examples", -1, a.train_examples)},
      {"--eval-examples", "use the first N validation and test examples (-1: all)", whole("--eval-examples", -1, a.eval_examples)},
      {"--max-document-len", "documents are cut to this many tokens (counted)", whole("--max-document-len", 1, a.max_document_len)},
      {"--max-summary-len", "summaries are cut to this many tokens, and generated up to it", whole("--max-summary-len", 1, a.max_summary_len)},
      {"--d-model", "the Transformer's width", whole("--d-model", 1, a.d_model)},
      {"--heads", "attention heads (must divide --d-model)", whole("--heads", 1, a.heads)},
      {"--encoder-layers", "encoder layers", whole("--encoder-layers", 1, a.encoder_layers)},
      {"--decoder-layers", "decoder layers", whole("--decoder-layers", 1, a.decoder_layers)},
      {"--feedforward", "the feed-forward layers' width", whole("--feedforward", 1, a.feedforward)},
      {"--dropout", "dropout probability", [&](auto v) { a.dropout = flag_real("--dropout", v, 0, 0.99); }},
      {"--show", "generated summaries rank 0 prints at each evaluation", whole("--show", 0, a.show)},
      {"--beam", "beams of the summaries' search at each evaluation (1: greedy)", whole("--beam", 1, a.beam)},
      {"--strategy", "ddp (every rank a whole copy), zero2 (AdamW's state and the gradients sharded), "
                     "zero3 (the weights too) or tp (each layer split over --tp ranks)", text(a.strategy)},
      {"--tp", "--strategy tp: ranks that split each layer (must divide the world size)", whole("--tp", 1, a.tp)},
  });
  if (a.strategy != "ddp" && a.strategy != "zero2" && a.strategy != "zero3" && a.strategy != "tp")
    flag_error("--strategy " + a.strategy + ": ddp, zero2, zero3 or tp");
  if (a.d_model % a.heads != 0)
    flag_error("--heads " + std::to_string(a.heads) + " does not divide --d-model " +
               std::to_string(a.d_model));
  if (a.data_dir.empty())
    flag_error("no data folder: pass --data-dir or set XSUM_DIR (the folder `./kit data xsum DIR` "
               "prepared on the login node)");
  std::error_code ec;
  std::filesystem::create_directories(a.out_dir, ec);
  if (ec) flag_error("--out-dir " + a.out_dir + " cannot be created: " + ec.message());
  return a;
}

}  // namespace kit
