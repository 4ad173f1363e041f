"""Exercise 02 (a ResNet on CIFAR-10): which run, which data, which TODO is which."""
import math
import os
import re
import subprocess

from checklib import compare, engine, judges

EPOCHS = 2
ACCUM = 2  # micro-batches per step: TODO 15 (no_sync) shows only with more than one
# Small and quick: 100 training images, 2 ranks x 16 images per step in 2 micro-batches, the
# learning rate scaled linearly (2 ranks: 2 x --lr), so that TODO 14 changes the numbers.
RUN_FLAGS = ["--epochs", str(EPOCHS), "--batch-size", "16", "--accum-steps", str(ACCUM),
             "--eval-batch-size", "50", "--width", "4", "--blocks", "1", "--lr", "0.05",
             "--lr-scaling", "linear", "--seed", "7"]
RULE_TEXT = "--lr-scaling linear (2 x --lr on 2 ranks)"
# The flags TODOs 14 and 15 must honour, with values other than RUN_FLAGS' (checklib/engine.py
# runs the student's build and the solution's with each): 3 micro-batches (a guard written for 2
# passes RUN_FLAGS), the sqrt rule on a per-rank --batch-size of 12 (sqrt(2) x --lr: the linear
# rule, no rule or the per-rank batch each give another rate), --lr and warm-up other than the
# defaults; then a --global-batch of 36 (18 per rank; --batch-size keeps its default of 32, so
# args.batch_size in place of the global batch shows).
COMMON_FLAGS = ["--epochs", "1", "--max-steps", "2", "--eval-batch-size", "50", "--width", "4",
                "--blocks", "1", "--lr", "0.08", "--seed", "7"]
FLAG_RUNS = {
    "sqrt3": COMMON_FLAGS + ["--batch-size", "12", "--accum-steps", "3", "--lr-scaling", "sqrt",
                             "--warmup-steps", "2"],
    "global36": COMMON_FLAGS + ["--global-batch", "36", "--accum-steps", "3", "--lr-scaling",
                                "linear"],
}
FLAG_RULES = {"sqrt3": "--lr-scaling sqrt with --batch-size 12 on 2 ranks (sqrt(2) x --lr)",
              "global36": "--lr-scaling linear with --global-batch 36 (--lr as given: the "
                          "global batch is the base)"}
NODES_FLAGS = list(RUN_FLAGS) + ["--max-steps", "2"]
NODES_FLAGS[NODES_FLAGS.index("--epochs") + 1] = "1"
# 61 test images, odd: on 2 ranks a padding sampler would read one twice (TODO 4).
IMAGE_FLAGS = ["--train", "100", "--test", "61", "--seed", "3"]
LOSS_LINE = re.compile(r"train loss ([0-9.]+), test loss ([0-9.]+), test accuracy ([0-9.]+)")
TEST_LINE = re.compile(r"final test loss ([0-9.]+), test accuracy ([0-9.]+)")
REPORTED = ("training loss", "test loss", "test accuracy")  # LOSS_LINE's fields
# Per epoch: the training loss (AVG) and the evaluation's [loss sum, correct, images] (SUM); the
# final line repeats the last epoch's numbers.
REDUCED = 2 * EPOCHS
ALL_REDUCE_WHAT = ("reported numbers cover all ranks (the training loss averaged, the test "
                   "split's loss sum, correct predictions and image count added up)")
# Printed with 5 decimals, traced with 6.
LOSS_TOL = 2e-5
SAVED_FILES = ("model-best.pt", "model-final.pt")
COLLECTIVE_FILES = {"ddp.cpp": "ddp"}
RESULT_LINES = (LOSS_LINE, TEST_LINE)
SPLITS = (("loader-train", "train", "training"), ("loader-test", "test", "test"))
PLACES = {"init": ("kit::ResNet model(", "the line that creates the model"),
          "forward": ("kit::ResNet model(", "the model's options"),
          "update": ("torch::optim::SGD optimizer(", "the line that creates the optimizer"),
          "final": ("evaluate(model, test_loader", "the evaluation")}

LABELS = {"include": "1", "setup": "2-3", "sampler": "4", "loader-train": "5",
          "loader-test": "6", "ddp": "7", "ddp_forward": "7", "set_epoch": "8", "all_reduce": "9",
          "print0": "10", "save0": "11", "destroy": "12", "bn_stats": "13", "lr": "14",
          "no_sync": "15"}


def data_key():
    return IMAGE_FLAGS


def prepare_data(check, directory):
    data = os.path.join(directory, "images")
    return engine.generated_data(data, [check.tool("make_images"), "--out", data] + IMAGE_FLAGS,
                                 "test_batch.bin")


def judge(check):
    v, many, ranks = check.verdicts, check.many, check.ranks
    if judges.check_setup(v, many, check.nodes, check.source, ranks):
        uses, sizes, shuffles = judges.check_samplers(v, many, ranks, check.reference, SPLITS,
                                                      unpadded=("test",))
        # no_sync first: a guard that swallows every all-reduce also breaks DDP (TODO 7) and the
        # update (TODO 14), and is their cause.
        judges.check_no_sync(v, many, ranks, ACCUM)
        judges.check_ddp(v, many, ranks)
        judges.check_ddp_forward(v, many, ranks)  # batch norm's buffers: ddp.forward, TODO 7 too
        judges.check_set_epoch(v, many, ranks, uses.get("train"), sizes.get("train"), check.rules,
                               shuffles)
        judges.check_eval_model(v, many, ranks, check.reference)
        judges.check_lr_scaling(v, many, check.reference, ACCUM, RULE_TEXT)

        def again(scratch, run, reference, name):
            judges.check_no_sync(scratch, run, ranks, 3)
            judges.check_lr_scaling(scratch, run, reference, 3, FLAG_RULES[name])
        judges.with_flags(v, check, again)
    else:
        for concept in ("sampler", "loader-train", "loader-test", "no_sync", "ddp", "set_epoch",
                        "bn_stats", "lr"):
            v.add(concept, False, "needs setup()", "without it every process is rank 0 of 1", cause="setup")
    judges.check_all_reduce(v, many, ranks, check.rules)
    judges.check_print0(v, many, ranks, check.rules)
    judges.check_save0(v, many, ranks, check.rules)
    judges.check_destroy(v, many, ranks)
    mine, theirs = final_result(many), final_result(check.reference)
    same = mine is not None and theirs is not None and all(
        math.isclose(a, b, rel_tol=1e-4, abs_tol=LOSS_TOL) for a, b in zip(mine, theirs))
    compare.judge_run(check, f"your run on {ranks} ranks follows the solution's, to the same "
                      "final test loss and accuracy",
                      "" if same else f"final test loss and accuracy {mine} vs the solution's "
                      f"{theirs}")


def final_result(run):
    """(test loss, test accuracy) of rank 0's final line, or None."""
    lines = run.events(0, "print0") or run.logs[0].splitlines()
    found = [m for m in map(TEST_LINE.search, lines) if m]
    return tuple(map(float, found[-1].groups())) if found else None
