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

usage: eval_world_size.py --trainer TRAINER --ddprun DDPRUN --make-corpus MAKE_CORPUS --work DIR
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


def run(args, data, ranks):
    work = os.path.join(args.work, f"ranks-{ranks}")
    trace, out = os.path.join(work, "trace"), os.path.join(work, "out")
    os.makedirs(trace)
    # A short collective timeout: a rank left waiting in a collective fails the run in a minute.
    env = dict(os.environ, KIT_TRACE_DIR=trace, OMP_NUM_THREADS="1", KIT_TIMEOUT="60")
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"):
        env.pop(var, None)
    cmd = [args.trainer, "--data-dir", data, "--out-dir", out] + FLAGS + args.flags.split()
    if ranks > 1:
        cmd = [args.ddprun, "--nproc-per-node", str(ranks), "--"] + cmd
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        sys.exit(f"the trainer failed on {ranks} ranks (exit {p.returncode}):\n{p.stdout}\n{p.stderr}")
    printed = [float(m.group(1)) for m in LOSS_LINE.finditer(p.stdout)] + \
              [float(m.group(1)) for m in TEST_LINE.finditer(p.stdout)]
    # Rank 0's trace (alone, it is named after the pid): the evaluation's reduced [sum, count]
    # pairs, and the splits' sizes (the samplers' lines).
    name = next(n for n in sorted(os.listdir(trace)) if n.endswith(".trace"))
    exact, sizes = [], []
    with open(os.path.join(trace, name)) as f:
        for line in f:
            kind, _, rest = line.rstrip("\n").partition(" ")
            fields = dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)
            if kind == "all_reduce" and "," in fields.get("out", ""):
                total, count = map(float, fields["out"].split(","))
                exact.append(total / count)
            elif kind == "sampler":
                sizes.append(int(fields["size"]))
    return printed, exact, sizes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--make-corpus", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--tolerance", type=float, default=1e-6)
    ap.add_argument("--flags", default="", help="more trainer flags, one string")
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    data = os.path.join(args.work, "data")
    subprocess.run([args.make_corpus, "--out", data] + CORPUS, check=True, capture_output=True)

    runs = {n: run(args, data, n) for n in RANKS}
    printed = {n: r[0] for n, r in runs.items()}
    sizes = runs[1][2][1:]  # train, then validation and test
    expect(len(sizes) == 2 and all(s % 2 and s % EVAL_BATCH for s in sizes),
           f"the validation and test splits ({sizes} samples) are not multiples of 2, 4 or the "
           "evaluation batch, so padding or a mean of means would show")
    batches = {n: [-(-(sizes[0] // n + (r < sizes[0] % n)) // EVAL_BATCH) for r in range(n)]
               for n in RANKS[1:]} if sizes else {}
    expect(batches and all(len(set(b)) > 1 for b in batches.values()),
           f"on 2 and 4 ranks the ranks have different numbers of validation batches {batches}")
    expect(all(len(p) == 2 for p in printed.values()),
           "every run printed a validation and a final test loss", str(printed))
    worst = max(abs(a - b) for n in RANKS for a, b in zip(printed[n], printed[1]))
    expect(worst <= 1e-5, "the printed validation and test losses are the same on 1, 2 and 4 "
           f"ranks (largest difference {worst:.1e}; printed to 5 decimals)",
           "\n".join(f"{n} ranks: validation {p[0]:.5f}, test {p[1]:.5f}"
                     for n, p in printed.items() if len(p) == 2))
    exact = {n: r[1] for n, r in runs.items()}
    if expect(all(len(e) == 2 for e in exact.values()),
              "every run reduced one [loss sum, count] pair per evaluation (the trace's all_reduce)",
              str(exact)):
        rel = max(abs(a - b) / abs(b) for n in RANKS for a, b in zip(exact[n], exact[1]))
        expect(rel <= args.tolerance, f"the reduced losses agree within {args.tolerance:g} "
               f"relative (largest difference {rel:.1e})",
               "\n".join(f"{n} ranks: {e}" for n, e in exact.items()))
    return finish()


if __name__ == "__main__":
    sys.exit(main())
