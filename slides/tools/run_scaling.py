#!/usr/bin/env python3
"""Real runs for the results deck: the exercise-01 solution on 1, 2, 4 ... ranks, each run's
metrics.csv and output kept, then the plots.

  run_scaling.py --bin BUILD/bin --out DIR [--ranks 1 2 4] [--plots PLOTDIR] [-- TRAINER ARGS]

Each run goes to a fresh DIR/ranks-N/ (emptied first, so that the trainer does not resume an
older run); metrics.csv and stdout.log are kept, checkpoints and models deleted. Everything
after `--` is passed to the trainer, e.g. `-- --epochs 3` or `-- --epochs 1 --max-steps 10`.
The runs use the local launcher (ddprun); on a cluster, run the sbatch solution with 1, 2, 4 ...
GPUs instead and give the metrics.csv files to plot_metrics.py.
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "common", "tools"))
from scaling_study import split_trainer_args  # noqa: E402 (the same `--` rule as exercise 02's study)


def main(argv):
    argv, trainer_args = split_trainer_args(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", required=True, help="the build's bin/ folder (ddprun, ex01-solution)")
    p.add_argument("--out", required=True)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--trainer", default="ex01-solution")
    p.add_argument("--plots", help="also write the plots into this folder")
    p.add_argument("--threads-per-rank", type=int, default=1,
                   help="OMP_NUM_THREADS of every rank (default 1: one core per rank, the CPU "
                        "analogue of one GPU per rank); 0 leaves the kit's default")
    a = p.parse_args(argv[1:])
    ddprun = os.path.join(a.bin, "ddprun")
    trainer = os.path.join(a.bin, a.trainer)
    for tool in (ddprun, trainer):
        if not os.access(tool, os.X_OK):
            sys.stderr.write(f"run_scaling.py: {tool} is not built\n")
            return 1
    dirs = []
    for n in a.ranks:
        out = os.path.abspath(os.path.join(a.out, f"ranks-{n}"))
        # A fresh folder: the trainer would resume from checkpoints a previous run left there.
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        cmd = [ddprun, "--nproc-per-node", str(n), "--", trainer, "--out-dir", out] + trainer_args
        print(f"run_scaling.py: {n} rank(s): {' '.join(cmd)}", flush=True)
        env = dict(os.environ)
        if a.threads_per_rank > 0:
            env["OMP_NUM_THREADS"] = str(a.threads_per_rank)
        start = time.monotonic()
        with open(os.path.join(out, "stdout.log"), "w", encoding="utf-8") as log:
            # Conditions of the run: timings mean little without them.
            log.write(f"# {' '.join(cmd)}\n# {os.cpu_count()} CPUs, load average at start "
                      f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}, OMP_NUM_THREADS="
                      f"{env.get('OMP_NUM_THREADS', 'unset')}\n")
            log.flush()
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
        print(f"run_scaling.py: {n} rank(s) took {time.monotonic() - start:.1f} s, exit code {rc}",
              flush=True)
        if rc != 0:
            sys.stderr.write(open(os.path.join(out, "stdout.log"), encoding="utf-8").read()[-3000:])
            return 1
        if not os.path.isfile(os.path.join(out, "metrics.csv")):
            sys.stderr.write(f"run_scaling.py: the trainer wrote no {out}/metrics.csv\n")
            return 1
        # Keep the numbers, not the models.
        for name in os.listdir(out):
            if name not in ("metrics.csv", "stdout.log"):
                path = os.path.join(out, name)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        dirs.append(out)
    if a.plots:
        return subprocess.run([sys.executable, os.path.join(HERE, "plot_metrics.py"), "--out", a.plots]
                              + dirs).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
