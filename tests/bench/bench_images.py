#!/usr/bin/env python3
"""Exercise 02's benchmark (issue 10): the image trainer's throughput on CPU ranks, and what the
loader's workers buy. A benchmark, not a test: it prints figures and asserts no time.

  bench_images.py --bin BUILD/bin --data IMAGES [--batch 32] [--steps 40] [--repeats 3]
                  [--workers 2] [--loader-batches 100] [--work DIR] [-- TRAINER ARGS]

Configurations, each run --repeats times, interleaved (repeat 1 of every configuration, then
repeat 2, ...) so that a burst of load on the machine hits all of them alike; every rank has one
thread (OMP_NUM_THREADS=1: a core per rank, the CPU analogue of a GPU per rank):
  1 rank              ex02-solution, --batch-size B, --workers 0
  2 ranks             the same on two ranks (weak scaling: B per rank)
  1 rank, N workers   1 rank with --workers N: the loader's threads assemble and augment the
                      next batches while the model computes

Then bench_loader (tests/bench/bench_loader.cpp) times the DataLoader alone, without a model,
with 0 .. N workers and the training augmentation: the part of a step that workers can hide.

Printed: the median over the repeats of each configuration's step time (the trainer's median
step after the first few), images/s in all and per rank; the scaling efficiency on 2 ranks,
images/s per rank on 2 ranks / images/s on 1; and the step time with the workers on and off.
The figures come from the trainer's --summary-csv rows (common/tools/scaling_study.py runs
each configuration). BENCH_STEPS / BENCH_REPEATS in the environment override the defaults.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "common", "tools"))
from scaling_study import run_once, split_trainer_args  # noqa: E402


def main(argv):
    argv, trainer_args = split_trainer_args(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--batch", type=int, default=32, help="images per rank and step")
    p.add_argument("--steps", type=int, default=int(os.environ.get("BENCH_STEPS", 40)))
    p.add_argument("--repeats", type=int, default=int(os.environ.get("BENCH_REPEATS", 3)))
    p.add_argument("--workers", type=int, default=2, help="the loader's workers of the last configuration")
    p.add_argument("--loader-batches", type=int, default=100,
                   help="batches bench_loader times per repeat")
    p.add_argument("--work", help="keep the runs' output here (default: a temporary folder)")
    a = p.parse_args(argv[1:])
    if min(a.steps, a.repeats, a.batch, a.workers, a.loader_batches) < 1:
        sys.stderr.write("bench_images.py: --steps, --repeats, --batch, --workers and "
                         "--loader-batches must be >= 1\n")
        return 2

    work = a.work or tempfile.mkdtemp(prefix="bench_images.")
    configs = [("1 rank", 1, 0), ("2 ranks", 2, 0), (f"1 rank, {a.workers} workers", 1, a.workers)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rows = {name: [] for name, _, _ in configs}
    table = os.path.join(work, "bench.csv")
    try:
        for repeat in range(a.repeats):
            for k, (name, ranks, workers) in enumerate(configs):
                run_dir = os.path.join(work, f"run-{repeat}-{k}")
                shutil.rmtree(run_dir, ignore_errors=True)
                os.makedirs(run_dir)
                args = ["--data-dir", a.data, "--run-label", f"bench-{k}", "--batch-size",
                        str(a.batch), "--max-steps", str(a.steps), "--epochs", "1",
                        "--workers", str(workers)] + trainer_args
                rows[name].append(run_once(a.bin, "ex02-solution", ranks, run_dir, table, args, env))
                print(f"bench_images.py: repeat {repeat + 1}/{a.repeats}, {name}: "
                      f"{float(rows[name][-1]['step_time_s']) * 1000:.1f} ms/step", flush=True)
    except RuntimeError as e:
        sys.stderr.write(f"bench_images.py: {e}\n")
        return 1
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)

    def median(name, field):
        return statistics.median(float(r[field]) for r in rows[name])

    def spread(name, field):
        values = [float(r[field]) for r in rows[name]]
        return f"{min(values):.4g}-{max(values):.4g}"

    device = rows[configs[0][0]][0]["device"]
    print(f"\nexercise 02 on {device}: batch {a.batch} per rank, {a.steps} steps, median of "
          f"{a.repeats} repeat(s) [range], 1 thread per rank")
    print(f"{'configuration':<24} {'step ms':>10} {'images/s':>10} {'per rank':>10}  range of images/s per rank")
    for name, _, _ in configs:
        print(f"{name:<24} {1000 * median(name, 'step_time_s'):>10.1f} "
              f"{median(name, 'images_per_s'):>10.1f} {median(name, 'images_per_s_per_rank'):>10.1f}"
              f"  [{spread(name, 'images_per_s_per_rank')}]")
    one, two, threaded = (c[0] for c in configs)
    efficiency = median(two, "images_per_s_per_rank") / median(one, "images_per_s_per_rank")
    print(f"scaling efficiency on 2 ranks: {100 * efficiency:.0f} % "
          "(images/s per rank on 2 ranks / images/s on 1)")
    off, on = median(one, "step_time_s"), median(threaded, "step_time_s")
    print(f"loader workers: step {1000 * off:.1f} ms with 0 workers, {1000 * on:.1f} ms with "
          f"{a.workers} ({off / on:.2f}x)")

    loader = subprocess.run([os.path.join(a.bin, "bench_loader"), "--data", a.data, "--batch",
                             str(a.batch), "--batches", str(a.loader_batches), "--repeats",
                             str(a.repeats), "--max-workers", str(a.workers)],
                            capture_output=True, text=True, env=env)
    if loader.returncode != 0:
        sys.stderr.write(loader.stdout + loader.stderr)
        sys.stderr.write(f"bench_images.py: bench_loader failed (exit code {loader.returncode})\n")
        return 1
    for m in re.finditer(r"^LOADER workers=(\d+) .* ms_per_batch_median=([0-9.]+)", loader.stdout, re.M):
        ms = float(m.group(2))
        print(f"loader alone, {m.group(1)} workers: {ms:.2f} ms per batch of {a.batch} "
              f"({100 * ms / (1000 * off):.1f} % of the step with 0 workers)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
