// kit/train/summariser_args.h — SummariserArgs and parse_summariser_args(): the flags of the
// capstone's trainer (the news summariser on XSum). The flag parser is kit/train/args.h's. The
// defaults are a model that trains on one GPU in minutes on XSum; the smaller shapes that suit a
// CPU check are flags.
#pragma once

#include <cstdint>
#include <string>

namespace kit {

struct SummariserArgs {
  std::string data_dir;        // the folder ./kit data xsum prepared: DIR/xsum.h5 (kit/data/xsum.h)
  std::string out_dir = ".";   // model-best.pt, model-final.pt, metrics.csv
  int64_t epochs = 3;
  int64_t max_steps = 0;       // > 0: stop each epoch after this many steps (quick checks)
  int64_t batch_size = 16;     // per rank: the global batch is batch_size x world size
  int64_t eval_batch_size = 32;
  double lr = 5e-4;            // AdamW, constant
  double clip_grad = 1.0;      // > 0: clip the averaged gradient to this global L2 norm (0: off)
  uint64_t seed = 42;
  int64_t train_examples = -1, eval_examples = -1;  // the first N of each split (-1: all)
  int64_t max_document_len = 256, max_summary_len = 48;  // longer ones are cut, and counted
  int64_t d_model = 128, heads = 4, encoder_layers = 2, decoder_layers = 2, feedforward = 256;
  double dropout = 0.1;
  int64_t show = 3;            // summaries rank 0 prints beside their references at each evaluation
  int64_t beam = 1;            // beams of the summaries' search (1: greedy; Seq2Seq::beam_decode)
  std::string strategy = "ddp";  // ddp (copies), zero2 or zero3 (the state sharded), tp (split)
  int64_t tp = 2;              // --strategy tp: ranks that split each layer (dp = world size / tp)
};

// Like kit::parse_args: the data folder defaults to $XSUM_DIR; --name value or --name=value,
// --help; one line and exit 2 on a bad command line (an unknown --strategy, --heads that do not
// divide --d-model, no data folder). The mesh and the model refuse a --tp that does not divide the
// world size, --heads or --feedforward, in one line each.
SummariserArgs parse_summariser_args(int argc, char** argv);

}  // namespace kit
