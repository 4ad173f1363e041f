"""Exercise 03's typical mistakes, for the mutation suite (tests/mutations/mutants.py has the
format and the kinds)."""
EXERCISE = "03-transformer-lm-zero"

ZERO1 = "zero.emplace(model, kit::ZeroOptions{.stage = 1, .adamw = adamw, .max_grad_norm = args.clip_grad});"
ZERO2 = "zero.emplace(model, kit::ZeroOptions{.stage = 2, .adamw = adamw, .max_grad_norm = args.clip_grad});"
ZERO3 = "    sharded.emplace(model->units(), "
HELD_LINE = '  std::printf("rank %d: %s holds'
# (id, kind, todo, what, [(old, new), ...], also)
MUTANTS = [
    ("held-rank0-only", "run", "1", "the bytes line printed by rank 0 only, as print0 would: "
     "rank 1's share is never seen",
     [(HELD_LINE, '  if (rank == 0) std::printf("rank %d: %s holds')], ["2", "3", "4", "5"]),
    ("zero1-as-stage-2", "run", "2", "--zero-stage 1 made with ZeroOptions stage 2: its gradients "
     "shrink as ZeRO-2's", [(ZERO1, ZERO1.replace(".stage = 1,", ".stage = 2,"))], []),
    ("zero2-as-stage-1", "run", "3", "--zero-stage 2 made with ZeroOptions stage 1: every rank "
     "keeps every gradient", [(ZERO2, ZERO2.replace(".stage = 2,", ".stage = 1,"))], []),
    ("zero3-model-forward", "run", "4", "ZeRO-3 trained through model->forward, whose weights "
     "the wrapper has emptied",
     [("    trainer.forward = [&](const torch::Tensor& x) { return sharded->forward(x); };\n", "")],
     []),
    ("zero3-one-unit", "run", "4", "ZeRO-3 with the whole model as its one unit: the bytes held "
     "between steps are the formula's, but every forward gathers the whole model",
     [(ZERO3, "    sharded.emplace(std::vector<kit::TransformerLMImpl::Unit>{\n"
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
    ("resume-loads-nothing", "run", "5", "the sharded checkpoint saved but never loaded: the "
     "resumed run goes on from freshly initialised weights",
     [("resume_sharded(load_shard, ", "resume_sharded([](const std::string&) {}, ")], []),
    # A correct rewrite the check must pass in full.
    ("options-by-field", "equivalent", "2", "ZeRO-1's ZeroOptions filled field by field",
     [(ZERO1, "{\n    kit::ZeroOptions options;\n    options.stage = 1;\n    options.adamw = adamw;\n"
              "    options.max_grad_norm = args.clip_grad;\n    zero.emplace(model, options);\n  }")],
     []),
]
