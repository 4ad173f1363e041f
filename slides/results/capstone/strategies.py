#!/usr/bin/env python3
"""The capstone's strategies side by side, from their runs' metrics.csv (ex07's trainer, one run
folder per strategy and repeat): step time (epoch 2 without its first step, which follows the
evaluation: the median of the differences of `elapsed_s`, and their range), samples/s of epoch 2,
each rank's peak memory in epoch 2 (on a CPU the process's peak resident memory), the last
training loss, and each strategy's median step time over DDP's with the range over every pair of
repeats.

usage: strategies.py RUN_DIR...   (folders named STRATEGY-REPEAT, e.g. ddp-1 zero3-2)
"""
import csv
import os
import statistics
import sys


def read(folder):
    steps, ranks, last_loss = {}, {}, None
    with open(os.path.join(folder, "metrics.csv")) as f:
        for row in csv.DictReader(f):
            if row["rank"]:
                if row["epoch"] == "2":
                    ranks[int(row["rank"])] = float(row["peak_mem_mib"])
                    sps = float(row["samples_per_s"])
                continue
            steps[int(row["step"])] = float(row["elapsed_s"])
            last_loss = row["loss"]
    # Epoch 2 is steps (n/2 + 1)..n; its first step follows the evaluation: left out.
    n = max(steps)
    times = [steps[s] - steps[s - 1] for s in range(n // 2 + 2, n + 1)]
    return dict(median=statistics.median(times), lo=min(times), hi=max(times), sps=sps,
                peaks=[ranks[r] for r in sorted(ranks)], loss=last_loss)


def main(folders):
    runs = {os.path.basename(os.path.normpath(f)): read(f) for f in folders}
    print("| run | step, median (min-max) | samples/s, epoch 2 | peak memory per rank "
          "| last loss |")
    print("|---|---:|---:|---:|---:|")
    for name, r in runs.items():
        peaks = " / ".join(f"{p:.1f}" for p in r["peaks"])
        print(f"| {name} | {r['median']:.3f} s ({r['lo']:.3f}-{r['hi']:.3f}) | {r['sps']:.1f} | "
              f"{peaks} MiB | {r['loss']} |")
    by = {}
    for name, r in runs.items():
        by.setdefault(name.rsplit("-", 1)[0], []).append(r["median"])
    if "ddp" in by:
        print()
        for s, medians in by.items():
            if s == "ddp":
                continue
            ratios = [m / d for m in medians for d in by["ddp"]]
            print(f"{s} / ddp, median step time: {statistics.median(ratios):.2f} "
                  f"(range over the {len(ratios)} pairs of repeats: "
                  f"{min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
