"""Exercise 01's typical mistakes, for the mutation suite (tests/mutations/mutants.py has the
format and the kinds)."""
EXERCISE = "01-transformer-lm-ddp"

DDP_LINE = "  kit::DistributedDataParallel ddp(model);  // rank 0's weights everywhere\n"
FORWARD_LINE = ("  forward = [&](const torch::Tensor& x) { return ddp.forward(x); };  "
                "// its backward averages\n")

AVG_TRAIN = "kit::all_reduce(mean, kit::ReduceOp::AVG);  // this rank's mean -> the mean over all ranks"
SUM_EVAL = "kit::all_reduce(totals, kit::ReduceOp::SUM);  // the sums and counts of all ranks, on every rank"
# (id, kind, todo, what, [(old, new), ...], also)
MUTANTS = [
    ("include-path", "compile", "1", "#include \"distributed.h\": the header without its folder",
     [('#include "kit/runtime/distributed.h"', '#include "distributed.h"')], []),
    ("no-distributed-include", "compile", "1", "kit/runtime/distributed.h not included (only kit/ddp/ddp.h)",
     [('#include "kit/runtime/distributed.h"  // setup(), all_reduce(), print0(), save0(), '
       'destroy_process_group()\n', "")], []),
    ("cuda-rank", "run", "2-3", "the device numbered by the global rank (cuda:rank, on this "
     "CPU-only machine cpu:rank) instead of setup()'s cuda:local_rank",
     [("const torch::Device device = me.device;",
       "const torch::Device device(me.device.type(), rank);")], []),
    ("per-rank-seed", "run", "4", "the training sampler seeded with args.seed + rank",
     [("train_sampler(train_data, /*shuffle=*/true, args.seed);",
       "train_sampler(train_data, /*shuffle=*/true, args.seed + rank);")], []),
    ("train-no-shuffle", "run", "4", "the training sampler with shuffle=false",
     [("train_sampler(train_data, /*shuffle=*/true, args.seed);",
       "train_sampler(train_data, /*shuffle=*/false, args.seed);")], ["9"]),
    ("val-shuffles", "run", "4", "the validation split read through a DistributedSampler "
     "without shuffle=false (it shuffles by default)",
     [("kit::DistributedEvalSampler val_sampler(val_data);",
       "kit::DistributedSampler val_sampler(val_data);")], []),
    ("val-padded", "run", "4", "the validation split read through a DistributedSampler "
     "(shuffle=false): it pads the split with repeats, so the loss depends on the ranks",
     [("kit::DistributedEvalSampler val_sampler(val_data);",
       "kit::DistributedSampler val_sampler(val_data, /*shuffle=*/false);")], []),
    ("train-loader-shuffle", "run", "5", "the training loader keeps shuffle=true; the sampler "
     "is made but never used",
     [("Loader train_loader(train_data, args.batch_size, train_sampler, pinned);",
       "Loader train_loader(train_data, args.batch_size, /*shuffle=*/true, pinned);")], ["9"]),
    ("train-loader-val-sampler", "run", "5", "the training loader gets val_sampler",
     [("Loader train_loader(train_data, args.batch_size, train_sampler, pinned);",
       "Loader train_loader(train_data, args.batch_size, val_sampler, pinned);")], ["9"]),
    ("val-loader-no-sampler", "run", "6", "the validation loader without its sampler",
     [("Loader val_loader(val_data, args.eval_batch_size, val_sampler);",
       "Loader val_loader(val_data, args.eval_batch_size);")], []),
    ("test-loader-no-sampler", "run", "7", "the test loader without its sampler",
     [("Loader test_loader(test_data, args.eval_batch_size, test_sampler);",
       "Loader test_loader(test_data, args.eval_batch_size);")], []),
    ("no-ddp", "run", "8", "no DistributedDataParallel",
     [(DDP_LINE + FORWARD_LINE, "")], []),
    # New with PyTorch's rule (kit/ddp/ddp.h): the wrapper is made, but training still calls
    # model->forward, so no backward is prepared for averaging; the kit stops the first one.
    ("forward-bypasses-ddp", "stops", "8", "the wrapper made, but `forward` left on "
     "model->forward: PyTorch's DDP would not average those backwards; the kit stops the first",
     [(FORWARD_LINE, "")], ["5", "6", "7", "9", "10", "11", "12", "13"]),
    ("ddp-temporary", "run", "8", "DistributedDataParallel as a temporary, destroyed at once",
     [(DDP_LINE + FORWARD_LINE, "  kit::DistributedDataParallel{model};\n")], []),
    ("set-epoch-late", "run", "9", "set_epoch() after the epoch's training (right code, "
     "wrong place)",
     [("    train_sampler.set_epoch(epoch);\n", ""),
      ("    double val_loss = evaluate(",
       "    train_sampler.set_epoch(epoch);\n    double val_loss = evaluate(")], []),
    ("sum-no-divide", "run", "10", "the training mean reduced with ReduceOp::SUM without "
     "dividing by the world size",
     [(AVG_TRAIN, "kit::all_reduce(mean, kit::ReduceOp::SUM);")], []),
    ("eval-not-reduced", "run", "10", "evaluate() returns this rank's loss (its all_reduce "
     "dropped)",
     [("  " + SUM_EVAL + "\n", "")], []),
    ("printf-test-loss", "run", "11", "the final test loss printed with std::printf",
     [('kit::print0("final test loss', 'std::printf("final test loss')], []),
    ("torch-save-final", "run", "12", "the final model saved with torch::save",
     [('kit::save0(model, args.out_dir + "/model-final.pt");',
       'torch::save(model, args.out_dir + "/model-final.pt");')], []),
    ("save0-rank0-only", "run", "12", "save0 called on rank 0 only, inside if (rank == 0): "
     "its barrier waits for ranks that never come",
     [('kit::save0(model, args.out_dir + "/model-final.pt");',
       'if (rank == 0) kit::save0(model, args.out_dir + "/model-final.pt");')], []),
    ("no-destroy", "run", "13", "destroy_process_group() dropped",
     [("  kit::destroy_process_group();\n", "")], []),
    ("destroy-early", "run", "13", "destroy_process_group() before the final save0 (right "
     "code, wrong place)",
     [("  kit::destroy_process_group();\n", ""),
      ('kit::save0(model, args.out_dir + "/model-final.pt");',
       'kit::destroy_process_group();\n    kit::save0(model, args.out_dir + "/model-final.pt");')],
     []),
    ("eval-all-reduce-rank0-only", "stops", "10", "the evaluation's all_reduce inside `if (rank "
     "== 0)`: the other ranks never join it, and the run hangs until the collective timeout",
     [(SUM_EVAL, "if (kit::get_rank() == 0) " + SUM_EVAL)], ["7", "9", "11", "13"]),
    # Correct rewrites in one program (one build less): the TODO checks and the comparison with
    # the solution's run, which does not compare the reduction op, must both let them pass.
    ("sum-then-divide", "equivalent", "10", "the training mean: ReduceOp::SUM, then divided by "
     "the world size; the evaluation's sum and count: ReduceOp::AVG (their ratio is the same); "
     "and the samplers made in another order; and a debugging print0 of the student's own (no "
     "result changes) (correct: must pass)",
     [(AVG_TRAIN, "kit::all_reduce(mean, kit::ReduceOp::SUM);\n"
       "  mean /= kit::get_world_size();"),
      (SUM_EVAL, "kit::all_reduce(totals, kit::ReduceOp::AVG);"),
      ("  kit::DistributedSampler train_sampler(train_data, /*shuffle=*/true, args.seed);\n"
       "  kit::DistributedEvalSampler val_sampler(val_data);\n"
       "  kit::DistributedEvalSampler test_sampler(test_data);\n",
       "  kit::DistributedEvalSampler test_sampler(test_data);\n"
       "  kit::DistributedEvalSampler val_sampler(val_data);\n"
       "  kit::DistributedSampler train_sampler(train_data, /*shuffle=*/true, args.seed);\n"),
      ("    metrics.end_epoch(epoch);",
       "    kit::print0(\"debug: epoch %ld is over\\n\", epoch + 1);\n    metrics.end_epoch(epoch);")],
     []),
]

# Mistakes that every TODO's judgment lets through but that change the run: the check's closing
# row must name where the run first leaves the solution's (the TODO, or "outside the TODOs") and
# say what differs (kind "diverges": `also` holds words the row must contain).
MUTANTS += [
    ("sampler-seed-default", "diverges", "4", "the training sampler without args.seed: every "
     "rank shuffles with the default seed 0, alike, so the slices are right but the order is "
     "not the solution's",
     [("train_sampler(train_data, /*shuffle=*/true, args.seed);",
       "train_sampler(train_data, /*shuffle=*/true);")], ["with seed 0", "with seed 7"]),
    ("setup-seed", "diverges", "2-3", "kit::setup(args.seed + 1): other initial weights",
     [("kit::setup(args.seed);", "kit::setup(args.seed + 1);")], ["seed 8"]),
    ("set-epoch-plus-one", "diverges", "9", "set_epoch(epoch + 1): a new order every epoch, but "
     "not the solution's",
     [("train_sampler.set_epoch(epoch);", "train_sampler.set_epoch(epoch + 1);")],
     ["set_epoch(1)", "set_epoch(0)"]),
    ("reseeded-init", "diverges", "-", "torch::manual_seed(0) just before the model is made "
     "(outside the TODOs): other initial weights",
     [("  kit::TransformerLM model(", "  torch::manual_seed(0);\n  kit::TransformerLM model(")],
     ["step 1 starts from", "kit::TransformerLM model("]),
    ("dropout-outside", "diverges", "-", "dropout 0.2 set on the model's options outside the "
     "TODOs (the run asks for 0)",
     [("kit::TransformerLM model(kit::lm_options(args, corpus.vocab.size()));",
       "auto options = kit::lm_options(args, corpus.vocab.size());\n"
       "  options.dropout = 0.2;\n  kit::TransformerLM model(options);")],
     ["step 1: the training loss", "kit::TransformerLM model("]),
    ("lr-doubled", "diverges", "-", "the learning rate doubled outside the TODOs",
     [("torch::optim::AdamWOptions(args.lr)", "torch::optim::AdamWOptions(args.lr * 2)")],
     ["step 2 starts from other weights", "AdamW optimizer("]),
    ("extra-barrier", "diverges", "-", "a kit::barrier() added at each epoch's end (outside "
     "the TODOs): the same numbers, but the collectives are not the solution's",
     [("    metrics.end_epoch(epoch);", "    kit::barrier();\n    metrics.end_epoch(epoch);")],
     ["is barrier #", "`kit::barrier();`"]),
    ("print-changed", "diverges", "11", "the epoch line prints 'ppl' for 'perplexity'",
     [("validation loss %.5f (perplexity %.2f)\\n\", epoch + 1",
       "validation loss %.5f (ppl %.2f)\\n\", epoch + 1")], ["(ppl ", "(perplexity "]),
]

# Written from the TODO text: a flag's default hard-coded, a hang in the training mean's
# all-reduce, and correct rewrites.
MUTANTS += [
    ("sampler-seed-42", "diverges", "4", "the training sampler seeded with 42, --seed's default, "
     "in place of args.seed: alike on every rank, but not the seed the run asked for",
     [("train_sampler(train_data, /*shuffle=*/true, args.seed);",
       "train_sampler(train_data, /*shuffle=*/true, 42);")], ["with seed 42", "with seed 7"]),
    ("train-mean-rank0-only", "stops", "10", "the training mean's all_reduce inside `if (rank == "
     "0)`: rank 0 waits in it, the other ranks go on to the epoch's report (a collective of "
     "kit::Metrics)",
     [(AVG_TRAIN, "if (kit::get_rank() == 0) " + AVG_TRAIN)], ["6", "7", "9", "11", "12", "13"]),
    ("optimizer-before-ddp", "equivalent", "8", "the optimizer made before the wrapper (it holds "
     "the same parameters either way) (correct: must pass)",
     [(DDP_LINE + FORWARD_LINE +
       "  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(args.lr));\n",
       "  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(args.lr));\n"
       + DDP_LINE + FORWARD_LINE)],
     []),
]

MUTANTS += [
    ("train-mean-on-host", "run", "10", "the training mean copied into a new host tensor "
     "(torch::tensor(mean.item<float>())) before its all_reduce: Gloo takes it, NCCL on a GPU "
     "refuses it",
     [(AVG_TRAIN, "mean = torch::tensor(mean.item<float>());\n  " + AVG_TRAIN)], []),
]

# Stopped inside a kit call that is not the mistake (issue 43, point 8): the check must name the
# root cause the run's evidence shows, not the TODO of the call that stopped.
MUTANTS += [
    ("destroy-each-epoch", "stops", "13", "destroy_process_group() at the end of every epoch's "
     "work (right code, wrong place): epoch 2's first forward finds DDP's group closed, in "
     "ddp.cpp; the mistake is where destroy was put, not DDP's TODO",
     [("  kit::destroy_process_group();\n", ""),
      ("    checkpoints.save(model, optimizer, state);  // every rank calls it; rank 0 writes the model\n",
       "    checkpoints.save(model, optimizer, state);  // every rank calls it; rank 0 writes the model\n"
       "    kit::destroy_process_group();\n")], ["7"]),
    ("device-on-host", "run", "2-3", "the device chosen as torch::kCPU instead of setup()'s: "
     "Gloo trains on, NCCL (the kit's device check) refuses DDP's first broadcast; the device's "
     "origin is TODO 2-3, not DDP's",
     [("const torch::Device device = me.device;", "const torch::Device device(torch::kCPU);")], []),
    ("val-loader-train-sampler", "stops", "6", "the validation loader given the training "
     "sampler: it asks the validation split for examples past its end, after the training "
     "mean's all-reduce; the split the error names is the loader's",
     [("Loader val_loader(val_data, args.eval_batch_size, val_sampler);",
       "Loader val_loader(val_data, args.eval_batch_size, train_sampler);")],
     ["7", "9", "10", "11", "12", "13"]),
]
