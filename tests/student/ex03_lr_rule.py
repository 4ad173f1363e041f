#!/usr/bin/env python3
"""Exercise 03 trains with exercise 02's learning rate: --lr-scaling (the rate for the global batch)
and --warmup-steps, at every stage (issue 40): DDP through torch's param groups, ZeRO-1 and -2
through ShardedAdamW::set_lr(), ZeRO-3 through FullyShardedModel::set_lr().

The solution's trainer on 2 ranks, 3 steps, at stages 0 to 3 with --lr-scaling sqrt
--warmup-steps 3, and DDP once without them: every stage prints DDP's losses with the flags (the
check's tolerance, 2e-5), which are not the losses without them (the flags change the run); a
rule that does not exist is one line and exit 2.

usage: ex03_lr_rule.py --solution BIN --ddprun BIN --make-corpus BIN --work DIR
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
sys.path.insert(0, os.path.join(ROOT, "common", "tools"))
from verdict import expect, finish  # noqa: E402
from rules import ex01  # noqa: E402  (its small corpus and model)

LOSS = re.compile(r"train loss ([0-9.]+), validation loss ([0-9.]+)|final test loss ([0-9.]+)")
FLAGS = ["--lr-scaling", "sqrt", "--warmup-steps", "3"]


def main():
    ap = argparse.ArgumentParser()
    for flag in ("--solution", "--ddprun", "--make-corpus", "--work"):
        ap.add_argument(flag, required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    data = os.path.join(a.work, "corpus")
    subprocess.run([a.make_corpus, "--out", data] + ex01.CORPUS_FLAGS, check=True,
                   capture_output=True)
    flags = list(ex01.RUN_FLAGS) + ["--max-steps", "3"]
    flags[flags.index("--epochs") + 1] = "1"

    def losses(name, stage, extra):
        out = os.path.join(a.work, name)
        p = subprocess.run([a.ddprun, "--nproc-per-node", "2", "--", a.solution, "--data-dir", data,
                            "--out-dir", out, "--zero-stage", str(stage)] + flags + extra,
                           capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        expect(p.returncode == 0, f"{name}: the run ends", p.stdout + p.stderr)
        return [float(x) for m in LOSS.finditer(p.stdout) for x in m.groups() if x]

    ddp = losses("ddp", 0, FLAGS)
    plain = losses("ddp-plain", 0, [])
    expect(len(ddp) == 3 and len(plain) == 3, "DDP prints 3 losses with and without the flags",
           f"{ddp} {plain}")
    expect(any(abs(x - y) > 1e-4 for x, y in zip(ddp, plain)),
           "the flags change the losses (the rate is scaled and warms up)", f"{ddp} {plain}")
    for stage in (1, 2, 3):
        mine = losses(f"zero{stage}", stage, FLAGS)
        expect(len(mine) == len(ddp) and all(abs(x - y) <= 2e-5 for x, y in zip(mine, ddp)),
               f"ZeRO-{stage} with {' '.join(FLAGS)} has DDP's losses", f"{mine} {ddp}")
    p = subprocess.run([a.solution, "--lr-scaling", "cubic"], capture_output=True, text=True)
    lines = (p.stdout + p.stderr).strip().splitlines()
    expect(p.returncode == 2 and len(lines) == 1 and "--lr-scaling" in lines[0],
           "an unknown --lr-scaling rule is one line and exit 2", p.stdout + p.stderr)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
