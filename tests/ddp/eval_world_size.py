#!/usr/bin/env python3
"""The validation and test losses of a trainer do not depend on the number of ranks.

Evaluation is split across the ranks, but its result is one number for the whole split: the
sum of the loss over every sample (or word) divided by their count. Two ways to get it wrong
make it depend on the world size, and both were the kit's own behaviour once: a
DistributedSampler pads the split with repeated samples to a multiple of the ranks, and a mean
of per-batch (or per-rank) means weights a short last batch like a full one.

The test runs the solution on 1, 2 and 4 ranks (ddprun; alone for 1; --flags adds the exercise's own, e.g. exercise 03's --zero-stage) with --lr 0: training
then leaves rank 0's initial weights, which DDP gives every rank, unchanged, so that all three
runs evaluate the same model, and any difference in their losses comes from the evaluation
alone. The corpus is cut so that neither split is a multiple of 2 or 4 samples, nor of the
evaluation batch (a padding sampler would repeat samples, a mean of means would weigh a short
batch), and so that on 2 and 4 ranks rank 0 has one validation batch more than the others
(every collective must still be called equally often on every rank: ZeRO-3's forward is one). The printed losses (5 decimals) must be equal within their rounding (1e-5); the
trace's reduced sums and counts (KIT_TRACE_DIR: the all_reduce whose result is the loss) give
the difference without that rounding, and must agree within --tolerance (relative).

Measured on 2026-11-25 (torch 2.13, CPU, exercise 01): at most 4.9e-8 relative between 1, 2 and
4 ranks (float32 per-batch means over batches of other sizes, summed in double), and the same
printed losses; the test allows 1e-6. The kit's earlier evaluation (padded samplers, AVG of
per-rank means of per-batch means) printed validation losses 6.82031, 6.82712 and 6.83145 and
test losses 6.80666, 6.81636 and 6.82308 on 1, 2 and 4 ranks here: up to 1.6e-2 apart.
Exercise 03 gives the same figures under DDP and ZeRO-3 (its old ones: up to 6.2e-2 apart).

Exercise 02 (--make-images: the image classifier) evaluates one test split, and reports its loss
and its accuracy, from one all-reduced [loss sum, correct predictions, images] triple. Its
ResNet has batch norm, whose running statistics training updates even with --lr 0, from each
rank's own batch: the run trains on a single image (--train-images 1 --batch-size 1), which the
training sampler gives every rank (it pads one image to one per rank), so that the statistics
are the same on 1, 2 and 4 ranks, and with them the evaluated model. The test split has 65
images (odd; on 2 and 4 ranks rank 0 has one batch of 16 more). Measured on 2026-11-25 (torch
2.13, CPU): the same printed loss and accuracy (2.31340, 0.10769), the reduced loss within
5.3e-8 relative (the trace's 6 decimals); the earlier evaluation (a padding test sampler, AVG of
per-rank means) printed test losses 2.31340, 2.31526 and 2.31040 and accuracies 0.10769, 0.10606
and 0.11765 on 1, 2 and 4 ranks.

usage: eval_world_size.py --trainer TRAINER --ddprun DDPRUN --work DIR
                          (--make-corpus MAKE_CORPUS | --make-images MAKE_IMAGES)
                          [--tolerance 1e-6] [--flags "--zero-stage 3"]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from verdict import expect, finish  # noqa: E402 (tests/support)

SEQ_LEN, EVAL_BATCH = 16, 16
FLAGS = ["--epochs", "1", "--max-steps", "2", "--batch-size", "8",
         "--eval-batch-size", str(EVAL_BATCH), "--seq-len", str(SEQ_LEN), "--d-model", "32",
         "--heads", "2", "--layers", "1", "--feedforward", "64", "--dropout", "0", "--seed", "7",
         "--lr", "0"]
# Valid and test: 65 and 73 windows of 17 tokens: odd, not multiples of the batch of 16, and
# the validation slices on 2 and 4 ranks are 33/32 and 17/16 samples: a batch more on rank 0.
CORPUS = ["--train-tokens", "4000", "--valid-tokens", "1100", "--test-tokens", "1190",
          "--seed", "3"]
RANKS = (1, 2, 4)
LOSS_LINE = re.compile(r"validation loss ([0-9.]+)")
TEST_LINE = re.compile(r"final test loss ([0-9.]+)")

# Exercise 02: one training image for every rank (see above), 65 test images in batches of 16.
IMAGE_EVAL_BATCH = 16
IMAGE_FLAGS = ["--epochs", "1", "--batch-size", "1", "--eval-batch-size", str(IMAGE_EVAL_BATCH),
               "--train-images", "1", "--test-images", "65", "--seed", "7", "--lr", "0"]
IMAGES = ["--train", "10", "--test", "80", "--seed", "3"]
IMAGE_LINE = re.compile(r"test loss ([0-9.]+), test accuracy ([0-9.]+)")  # each epoch's, the final

# What differs between the two kinds of trainer: their flags, their data, the numbers they
# print (a list per run), and the values of their evaluation's all_reduce ([loss sum, count], or
# [loss sum, correct, images]: the last is the count).
LM = dict(flags=FLAGS, eval_batch=EVAL_BATCH, values=2, printed=(LOSS_LINE, TEST_LINE),
          names=("validation loss", "final test loss"))
IMAGE = dict(flags=IMAGE_FLAGS, eval_batch=IMAGE_EVAL_BATCH, values=3, printed=(IMAGE_LINE,),
             names=("test loss", "test accuracy", "final test loss", "final test accuracy"))


def run(args, kind, data, ranks):
    work = os.path.join(args.work, f"ranks-{ranks}")
    trace, out = os.path.join(work, "trace"), os.path.join(work, "out")
    os.makedirs(trace)
    # A short collective timeout: a rank left waiting in a collective fails the run in a minute.
    env = dict(os.environ, KIT_TRACE_DIR=trace, OMP_NUM_THREADS="1", KIT_TIMEOUT="60")
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"):
        env.pop(var, None)
    cmd = [args.trainer, "--data-dir", data, "--out-dir", out] + kind["flags"] + args.flags.split()
    if ranks > 1:
        cmd = [args.ddprun, "--nproc-per-node", str(ranks), "--"] + cmd
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        sys.exit(f"the trainer failed on {ranks} ranks (exit {p.returncode}):\n{p.stdout}\n{p.stderr}")
    printed = [float(x) for line in kind["printed"] for m in line.finditer(p.stdout)
               for x in m.groups()]
    # Rank 0's trace (alone, it is named after the pid): the evaluation's reduced [sum, count]
    # pairs (or [sum, correct, count] triples), and the splits' sizes (the samplers' lines).
    name = next(n for n in sorted(os.listdir(trace)) if n.endswith(".trace"))
    exact, sizes = [], []
    with open(os.path.join(trace, name)) as f:
        for line in f:
            event, _, rest = line.rstrip("\n").partition(" ")
            fields = dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)
            out = fields.get("out", "").split(",")
            if event == "all_reduce" and len(out) == kind["values"]:
                exact += [float(x) / float(out[-1]) for x in out[:-1]]
            elif event == "sampler":
                sizes.append(int(fields["size"]))
    return printed, exact, sizes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--ddprun", required=True)
    data_tool = ap.add_mutually_exclusive_group(required=True)
    data_tool.add_argument("--make-corpus", help="a language model's trainer (exercises 01, 03)")
    data_tool.add_argument("--make-images", help="the image classifier's trainer (exercise 02)")
    ap.add_argument("--work", required=True)
    ap.add_argument("--tolerance", type=float, default=1e-6)
    ap.add_argument("--flags", default="", help="more trainer flags, one string")
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    data = os.path.join(args.work, "data")
    if args.make_images:
        kind = IMAGE
        subprocess.run([args.make_images, "--out", data] + IMAGES, check=True, capture_output=True)
    else:
        kind = LM
        subprocess.run([args.make_corpus, "--out", data] + CORPUS, check=True, capture_output=True)
    eval_batch, names = kind["eval_batch"], kind["names"]

    runs = {n: run(args, kind, data, n) for n in RANKS}
    printed = {n: r[0] for n, r in runs.items()}
    sizes = runs[1][2][1:]  # train, then the evaluation's splits (validation and test, or test)
    expect(len(sizes) == (2 if kind is LM else 1) and all(s % 2 and s % eval_batch for s in sizes),
           f"the evaluation's splits ({sizes} samples) are not multiples of 2, 4 or the "
           "evaluation batch, so padding or a mean of means would show")
    batches = {n: [-(-(sizes[0] // n + (r < sizes[0] % n)) // eval_batch) for r in range(n)]
               for n in RANKS[1:]} if sizes else {}
    expect(batches and all(len(set(b)) > 1 for b in batches.values()),
           f"on 2 and 4 ranks the ranks have different numbers of {'validation' if kind is LM else 'test'} batches {batches}")
    expect(all(len(p) == len(names) for p in printed.values()),
           f"every run printed its {', '.join(names)}", str(printed))
    worst = max(abs(a - b) for n in RANKS for a, b in zip(printed[n], printed[1]))
    expect(worst <= 1e-5, f"the printed {', '.join(names)} are the same on 1, 2 and 4 "
           f"ranks (largest difference {worst:.1e}; printed to 5 decimals)",
           "\n".join(f"{n} ranks: " + ", ".join(f"{name} {x:.5f}" for name, x in zip(names, p))
                     for n, p in printed.items()))
    exact = {n: r[1] for n, r in runs.items()}
    what = "[loss sum, count] pair" if kind is LM else "[loss sum, correct, images] triple"
    if expect(all(len(e) == 2 for e in exact.values()),
              f"every run reduced one {what} per evaluation (the trace's all_reduce)",
              str(exact)):
        rel = max(abs(a - b) / max(abs(b), 1e-12) for n in RANKS for a, b in zip(exact[n], exact[1]))
        expect(rel <= args.tolerance, f"the reduced losses agree within {args.tolerance:g} "
               f"relative (largest difference {rel:.1e})",
               "\n".join(f"{n} ranks: {e}" for n, e in exact.items()))
    return finish()


if __name__ == "__main__":
    sys.exit(main())
