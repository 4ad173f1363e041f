"""Exercise 02's typical mistakes, for the mutation suite (tests/mutations/mutants.py has the
format and the kinds). The mistakes of what exercise 02 repeats from exercise 01 (headers,
setup, samplers, loaders, the DDP wrapper, print0, destroy) are exercise 01's mutants, and each
dropped TODO is also what the previous stage's test shows: the table keeps to what is new here."""
EXERCISE = "02-resnet-cifar10-ddp"

SAME = "the same kit call as exercise 01's TODO, mutated there; the stage tests show it missing"
COVERED_BY_STAGES = {"1": SAME, "2-3": SAME, "5": SAME, "6": SAME, "10": SAME, "12": SAME}

NO_SYNC = ("          auto quiet = ddp.no_sync();  // forward and backward: only adds to this "
           "rank's .grad\n")
SCALE = "kit::scale_lr(args.lr, args.lr_scaling, batch * world_size, args.lr_base_batch())"
FORWARD = "cross_entropy(ddp.forward(inputs[k]), targets[k])"
RATIOS = "return {totals[0] / totals[2], totals[1] / totals[2]};"
# The micro-batch loop's body, from its lambda to the end of the guard, and the same with the
# guard around the backward only (the forward outside it).
GUARDED = (
    "        auto forward_backward = [&] {\n"
    "          // Through the wrapper, as Python's ddp_model(x): rank 0's batch-norm running statistics\n"
    "          // to every rank first (DDP's broadcast_buffers, on by default), then model->forward;\n"
    "          // and the backward of this forward is the one DDP averages.\n"
    "          auto loss = torch::nn::functional::cross_entropy(ddp.forward(inputs[k]), targets[k]) /\n"
    "                      static_cast<double>(micro);\n"
    "          loss.backward();\n"
    "          step_loss += loss.detach();\n"
    "        };\n"
    "        if (k + 1 < micro) {\n" + NO_SYNC +
    "          forward_backward();\n"
    "        } else {\n"
    "          forward_backward();  // the step's one all-reduce, of the accumulated gradients\n"
    "        }\n")
BACKWARD_ONLY = (
    "        auto loss = torch::nn::functional::cross_entropy(ddp.forward(inputs[k]), targets[k]) /\n"
    "                    static_cast<double>(micro);\n"
    "        if (k + 1 < micro) {\n"
    "          auto quiet = ddp.no_sync();\n"
    "          loss.backward();\n"
    "        } else {\n"
    "          loss.backward();\n"
    "        }\n"
    "        step_loss += loss.detach();\n")
# (id, kind, todo, what, [(old, new), ...], also)
MUTANTS = [
    # The test sampler is exercise 01's evaluation sampler; its padding shows on the odd test
    # split of the check's run (61 images on 2 ranks: one read twice).
    ("test-padded", "run", "4", "the test split read through a DistributedSampler "
     "(shuffle=false): it pads the split with repeats, so the test loss and accuracy depend on "
     "the number of ranks",
     [("kit::DistributedEvalSampler test_sampler(test_data);",
       "kit::DistributedSampler test_sampler(test_data, /*shuffle=*/false);")], []),
    # The wrap itself is exercise 01's; its second place, the forward through the wrapper, is new.
    ("forward-bypasses-ddp", "stops", "7", "the training forward calls model->forward, not "
     "ddp.forward: no backward is prepared for averaging (PyTorch's DDP would skip it "
     "silently; the kit stops the first), and rank 0's batch-norm buffers are never broadcast",
     [(FORWARD, FORWARD.replace("ddp.forward(", "model->forward("))],
     ["5", "6", "8", "9", "10", "11", "12", "13", "14", "15"]),
    ("set-epoch-missing", "run", "8", "train_sampler.set_epoch() dropped",
     [("    train_sampler.set_epoch(epoch);\n", "")], []),
    ("accuracy-not-reduced", "run", "9", "the test loss is the all-reduced one, the accuracy "
     "this rank's own correct predictions over its own images: every rank reports its own",
     [(RATIOS, "return {totals[0] / totals[2], correct / images};")], []),
    ("best-model-torch-save", "run", "11", "model-best.pt saved with torch::save: every rank "
     "writes the file",
     [('kit::save0(model, args.out_dir + "/model-best.pt");',
       'torch::save(model, args.out_dir + "/model-best.pt");')], []),
    ("bn-stats-own", "run", "13", "batch norm's running statistics not averaged: each rank "
     "evaluates its own, rank 0 saves its own",
     [("    for (auto stat : kit::running_statistics(*model)) kit::all_reduce(stat, "
       "kit::ReduceOp::AVG);\n", "")], []),
    ("lr-scaled-twice", "run", "14", "--lr multiplied by the world size, then scaled by the "
     "rule again", [(SCALE, SCALE.replace("(args.lr,", "(args.lr * world_size,"))], []),
    ("lr-per-rank-batch", "run", "14", "the rule given the per-rank batch, not the global one: "
     "the rate is not scaled", [(SCALE, SCALE.replace("batch * world_size", "batch"))], []),
    ("no-sync-missing", "run", "15", "every micro-batch's backward all-reduces (no no_sync)",
     [(NO_SYNC, "")], []),
    ("no-sync-last-too", "run", "15", "the last micro-batch's backward inside no_sync() too: "
     "the gradients are never averaged",
     [("        if (k + 1 < micro) {", "        if (k < micro) {")], ["7", "14"]),
]

# Written from the TODO text. Flags (FLAG_RUNS of common/tools/rules/ex02.py run 3 micro-batches,
# the sqrt rule, --lr 0.08 and a --global-batch): each passes the default run and fails there.
BN = "    for (auto stat : kit::running_statistics(*model)) kit::all_reduce(stat, kit::ReduceOp::AVG);\n"
EVAL = "    auto [loss, accuracy] = evaluate(model, test_loader, device);\n"
MUTANTS += [
    ("no-sync-first-only", "run", "15", "only the first micro-batch inside no_sync() (`if (k == "
     "0)`): right for 2 micro-batches, one all-reduce too many for 3",
     [("        if (k + 1 < micro) {", "        if (k == 0) {")], []),
    ("lr-rule-linear", "run", "14", "the linear rule written in place of --lr-scaling's",
     [(SCALE, SCALE.replace("args.lr_scaling", "kit::LrScaling::linear"))], []),
    ("lr-batch-size-flag", "run", "14", "args.batch_size x world_size as the global batch: "
     "right with --batch-size, not with --global-batch",
     [(SCALE, SCALE.replace("batch * world_size", "args.batch_size * world_size"))], []),
    ("lr-hard-coded", "run", "14", "the rate 0.05 (--lr's default) written in place of args.lr",
     [(SCALE, SCALE.replace("(args.lr,", "(0.05,"))], []),
    # Buffers: every rank agrees, on the wrong statistics; only the solution's run shows it.
    ("bn-stats-sum", "run", "13", "the running statistics all-reduced with SUM: every rank holds "
     "the same, twice their mean",
     [(BN, BN.replace("ReduceOp::AVG", "ReduceOp::SUM"))], []),
    ("bn-stats-rank0", "run", "13", "rank 0's running statistics broadcast to every rank in "
     "place of their average",
     [(BN, "    for (auto stat : kit::running_statistics(*model)) kit::broadcast(stat, 0);\n")],
     []),
    # Order.
    ("bn-stats-after-eval", "run", "13", "the statistics averaged after the evaluation (right "
     "code, wrong place): each rank evaluates its own",
     [(BN, ""), (EVAL, EVAL + BN)], []),
    ("set-epoch-after-loop", "run", "8", "set_epoch() after the epoch's training (right code, "
     "wrong place): epoch 2 reads the order of epoch 1",
     [("    train_sampler.set_epoch(epoch);\n", ""),
      ("    metrics.end_epoch(epoch);\n", "    metrics.end_epoch(epoch);\n    train_sampler.set_epoch(epoch);\n")],
     []),
    # Stopped runs.
    ("bn-stats-rank0-only", "stops", "13", "the running statistics averaged inside `if (rank == "
     "0)`: rank 0 waits in an all-reduce the other ranks never make",
     [(BN, "    if (kit::get_rank() == 0)\n  " + BN)], ["6", "8", "9", "10", "11", "12"]),
    ("destroy-before-final-save", "stops", "12", "destroy_process_group() before the final "
     "save0 (right code, wrong place): the kit refuses the save",
     [("  kit::destroy_process_group();\n", ""),
      ('kit::save0(model, args.out_dir + "/model-final.pt");',
       'kit::destroy_process_group();\n    kit::save0(model, args.out_dir + "/model-final.pt");')],
     []),
    # The guard around the backward only, as exercise 02 taught it before PyTorch's rule was
    # followed: PyTorch reads no_sync() at the forward, so every micro-batch is averaged.
    ("no-sync-backward-only", "run", "15", "only the backward inside ddp.no_sync(), the "
     "forward outside it: the forward prepared an averaged backward, so every micro-batch "
     "all-reduces (as in PyTorch)",
     [(GUARDED, BACKWARD_ONLY)], []),
    # Correct rewrites.
    ("no-sync-other-guard", "equivalent", "15", "the guard written the other way round (the "
     "last micro-batch first in the if) and the average as SUM then divided (correct: must pass)",
     [("        if (k + 1 < micro) {\n" + NO_SYNC +
       "          forward_backward();\n        } else {\n          forward_backward();  // the step's one all-reduce, of the accumulated gradients\n        }",
       "        if (k == micro - 1) {\n          forward_backward();\n        } else {\n"
       "          auto quiet = ddp.no_sync();\n          forward_backward();\n        }"),
      ("    kit::all_reduce(train_loss, kit::ReduceOp::AVG);",
       "    kit::all_reduce(train_loss, kit::ReduceOp::SUM);\n    train_loss /= world_size;")], []),
]

# Stopped inside a kit call that is not the mistake (issue 43, point 8): an index past the end of
# the test split, named by the dataset's error, blamed on that split's loader.
MUTANTS += [
    ("test-loader-train-sampler", "stops", "6", "the test loader given the training sampler: "
     "it asks the test split for images past its end; the split the error names is the loader's",
     [("Loader test_loader(test_data, args.eval_batch_size, test_sampler, loading);",
       "Loader test_loader(test_data, args.eval_batch_size, train_sampler, loading);")],
     ["8", "9", "10", "11", "12", "13"]),
]
