"""Exercise 02's typical mistakes, for the mutation suite (tests/mutations/mutants.py has the
format and the kinds). The mistakes of what exercise 02 repeats from exercise 01 (headers,
setup, samplers, loaders, the DDP wrapper, print0, destroy) are exercise 01's mutants, and each
dropped TODO is also what the previous stage's test shows: the table keeps to what is new here."""
EXERCISE = "02-resnet-cifar10-ddp"

SAME = "the same kit call as exercise 01's TODO, mutated there; the stage tests show it missing"
COVERED_BY_STAGES = {"1": SAME, "2-3": SAME, "5": SAME, "6": SAME, "10": SAME, "12": SAME}

NO_SYNC = "          auto quiet = ddp.no_sync();  // only adds to this rank's .grad\n"
SCALE = "kit::scale_lr(args.lr, args.lr_scaling, batch * world_size, args.lr_base_batch())"
FORWARD = "cross_entropy(ddp.forward(inputs[k]), targets[k])"
RATIOS = "return {totals[0] / totals[2], totals[1] / totals[2]};"
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
    ("forward-bypasses-ddp", "run", "7", "the training forward calls model->forward, not "
     "ddp.forward: rank 0's batch-norm buffers are never broadcast, each rank's statistics drift "
     "apart (averaged back by TODO 13 before evaluation, so only the forwards show it)",
     [(FORWARD, FORWARD.replace("ddp.forward(", "model->forward("))], []),
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
