#!/usr/bin/env python3
"""The capstone's strategies side by side, from their runs' metrics.csv (ex07's trainer, one run
folder per strategy and repeat): step time (epoch 2 without its first step, which follows the
evaluation: the median of the differences of `elapsed_s`, and their range), the samples of a
step (the batch times the batches a step trains on: one per rank, one per tp group under tensor
parallelism), the job's samples/s from those two, each rank's peak memory in epoch 2 (on a CPU
the process's peak resident memory), the last training loss, and each strategy's time per
sample over DDP's, with the range over every pair of repeats.

usage: strategies.py [--batch-size B] RUN_DIR...
  RUN_DIR   folders named STRATEGY-REPEAT, e.g. ddp-1 zero3-2 tp2-1 (tpN: tensor parallelism over
            N ranks, whose N ranks train on the same batches)
  B         the trainer's --batch-size (per batch; default 16)
"""
import csv
import os
import re
import statistics
import sys


def read(folder, batch):
    steps, ranks, last_loss, world = {}, {}, None, None
    with open(os.path.join(folder, "metrics.csv")) as f:
        for row in csv.DictReader(f):
            if row["rank"]:
                if row["epoch"] == "2":
                    ranks[int(row["rank"])] = float(row["peak_mem_mib"])
                continue
            steps[int(row["step"])] = float(row["elapsed_s"])
            last_loss, world = row["loss"], int(row["ranks"])
    # Epoch 2 is steps (n/2 + 1)..n; its first step follows the evaluation: left out.
    n = max(steps)
    times = [steps[s] - steps[s - 1] for s in range(n // 2 + 2, n + 1)]
    strategy = os.path.basename(os.path.normpath(folder)).rsplit("-", 1)[0]
    tp = re.fullmatch(r"tp(\d+)", strategy)
    per_batch = int(tp.group(1)) if tp else 1  # ranks that train on one batch together
    samples = batch * world // per_batch
    median = statistics.median(times)
    return dict(strategy=strategy, median=median, lo=min(times), hi=max(times), samples=samples,
                sps=samples / median, peaks=[ranks[r] for r in sorted(ranks)], loss=last_loss)


def main(argv):
    batch = 16
    if argv[:1] == ["--batch-size"]:
        batch, argv = int(argv[1]), argv[2:]
    runs = {os.path.basename(os.path.normpath(f)): read(f, batch) for f in argv}
    print("| run | step, median (min-max) | samples a step | samples/s | peak memory per rank "
          "| last loss |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in runs.items():
        peaks = " / ".join(f"{p:.1f}" for p in r["peaks"])
        print(f"| {name} | {r['median']:.3f} s ({r['lo']:.3f}-{r['hi']:.3f}) | {r['samples']} | "
              f"{r['sps']:.1f} | {peaks} MiB | {r['loss']} |")
    per_sample = {}
    for r in runs.values():
        per_sample.setdefault(r["strategy"], []).append(r["median"] / r["samples"])
    if "ddp" in per_sample:
        print()
        for s, times in per_sample.items():
            if s == "ddp":
                continue
            ratios = [t / d for t in times for d in per_sample["ddp"]]
            print(f"{s} / ddp, time per sample: {statistics.median(ratios):.2f} "
                  f"(range over the {len(ratios)} pairs of repeats: "
                  f"{min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
