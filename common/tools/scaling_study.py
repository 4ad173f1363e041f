#!/usr/bin/env python3
"""Exercise 02's scaling study on this machine: the solution on 1, 2, 4 ... ranks started by
ddprun, for strong scaling (the same global batch for every rank count) and weak scaling (the
same batch per rank), all runs' results in ONE CSV, then (optionally) the plots.

  scaling_study.py --bin BUILD/bin --data DIR --out DIR [--ranks 1 2 4] [--modes strong weak]
                   [--global-batch 64] [--batch-per-rank 16] [--threads-per-rank 1]
                   [--plots PLOTDIR] [--label TEXT] [-- TRAINER ARGS]

OUT/scaling.csv gets one row per run (the trainer's --summary-csv; started afresh), with the
label "<mode>-<ranks>"; OUT/<mode>-<ranks>/ keeps each run's output (stdout.log). Everything
after `--` goes to every run of the trainer, e.g. `-- --max-steps 30 --target-acc 0.5`.
The same study on a cluster, with srun on 1, 2, 4, 8 ... GPUs, is
sbatch/02-resnet-cifar10-ddp/scaling.sbatch; both write the same CSV for
slides/tools/plot_scaling.py.

Each rank gets --threads-per-rank CPU threads (default 1: one core per rank, the CPU analogue
of one GPU per rank). On a machine with fewer cores than ranks the ranks share cores and the
efficiency says more about the machine than about the program: the CSV's rows say how many
ranks ran, and a run of record says on which machine (slides/results/scaling/README.md).
"""
import argparse
import csv
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PLOT = os.path.join(ROOT, "slides", "tools", "plot_scaling.py")


def fail(message):
    sys.stderr.write(f"scaling_study.py: {message}\n")
    return 1


def rows_of(path):
    if not os.path.exists(path):
        return 0
    with open(path, newline="", encoding="utf-8") as f:
        return sum(1 for _ in csv.DictReader(f))


def run_once(bin_dir, trainer, ranks, run_dir, table, args, env):
    """One run of `trainer` on `ranks` ranks under ddprun, its output in run_dir/stdout.log; it
    must append one row to the CSV `table` (--summary-csv), which is returned as a dict. Raises
    RuntimeError with one line when the run fails. Also used by tests/bench/bench_images.py."""
    cmd = [os.path.join(bin_dir, "ddprun"), "--nproc-per-node", str(ranks), "--",
           os.path.join(bin_dir, trainer), "--out-dir", run_dir, "--summary-csv", table] + args
    before = rows_of(table)
    log_path = os.path.join(run_dir, "stdout.log")
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("# " + " ".join(cmd) + "\n")
        log.flush()
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        sys.stderr.write(open(log_path, encoding="utf-8").read()[-2000:])
        raise RuntimeError(f"{' '.join(cmd)} failed (exit code {rc}); its output: {log_path}")
    if rows_of(table) != before + 1:
        raise RuntimeError(f"{trainer} added no row to {table} (--summary-csv); see {log_path}")
    with open(table, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))[-1]


def split_trainer_args(argv):
    """(our arguments, the trainer's): everything after a "--" goes to the trainer."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def main(argv):
    argv, trainer_args = split_trainer_args(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", required=True, help="the build's bin/ folder (ddprun, the trainer)")
    p.add_argument("--data", required=True, help="the CIFAR-10 folder (data_batch_*.bin)")
    p.add_argument("--out", required=True)
    p.add_argument("--trainer", default="ex02-solution")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--modes", nargs="+", default=["strong", "weak"], choices=["strong", "weak"])
    p.add_argument("--global-batch", type=int, default=64, help="strong scaling's global batch")
    p.add_argument("--batch-per-rank", type=int, default=16, help="weak scaling's batch per rank")
    p.add_argument("--threads-per-rank", type=int, default=1,
                   help="OMP_NUM_THREADS of every rank; 0 leaves the kit's default")
    p.add_argument("--plots", help="also draw the plots into this folder")
    p.add_argument("--label", default="", help="the machine and date, for the plots' titles")
    a = p.parse_args(argv[1:])

    ddprun, trainer = os.path.join(a.bin, "ddprun"), os.path.join(a.bin, a.trainer)
    for tool in (ddprun, trainer):
        if not os.access(tool, os.X_OK):
            return fail(f"{tool} is not built")
    if min(a.ranks) < 1 or a.global_batch < 1 or a.batch_per_rank < 1:
        return fail("--ranks, --global-batch and --batch-per-rank must be 1 or more")
    if "strong" in a.modes:
        bad = [n for n in a.ranks if a.global_batch % n]
        if bad:
            return fail(f"--global-batch {a.global_batch} is not divisible by {bad[0]} ranks: "
                        "strong scaling keeps the global batch, so every rank count must divide it")

    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    table = os.path.join(out, "scaling.csv")
    if os.path.exists(table):
        os.remove(table)  # one study, one CSV: the trainer appends to it
    env = dict(os.environ)
    if a.threads_per_rank > 0:
        env["OMP_NUM_THREADS"] = str(a.threads_per_rank)
    for mode in a.modes:
        for n in a.ranks:
            label = f"{mode}-{n}"
            run_dir = os.path.join(out, label)
            shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run, not a resumed one
            os.makedirs(run_dir)
            batch = (["--global-batch", str(a.global_batch)] if mode == "strong"
                     else ["--batch-size", str(a.batch_per_rank)])
            print(f"scaling_study.py: {label}: {n} rank(s)", flush=True)
            try:
                run_once(a.bin, a.trainer, n, run_dir, table,
                         ["--data-dir", a.data, "--run-label", label] + batch + trainer_args, env)
            except RuntimeError as e:
                return fail(str(e))
            # Keep the numbers, not the models.
            for name in os.listdir(run_dir):
                if name != "stdout.log":
                    path = os.path.join(run_dir, name)
                    shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    print(f"scaling_study.py: {rows_of(table)} runs in {table}", flush=True)
    if a.plots:
        return subprocess.run([sys.executable, PLOT, "--out", a.plots, "--label", a.label, table]
                              ).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
