#!/usr/bin/env python3
"""KIT_MEMORY_CAP on a trainer (kit/train/memory.h): a run that needs more than the cap stops with
one line naming the request, the peak and the cap, exit 1, and loses nothing: its checkpoint stays
byte for byte and resumes once the memory is there.

  1. exercise 01's solution trains one epoch (one rank, a small model): one checkpoint;
  2. it resumes for a second epoch under a cap of 1M (too small to load the checkpoint) and of 2500K
     (it loads, then the first step's backward needs more): each stops with the out-of-memory line
     as its only line on stderr, exit 1; the checkpoint folder is as it was, nothing added;
  3. without the cap the same command resumes and finishes the second epoch;
  4. KIT_MEMORY_CAP=abc: one line, exit 2.

usage: memory_cap.py --trainer EX01_SOLUTION --make-corpus MAKE_CORPUS --work DIR
"""
import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from verdict import expect, finish  # noqa: E402 (tests/support)

FLAGS = ["--d-model", "32", "--heads", "2", "--layers", "1", "--feedforward", "64", "--seq-len", "16",
         "--batch-size", "8", "--eval-batch-size", "16", "--dropout", "0"]
OOM = re.compile(r"^rank 0: error: kit: out of memory: tried to allocate [0-9.]+ MiB with [0-9.]+ MiB live "
                 r"\(peak so far [0-9.]+ MiB\), above the cap of [0-9.]+ MiB \(KIT_MEMORY_CAP=[0-9A-Z]+\)$")


def snapshot(folder):
    """Every file under `folder`: its path and the SHA-256 of its bytes."""
    out = {}
    for base, _, files in os.walk(folder):
        for f in files:
            path = os.path.join(base, f)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, folder)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--make-corpus", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    data, out = os.path.join(args.work, "data"), os.path.join(args.work, "run")
    subprocess.run([args.make_corpus, "--out", data, "--train-tokens", "8000", "--valid-tokens", "1200",
                    "--test-tokens", "1200", "--seed", "3"], check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID",
                        "SLURM_NTASKS", "KIT_MEMORY_CAP", "KIT_TRACE_DIR")}
    cmd = [args.trainer, "--data-dir", data, "--out-dir", out] + FLAGS

    def run(epochs, cap=None, *extra):
        e = dict(env, **({"KIT_MEMORY_CAP": cap} if cap else {}))
        return subprocess.run(cmd + ["--epochs", str(epochs)] + list(extra), env=e, capture_output=True,
                              text=True, timeout=300)

    first = run(1)
    expect(first.returncode == 0, "one epoch trains and leaves a checkpoint", first.stderr)
    checkpoints = os.path.join(out, "checkpoints")
    before = snapshot(checkpoints)
    expect(len([d for d in os.listdir(checkpoints) if d.startswith("step-")]) == 1, "one checkpoint",
           str(os.listdir(checkpoints)))
    for cap, when in (("1M", "loading the checkpoint"), ("2500K", "the first step after the resume")):
        p = run(2, cap, "--resume")
        lines = p.stderr.strip().split("\n")
        expect(p.returncode == 1 and len(lines) == 1 and OOM.match(lines[0]),
               f"KIT_MEMORY_CAP={cap} ({when}): one out-of-memory line naming the peak and the cap, exit 1",
               f"exit {p.returncode}, stderr:\n{p.stderr}")
        expect(snapshot(checkpoints) == before,
               f"KIT_MEMORY_CAP={cap}: the checkpoint folder is byte for byte as it was, nothing added",
               f"before {sorted(before)}\nafter {sorted(snapshot(checkpoints))}")
        if cap == "2500K":
            expect("resuming from" in p.stdout, "under 2500K the checkpoint loaded before the step ran out",
                   p.stdout)
    again = run(2, None, "--resume")
    expect(again.returncode == 0 and "resuming from" in again.stdout and "[2/2] train loss" in again.stdout,
           "without the cap the same command resumes and trains the second epoch", again.stdout + again.stderr)
    bad = run(2, "abc")
    expect(bad.returncode == 2 and bad.stderr.strip() ==
           "kit: KIT_MEMORY_CAP: 'abc' is not a size in bytes (e.g. 1048576, 512M, 1.5G)",
           "KIT_MEMORY_CAP=abc: one line, exit 2", f"exit {bad.returncode}: {bad.stderr}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
