"""Exercise 01 (a Transformer LM on WikiText-2): which run, which data, which TODO is which."""
import math
import os
import re
import subprocess

from checklib import compare, engine, judges

# Small and quick: the checks look at behaviour, not at model quality. Every flag a TODO reads
# differs from its default (kit/train/args.h: --seed 42, --batch-size 16, --eval-batch-size 32), so a
# TODO that hard-codes a default does not pass (mutant sampler-seed-42).
RUN_FLAGS = ["--epochs", "2", "--batch-size", "8", "--eval-batch-size", "16", "--seq-len", "16",
             "--d-model", "32", "--heads", "2", "--layers", "1", "--feedforward", "64",
             "--dropout", "0", "--seed", "7"]
EPOCHS = 2
# The run with one rank per node only has to show where each rank puts its model.
NODES_FLAGS = list(RUN_FLAGS) + ["--max-steps", "2"]
NODES_FLAGS[NODES_FLAGS.index("--epochs") + 1] = "1"
# A whole 2-rank run of these flags takes under 2 s, even on a busy machine (1.3-1.9 s measured
# at a load average of 4 on 2 cores, 2026-11-27): a rank that waits 12 s in a collective or the
# rendezvous waits for a rank that never comes (an all-reduce only rank 0 calls). Shorter than the
# engine's 30 s, as exercises 03 and 04 have it, so that the check of such a hang is quick.
RUN_ENV = {"KIT_TIMEOUT": "12"}
# Validation and test: 79 and 73 windows, odd, so that a padding sampler shows on 2 ranks.
CORPUS_FLAGS = ["--train-tokens", "4000", "--valid-tokens", "1310", "--test-tokens", "1190",
                "--seed", "3"]
LOSS_LINE = re.compile(r"train loss ([0-9.]+), validation loss ([0-9.]+)")
TEST_LINE = re.compile(r"test loss ([0-9.]+)")
# Losses are printed with 5 decimals and traced with 6.
LOSS_TOL = 2e-5
SAVED_FILES = ("model-best.pt", "model-final.pt")
# Collectives the kit makes on the trainer's behalf, by file: DDP's belong to its TODO.
COLLECTIVE_FILES = {"ddp.cpp": "ddp"}
# The lines that report results: rank 0's output lines the run is compared by when the trainer
# prints them without print0 (std::printf on rank 0 only prints the same).
RESULT_LINES = (LOSS_LINE, TEST_LINE)
# Where a difference from the solution's run points when no TODO owns it (checklib/compare.py):
# a piece of the solution's line, found in the student's file by its text, and what it is.
PLACES = {"init": ("kit::TransformerLM model(", "the line that creates the model"),
          "forward": ("kit::TransformerLM model(", "the model's options (dropout, sizes)"),
          "update": ("torch::optim::AdamW optimizer(", "the line that creates the optimizer"),
          "checkpoint": ("checkpoints.save(", "the checkpoints' save"),
          "final": ("evaluate(model, test_loader", "the final evaluation")}

ALL_REDUCE_WHAT = ("reported losses cover all ranks (the training mean averaged, the "
                   "evaluation's loss sum and word count added up)")
LABELS = {"include": "1", "setup": "2-3", "sampler": "4", "loader-train": "5",
          "loader-valid": "6", "loader-test": "7", "ddp": "8", "set_epoch": "9",
          "all_reduce": "10", "print0": "11", "save0": "12", "destroy": "13"}


def losses(run):
    """Rank 0's printed losses, in order: each epoch's train and validation loss, then the test
    loss (exercises 03 and 04 compare whole runs by them)."""
    log = run.logs.get(0, "")
    out = [float(x) for m in LOSS_LINE.finditer(log) for x in m.groups()]
    return out + [float(m.group(1)) for m in TEST_LINE.finditer(log)]


def data_key():
    return CORPUS_FLAGS


def prepare_data(check, directory):
    data = os.path.join(directory, "corpus")
    return engine.generated_data(data, [check.tool("make_corpus"), "--out", data] + CORPUS_FLAGS,
                                 "wiki.test.tokens")


def judge(check):
    v, many, ranks = check.verdicts, check.many, check.ranks
    if judges.check_setup(v, many, check.nodes, check.source, ranks):
        uses, sizes, shuffles = judges.check_samplers(v, many, ranks, check.reference,
                                                      unpadded=("valid", "test"))
        judges.check_ddp(v, many, ranks)
        judges.check_set_epoch(v, many, ranks, uses.get("train"), sizes.get("train"), check.rules,
                               shuffles)
    else:
        for concept in ("sampler", "loader-train", "loader-valid", "loader-test", "ddp",
                        "set_epoch"):
            v.add(concept, False, "needs setup()", "without it every process is rank 0 of 1", cause="setup")
    judges.check_all_reduce(v, many, ranks, check.rules)
    judges.check_print0(v, many, ranks, check.rules)
    judges.check_save0(v, many, ranks, check.rules)
    judges.check_destroy(v, many, ranks)
    mine = judges.final_test_loss(many, check.rules)
    theirs = judges.final_test_loss(check.reference, check.rules)
    same = mine is not None and theirs is not None and math.isclose(mine, theirs, rel_tol=1e-4)
    compare.judge_run(check, f"your run on {ranks} ranks follows the solution's, to the same "
                      "final test loss",
                      "" if same else f"final test loss {mine} vs the solution's {theirs}")
