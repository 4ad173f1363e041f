"""Exercise 03's typical mistakes, for the mutation suite (tests/mutations/mutants.py has the
format and the kinds)."""
EXERCISE = "03-transformer-lm-zero"

ZERO1 = "zero.emplace(model, kit::ZeroOptions{.stage = 1, .adamw = adamw, .max_grad_norm = args.clip_grad});"
ZERO2 = "zero.emplace(model, kit::ZeroOptions{.stage = 2, .adamw = adamw, .max_grad_norm = args.clip_grad});"
HELD_LINE = '  std::printf("rank %d: %s holds'
# (id, kind, todo, what, [(old, new), ...], also)
MUTANTS = [
    ("include-path", "compile", "1", "#include \"zero3.h\": the header without its kit/ folder",
     [('#include "kit/zero3.h"', '#include "zero3.h"')], []),
    ("held-rank0-only", "run", "2", "the bytes line printed by rank 0 only, as print0 would: "
     "rank 1's share is never seen",
     [(HELD_LINE, '  if (rank == 0) std::printf("rank %d: %s holds')], ["3", "4", "5", "6"]),
    ("zero1-as-stage-2", "run", "3", "--zero-stage 1 made with ZeroOptions stage 2: its gradients "
     "shrink as ZeRO-2's", [(ZERO1, ZERO1.replace(".stage = 1,", ".stage = 2,"))], []),
    ("zero2-as-stage-1", "run", "4", "--zero-stage 2 made with ZeroOptions stage 1: every rank "
     "keeps every gradient", [(ZERO2, ZERO2.replace(".stage = 2,", ".stage = 1,"))], []),
    ("zero3-model-forward", "run", "5", "ZeRO-3 trained through model->forward, whose weights "
     "the wrapper has emptied",
     [("    trainer.forward = [&](const torch::Tensor& x) { return sharded->forward(x); };\n", "")],
     []),
    ("resume-loads-nothing", "run", "6", "the sharded checkpoint saved but never loaded: the "
     "resumed run goes on from freshly initialised weights",
     [("      if (zero) kit::load_zero_checkpoint(dir, *zero);\n"
       "      else kit::load_zero_checkpoint(dir, *sharded);\n", "      (void)dir;\n")], []),
    # A correct rewrite the check must pass in full.
    ("options-by-field", "equivalent", "3", "ZeRO-1's ZeroOptions filled field by field",
     [(ZERO1, "kit::ZeroOptions options;\n    options.stage = 1;\n    options.adamw = adamw;\n"
              "    options.max_grad_norm = args.clip_grad;\n    zero.emplace(model, options);")], []),
]
