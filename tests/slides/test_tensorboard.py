#!/usr/bin/env python3
"""./kit tensorboard: a run's metrics.csv as TensorBoard event files, read back with
TensorBoard's own reader (tensorboard.backend.event_processing.event_accumulator).

  * a committed run of exercise 01 (slides/results/ranks-2, the six-column format) and a run in
    the current format (a row per step, then a row per rank at the epoch's end: made up here in
    kit/train/metrics.h's format): every step's loss and rate come back as train/loss and
    train/samples_per_s at their step, every rank's figures as rank<R>/...;
  * converting again replaces the events (one event file, no doubled points);
  * bad input, each one line and exit 2: a folder without metrics.csv, a CSV that is not the
    kit's, no Python with the tensorboard package.

usage: test_tensorboard.py --python PYTHON   (a Python with tensorboard, e.g. the kit's .venv)
"""
import argparse
import csv
import glob
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
from verdict import expect, finish  # noqa: E402

CURRENT = """step,epoch,loss,samples_per_s,ranks,elapsed_s,rank,device,host,peak_mem_mib,gpu_busy_pct
1,1,7.5,100.0,2,0.5,,,,,
2,1,7.25,110.0,2,1.0,,,,,
2,1,,55.5,2,1.0,0,cuda:0,n1,1234.5,87
2,1,,54.5,2,1.0,1,cuda:1,n1,1200.0,85
"""


def kit(python, *args, env=None):
    e = dict(os.environ, KIT_PYTHON=python, **(env or {}))
    return subprocess.run([os.path.join(ROOT, "kit"), "tensorboard", *args], env=e,
                          capture_output=True, text=True, timeout=300)


def read_back(python, logdir):
    """{tag: [(step, value)]} of the event files in logdir, by TensorBoard's reader."""
    code = ("import json, sys\n"
            "from tensorboard.backend.event_processing import event_accumulator as ea\n"
            "a = ea.EventAccumulator(sys.argv[1]); a.Reload()\n"
            "print(json.dumps({t: [(s.step, s.value) for s in a.Scalars(t)] "
            "for t in a.Tags()['scalars']}))")
    out = subprocess.run([python, "-c", code, logdir], capture_output=True, text=True, check=True)
    import json
    return {t: [tuple(p) for p in v] for t, v in json.loads(out.stdout).items()}


def close(a, b):
    return abs(a - b) <= 1e-5 * max(1.0, abs(b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", required=True)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="kit-tensorboard-")
    try:
        old = os.path.join(work, "runs", "ex01-1001")
        shutil.copytree(os.path.join(ROOT, "slides", "results", "ranks-2"), old)
        new = os.path.join(work, "runs", "ex01-1002")
        os.makedirs(new)
        with open(os.path.join(new, "metrics.csv"), "w") as f:
            f.write(CURRENT)
        logdir = os.path.join(work, "tb")

        r = kit(a.python, old, new, "--out", logdir)
        expect(r.returncode == 0, "./kit tensorboard converts two runs", r.stdout + r.stderr)
        got = read_back(a.python, os.path.join(logdir, "ex01-1001"))
        with open(os.path.join(old, "metrics.csv")) as f:
            rows = list(csv.DictReader(f))
        want = [(int(r["step"]), float(r["loss"])) for r in rows]
        loss = got.get("train/loss", [])
        expect(len(loss) == len(want) and all(s == ws and close(v, wv)
                                              for (s, v), (ws, wv) in zip(loss, want)),
               f"the committed run: all {len(want)} steps' losses at their steps", loss[:3])
        rate = got.get("train/samples_per_s", [])
        expect(len(rate) == len(rows) and close(rate[-1][1], float(rows[-1]["samples_per_s"])),
               "... and their samples/s")

        got = read_back(a.python, os.path.join(logdir, "ex01-1002"))
        expect(got.get("train/loss") == [(1, 7.5), (2, 7.25)],
               "the current format: rank 0's loss per step (the per-rank rows are no loss)", got)
        expect(got.get("rank0/peak_mem_mib") == [(2, 1234.5)]
               and got.get("rank1/samples_per_s") == [(2, 54.5)]
               and got.get("rank1/gpu_busy_pct") == [(2, 85.0)],
               "... every rank's samples/s, peak memory and GPU busy at the epoch's last step", got)

        r = kit(a.python, new)  # the default place: RUN/tensorboard
        r = kit(a.python, new)
        files = glob.glob(os.path.join(new, "tensorboard", "events.out.tfevents.*"))
        expect(r.returncode == 0 and len(files) == 1
               and read_back(a.python, os.path.join(new, "tensorboard"))["train/loss"] == [(1, 7.5), (2, 7.25)],
               "converted twice into RUN/tensorboard: one event file, no point doubled", files)

        def one_line(r, phrase, what):
            lines = [l for l in r.stderr.splitlines() if l.strip()]
            expect(r.returncode == 2 and len(lines) == 1 and phrase in lines[0], what,
                   r.stdout + r.stderr)

        empty = os.path.join(work, "runs", "empty")
        os.makedirs(empty)
        one_line(kit(a.python, empty), "has no metrics.csv", "a folder without metrics.csv: one line, exit 2")
        other = os.path.join(work, "other.csv")
        with open(other, "w") as f:
            f.write("epoch,train_loss\n1,2.0\n")
        one_line(kit(a.python, other), "is not a kit metrics.csv", "another CSV: one line, exit 2")
        one_line(kit("/usr/bin/false", new, env={"KIT_VENV": os.path.join(work, "no-venv")}),
                 "no tensorboard package", "no Python with tensorboard: one line, exit 2")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
