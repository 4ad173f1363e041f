"""Exercise 03's typical mistakes, for the mutation suite (tests/mutations/mutants.py has the
format and the kinds)."""
EXERCISE = "03-transformer-lm-zero"

ZERO = "kit::ZeroOptimizer optimizer(model, {stage, adamw_options()});"
# (id, kind, todo, what, [(old, new), ...], also)
MUTANTS = [
    ("include-path", "compile", "1", "#include \"zero.h\": the header without its kit/ folder",
     [('#include "kit/zero.h"', '#include "zero.h"')], []),
    ("stage-always-1", "run", "2", "ZeroOptimizer made with stage 1 whatever the run: ZeRO-2 "
     "keeps every gradient", [(ZERO, "kit::ZeroOptimizer optimizer(model, {1, adamw_options()});")],
     []),
    ("zero3-no-step", "run", "3", "ZeRO-3 without sharded.step(): the shards never change",
     [("    sharded.step();   // AdamW on this rank's shards: no communication\n", "")], []),
    ("zero3-no-zero-grad", "run", "3", "ZeRO-3 without sharded.zero_grad(): each step adds its "
     "gradient to the last one's",
     [("    sharded.zero_grad();\n", "")], []),
    # A correct rewrite the check must pass in full.
    ("options-by-field", "equivalent", "2", "the ZeroOptions filled field by field",
     [(ZERO, "kit::ZeroOptions options;\n  options.stage = stage;\n"
             "  options.adamw = adamw_options();\n  kit::ZeroOptimizer optimizer(model, options);")],
     []),
]
