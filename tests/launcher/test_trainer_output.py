#!/usr/bin/env python3
"""What a person sees of a 2-rank training under ddprun (exercise 01's solution, its stdout a
pipe, as under ddprun, srun and Slurm's .out file):

  * every rank's lines appear when they are printed: rank 1's "rank 1 of 2: ..." line, printed at
    the start, comes before rank 0's final test loss (with a fully buffered stdout it only left
    rank 1 when the process exited, after the final loss);
  * the progress lines (KIT_PROGRESS_S=0: one per step) say where the epoch is and its ETA:
    "step S/N of the epoch, ETA ..." with N the steps of the epoch (here --max-steps), S counting
    up to N, and "ETA 0 s" at the last step;
  * --prefix-ranks tags each line with the rank that wrote it.

usage: test_trainer_output.py --ddprun PROG --trainer PROG --work DIR
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from verdict import expect, finish  # noqa: E402 (tests/support)

QUICK = ["--epochs", "1", "--max-steps", "4", "--d-model", "32", "--layers", "1", "--seq-len", "16"]




def train(a, name, *ddprun_flags):
    out = os.path.join(a.work, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    env = dict(os.environ, KIT_PROGRESS_S="0", OMP_NUM_THREADS="1")
    p = subprocess.run([a.ddprun, "--nproc-per-node", "2", *ddprun_flags, "--", a.trainer,
                        "--out-dir", out, *QUICK], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, env=env, timeout=240)
    return p.returncode, p.stdout.splitlines()


def index(lines, pattern):
    return next((i for i, l in enumerate(lines) if re.search(pattern, l)), None)


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args(argv)

    rc, lines = train(a, "plain")
    text = "\n".join(lines)
    expect(rc == 0, f"the 2-rank run succeeds ({rc})", text)
    rank1, final = index(lines, r"^rank 1 of 2: "), index(lines, r"^final test loss ")
    expect(rank1 is not None and final is not None and rank1 < final,
           f"rank 1's device line (line {rank1}) comes before the final test loss (line {final})",
           text)
    progress = [l for l in lines if l.startswith("  epoch 1, step ")]
    steps = [re.search(r", step (\d+)/(\d+) of the epoch, ETA (\d+ s|\d+ min \d\d s|\d+ h \d\d min)$", l)
             for l in progress]
    expect(len(progress) == 4 and all(steps), "one progress line per step, each with its ETA",
           "\n".join(progress))
    if len(progress) == 4 and all(steps):
        expect([(m[1], m[2]) for m in steps] == [(str(s), "4") for s in range(1, 5)],
               "the lines count the epoch's steps: 1/4 .. 4/4", "\n".join(progress))
        expect(steps[-1][3] == "0 s", "the last step's ETA is 0 s", progress[-1])
    expect(index(lines, r"^\[rank") is None, "no rank prefix unless asked")

    rc, lines = train(a, "prefixed", "--prefix-ranks")
    text = "\n".join(lines)
    expect(rc == 0 and index(lines, r"^\[rank 1\] rank 1 of 2: ") is not None and
           index(lines, r"^\[rank 0\] final test loss ") is not None and
           all(re.match(r"\[rank [01]\] ", l) for l in lines),
           "--prefix-ranks: every line names its rank", text)
    return finish()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
