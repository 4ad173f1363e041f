#!/usr/bin/env python3
"""slides.scaling_study: exercise 02's local scaling study end to end, with tiny sizes.

  test_scaling_study.py --bin BUILD/bin --data IMAGES --work DIR

common/tools/scaling_study.py runs the solution with ddprun on 1, 2 and 4 ranks, strong and weak
scaling, into one scaling.csv and draws it with slides/tools/plot_scaling.py. Checked:
  * one CSV row per run, in order, with its label, world size and batches (strong: the global
    batch 16 split over the ranks; weak: 4 per rank), a throughput above zero, every run's
    output kept;
  * the four plots (a mark per run) and the summary (a row per run);
  * a global batch that a rank count does not divide: one line, exit 1, before any run.
"""
import argparse
import csv
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STUDY = os.path.join(ROOT, "common", "tools", "scaling_study.py")
failed = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failed.append(what)


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--work", required=True)
    a = p.parse_args(argv[1:])
    shutil.rmtree(a.work, ignore_errors=True)
    out, plots = os.path.join(a.work, "study"), os.path.join(a.work, "plots")
    cmd = [sys.executable, STUDY, "--bin", a.bin, "--data", a.data, "--out", out, "--plots", plots,
           "--ranks", "1", "2", "4", "--global-batch", "16", "--batch-per-rank", "4",
           "--label", "test", "--", "--max-steps", "3", "--width", "4", "--blocks", "1",
           "--train-images", "64", "--test-images", "16", "--target-acc", "0.01"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    print(run.stdout + run.stderr)
    check(run.returncode == 0, f"scaling_study.py exits 0 (got {run.returncode})")

    want = [("strong-1", 1, 16, 16), ("strong-2", 2, 8, 16), ("strong-4", 4, 4, 16),
            ("weak-1", 1, 4, 4), ("weak-2", 2, 4, 8), ("weak-4", 4, 4, 16)]
    try:
        with open(os.path.join(out, "scaling.csv"), newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        rows = []
        check(False, f"scaling.csv is readable: {e}")
    got = [(r["label"], int(r["world_size"]), int(r["batch_per_rank"]), int(r["global_batch"]))
           for r in rows]
    check(got == want, f"one row per run with its ranks and batches: {got}")
    check(len(rows) == 6 and all(float(r["images_per_s"]) > 0 for r in rows),
          "every run measured its images/s")
    for label, *_ in want:
        log = os.path.join(out, label, "stdout.log")
        check(os.path.isfile(log) and os.path.getsize(log) > 0, f"{label}: the run's output is kept")

    for name in ("throughput", "speedup", "efficiency", "time-to-target"):
        path = os.path.join(plots, f"scaling-{name}.svg")
        text = open(path, encoding="utf-8").read() if os.path.isfile(path) else ""
        check(text.count("<circle") == 6, f"scaling-{name}.svg marks the 6 runs "
              f"({text.count('<circle')} marks)")
    summary = os.path.join(plots, "scaling-summary.md")
    lines = open(summary, encoding="utf-8").read().splitlines() if os.path.isfile(summary) else []
    check(sum(line.startswith(("| strong |", "| weak |")) for line in lines) == 6,
          "scaling-summary.md has a row per run")

    bad = subprocess.run([sys.executable, STUDY, "--bin", a.bin, "--data", a.data,
                          "--out", os.path.join(a.work, "bad"), "--ranks", "1", "4",
                          "--global-batch", "6"], capture_output=True, text=True)
    check(bad.returncode == 1 and bad.stderr.count("\n") == 1 and
          "not divisible by 4 ranks" in bad.stderr and
          not os.path.exists(os.path.join(a.work, "bad", "strong-1")),
          f"a global batch 4 ranks do not divide: one line, exit 1, nothing run ({bad.stderr!r})")
    print(f"{len(failed)} check(s) failed" if failed else "all checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
