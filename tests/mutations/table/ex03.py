"""Exercise 03's typical mistakes, for the mutation suite (tests/mutations/mutants.py has the
format and the kinds). The later ones are written from the TODO text, by class (issue 29): a
flag the TODO must honour, a buffer or state, an order, a run that stops; and correct rewrites
that must pass."""
EXERCISE = "03-transformer-lm-zero"

ZERO1 = "zero.emplace(model, kit::ZeroOptions{.stage = 1, .adamw = adamw, .max_grad_norm = args.clip_grad});"
ZERO2 = "zero.emplace(model, kit::ZeroOptions{.stage = 2, .adamw = adamw, .max_grad_norm = args.clip_grad});"
ZERO3 = "    sharded.emplace(model, model->units(), "
OPTIONS3 = "kit::ZeroOptions{.stage = 3, .adamw = adamw, .max_grad_norm = args.clip_grad}"
HELD_LINE = '  std::printf("rank %d: %s holds'
HELD_BLOCK = (
    "  const kit::HeldBytes held = trainer.held();\n"
    "  const std::string name = zero_stage == 0 ? \"DDP\" : \"ZeRO-\" + std::to_string(zero_stage);\n"
    "  std::printf(\"rank %d: %s holds params %lld grads %lld optimizer %lld gathered %lld bytes, \"\n"
    "              \"peak %lld\\n\", rank, name.c_str(), static_cast<long long>(held.params),\n"
    "              static_cast<long long>(held.grads), static_cast<long long>(held.optimizer),\n"
    "              static_cast<long long>(held.gathered_peak), static_cast<long long>(trainer.peak));\n")
SAVE = "    checkpoints.save_sharded(save_shard, s);\n"
RESUME = "    return checkpoints.resume_sharded(load_shard, device, args.resume);\n"
RESUMED = "  kit::TrainState state = trainer.resume();\n"
FINAL = '    save_model(args.out_dir + "/model-final.pt");\n'
# (id, kind, todo, what, [(old, new), ...], also)
MUTANTS = [
    ("held-rank0-only", "run", "1", "the bytes line printed by rank 0 only, as print0 would: "
     "rank 1's share is never seen",
     [(HELD_LINE, '  if (rank == 0) std::printf("rank %d: %s holds')], ["2", "3", "4"]),
    ("zero1-as-stage-2", "run", "2", "--zero-stage 1 made with ZeroOptions stage 2: its gradients "
     "shrink as ZeRO-2's", [(ZERO1, ZERO1.replace(".stage = 1,", ".stage = 2,"))], []),
    # Order: TODO 3's question is where the reduce-scatter goes; stage 1 puts it in step().
    ("zero2-as-stage-1", "run", "3", "--zero-stage 2 made with ZeroOptions stage 1: the "
     "reduce-scatter in step(), not during backward, so every rank keeps every gradient",
     [(ZERO2, ZERO2.replace(".stage = 2,", ".stage = 1,"))], []),
    ("zero3-model-forward", "run", "4", "ZeRO-3 trained through model->forward, whose weights "
     "the wrapper has emptied",
     [("    trainer.forward = [&](const torch::Tensor& x) { return sharded->forward(x); };\n", "")],
     []),
    ("zero3-one-unit", "run", "4", "ZeRO-3 with the whole model as its one unit: the bytes held "
     "between steps are the formula's, but every forward gathers the whole model",
     [(ZERO3, "    sharded.emplace(model, std::vector<kit::TransformerLMImpl::Unit>{\n"
              "        {model.ptr(), [&](const torch::Tensor& x) { return model->forward(x); }}}, ")],
     []),
    # Held bytes as the formula says, the losses DDP's: only the peak shows the copy.
    ("zero3-keeps-full-copy", "run", "4", "ZeRO-3 keeps a full copy of the initial weights alive "
     "(to compare with later): held() does not count it, the peak does",
     [("  if (zero_stage == 3) {\n" + ZERO3,
       "  std::vector<torch::Tensor> initial;  // the initial weights, to compare with later\n"
       "  if (zero_stage == 3) {\n"
       "    for (auto& p : model->parameters()) initial.push_back(p.detach().clone());\n" + ZERO3)],
     []),
    # State: the shards are saved right; the resumed run starts from fresh weights.
    ("resume-loads-nothing", "run", "5", "the sharded checkpoint saved but never loaded: the "
     "resumed run goes on from freshly initialised weights",
     [("resume_sharded(load_shard, ", "resume_sharded([](const std::string&) {}, ")], []),
    # A correct rewrite the check must pass in full.
    ("options-by-field", "equivalent", "2", "ZeRO-1's ZeroOptions filled field by field",
     [(ZERO1, "{\n    kit::ZeroOptions options;\n    options.stage = 1;\n    options.adamw = adamw;\n"
              "    options.max_grad_norm = args.clip_grad;\n    zero.emplace(model, options);\n  }")],
     []),
]

MUTANTS += [
    # Flags (FLAG_RUNS of common/tools/rules/ex03.py: --lr 0.003 --clip-grad 0.05 at each stage):
    # each passes the default run (--lr 1e-3, no clipping) and fails there.
    ("zero1-no-clip", "run", "2", "ZeRO-1's options without .max_grad_norm: --clip-grad is "
     "ignored (the default run does not clip, so only another value shows it)",
     [(ZERO1, ZERO1.replace(", .max_grad_norm = args.clip_grad", ""))], []),
    ("zero2-lr-hard-coded", "run", "3", "ZeRO-2's AdamW made with 1e-3 (--lr's default) in place "
     "of `adamw`, the flags' options",
     [(ZERO2, ZERO2.replace(".adamw = adamw", ".adamw = torch::optim::AdamWOptions(1e-3)"))], []),
    # The rank in the bytes line: on one node the local rank is the global one; the check's run
    # with one rank per node shows it.
    ("held-local-rank", "run", "1", "the bytes line labelled with the local rank: right on one "
     "node, two ranks called 0 on two",
     [('"peak %lld\\n", rank, name.c_str()', '"peak %lld\\n", local_rank, name.c_str()')], []),
    # Order: the right line in the wrong place.
    ("held-before-training", "run", "1", "the bytes line printed before training (right code, "
     "wrong place): no gradient and no optimizer state exist yet, and the peak is 0",
     [(HELD_BLOCK, ""), (RESUMED, HELD_BLOCK + RESUMED)], ["2", "3", "4"]),
    # Runs that stop, each in the library, blamed on the student's calling line.
    ("save-nothing", "stops", "5", "save_sharded given a function that writes nothing: the "
     "library refuses the checkpoint at the first save",
     [(SAVE, "    checkpoints.save_sharded([](const std::string&) {}, s);\n")], ["2", "3", "4"]),
    ("save-wrong-folder", "stops", "5", "every rank's shard saved into the run's folder, not the "
     "checkpoint's: a later resume would load stale shards; the library refuses the save",
     [(SAVE, "    checkpoints.save_sharded([&](const std::string&) { save_shard(args.out_dir + "
             "\"/zero\"); }, s);\n")], ["2", "3", "4"]),
    ("save-rank0-only", "stops", "5", "the shards saved on rank 0 only (`if (rank == 0)`, as "
     "under DDP): rank 0 waits in the checkpoint's barrier while rank 1 trains on",
     [(SAVE, "    if (rank == 0) checkpoints.save_sharded(save_shard, s);\n")], ["2", "3", "4"]),
    ("resume-wrong-folder", "run", "5", "each rank reads its shard back from the run's folder, "
     "not the checkpoint's: the resumed run stops with the library's refusal",
     [(RESUME, "    return checkpoints.resume_sharded([&](const std::string&) { load_shard(args.out_dir "
               "+ \"/zero\"); }, device, args.resume);\n")], []),
    ("zero1-options-stage-3", "stops", "2", "--zero-stage 1 made with ZeroOptions stage 3: the "
     "ZeroOptimizer refuses it, and the check names TODO 2's line, not zero.cpp",
     [(ZERO1, ZERO1.replace(".stage = 1,", ".stage = 3,"))], []),
    ("zero3-options-stage-2", "stops", "4", "FullyShardedModel made with ZeroOptions stage 2: it "
     "refuses, and the check names TODO 4's line, not zero3.cpp",
     [(OPTIONS3, OPTIONS3.replace(".stage = 3,", ".stage = 2,"))], []),
    # Outside the TODOs: every TODO passes, the closing row names the line.
    ("final-save0-under-zero3", "diverges", "-", "the final model saved with save0 of the model "
     "under ZeRO-3 too, not of the sharded model: the model's own weights are empty there, the "
     "file holds none of them",
     [(FINAL, '    kit::save0(model, args.out_dir + "/model-final.pt");\n')],
     ["model-final.pt", "empty"]),
    ("final-not-saved-under-zero3", "diverges", "-", "no final model under ZeRO-3 (the solution "
     "before kit::save0 took a sharded model): the run ends without model-final.pt",
     [(FINAL, '    if (zero_stage < 3) kit::save0(model, args.out_dir + "/model-final.pt");\n')],
     ["model-final.pt", "without"]),
    ("train-loss-sum", "diverges", "-", "the epoch's train loss all-reduced with SUM: the given "
     "DDP run already differs from the solution's; no ZeRO TODO is blamed for it",
     [("kit::all_reduce(mean, kit::ReduceOp::AVG);", "kit::all_reduce(mean, kit::ReduceOp::SUM);")],
     ["train loss"]),
    # Correct rewrites.
    ("save-own-lambda", "equivalent", "5", "the shard's save written as a lambda of its own at "
     "the call (correct: must pass)",
     [(SAVE, "    checkpoints.save_sharded([&](const std::string& dir) {\n"
             "      if (zero) kit::save_zero_checkpoint(dir, *zero);\n"
             "      else kit::save_zero_checkpoint(dir, *sharded);\n    }, s);\n")], []),
]
