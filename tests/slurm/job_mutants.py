#!/usr/bin/env python3
"""Typical mistakes in exercise 01's job script (TODOs 14-17), each a small patch on
sbatch/01-transformer-lm-ddp/solution.sbatch, and the TODO that `kit check 01 --job`
(common/tools/check_job.py) must name for it: it must fail exactly that TODO (the "all" row, both
jobs completing, is not constrained). A patch that no longer matches the script exactly once
fails `verify` (test kit.job_mutants_table), so the table cannot rot silently.

usage: job_mutants.py list                   id and TODO, one mutant a line (for CMake)
       job_mutants.py verify                 every patch applies once; every job TODO covered
       job_mutants.py run ID --build DIR --work DIR   apply, check, compare (needs the cluster)
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EX = "01-transformer-lm-ddp"
SCRIPT = os.path.join(ROOT, "sbatch", EX, "solution.sbatch")
GPU_LINES = "CUDA_VISIBLE_DEVICES=$(kit_gpu_ids)\nexport CUDA_VISIBLE_DEVICES\n"

# (id, todo, what, [(old, new), ...])
MUTANTS = [
    ("gres-one", "14", "one GPU per node requested (--gres=gpu:1)",
     [("#SBATCH --gres=gpu:4", "#SBATCH --gres=gpu:1")]),
    ("visible-fixed", "14", "CUDA_VISIBLE_DEVICES=0,1,2,3 written out instead of kit_gpu_ids: "
     "right for 4 GPUs, wrong for any other --gres",
     [(GPU_LINES, "export CUDA_VISIBLE_DEVICES=0,1,2,3\n")]),
    ("visible-one", "14", "CUDA_VISIBLE_DEVICES=0 left from the single-GPU script",
     [(GPU_LINES, "export CUDA_VISIBLE_DEVICES=0\n")]),
    ("port-fixed", "15", "MASTER_PORT=29500, torchrun's default, instead of the job's port",
     [("MASTER_PORT=$(kit_job_port)", "MASTER_PORT=29500")]),
    ("no-export", "15", "MASTER_ADDR and MASTER_PORT set but not exported",
     [("export MASTER_ADDR MASTER_PORT\n", "")]),
    ("ntasks-one-node", "16", "--ntasks=$KIT_TASKS_PER_NODE: the tasks of one node in all",
     [('--ntasks="$KIT_NTASKS"', '--ntasks="$KIT_TASKS_PER_NODE"')]),
    ("one-node", "17", "one node (#SBATCH --nodes=1)",
     [("#SBATCH --nodes=2", "#SBATCH --nodes=1")]),
]
JOB_TODOS = {"14", "15", "16", "17"}


def apply(edits, text):
    for old, new in edits:
        n = text.count(old)
        if n != 1:
            raise SystemExit(f"job_mutants.py: the text to replace occurs {n} times in "
                             f"{SCRIPT}, not once: update tests/slurm/job_mutants.py:\n{old}")
        text = text.replace(old, new)
    return text


def verify():
    text = open(SCRIPT).read()
    for mid, todo, what, edits in MUTANTS:
        if apply(edits, text) == text:
            raise SystemExit(f"job_mutants.py: {mid} changes nothing")
    missing = JOB_TODOS - {m[1] for m in MUTANTS}
    if missing:
        raise SystemExit(f"job_mutants.py: no mutant for TODO(s) {sorted(missing)}")
    print(f"{len(MUTANTS)} job-script mutants apply; TODOs covered: {sorted(JOB_TODOS)}")
    return 0


STUCK = ("NOT DONE AFTER", "sbatch had no answer")  # check_job.py's words for a job Slurm lost


def check_job(build, script, workdir):
    """Runs `kit check 01 --job` (check_job.py) on script; its lines are printed as they come,
    so that a test killed by its CTest timeout still shows how far the check got. Returns
    (exit status, stdout and stderr, TODOs passed, TODOs failed).

    One more try, on a fresh cluster, when a job of the first did not end within
    KIT_SLURM_JOB_TIMEOUT: the trainer cannot cause that (its collectives and its rendezvous
    give up after KIT_TIMEOUT, 60 s, and the job then FAILS), so it is the emulated cluster
    losing the job; the first try's diagnosis stays in the log above."""
    for attempt in (1, 2):
        p = subprocess.Popen([sys.executable, os.path.join(ROOT, "common/tools/check_job.py"),
                              "--exercise", EX, "--script", script,
                              "--program", os.path.join(build, "bin", "ex01-solution"),
                              "--data", os.environ.get("KIT_TEST_DATA",
                                                       os.path.join(build, "data/wikitext-2")),
                              "--cluster", os.path.join(ROOT, "tests/slurm/cluster.sh"),
                              "--workdir", workdir + ("" if attempt == 1 else "-again")],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out = []
        for line in p.stdout:
            print(line, end="", flush=True)
            out.append(line)
        p.wait()
        if attempt == 1 and any(s in l for l in out for s in STUCK):
            print("job_mutants.py: the test cluster did not finish a job (above): "
                  "once more on a fresh cluster", flush=True)
            continue
        break
    rows = dict(l.rstrip("\n").split(": ", 1) for l in out if l.startswith(("passed: ", "failed: ")))
    todos = lambda key: set(rows.get(key, "-").split(",")) - {"-", ""}  # noqa: E731
    return p.returncode, "".join(out), todos("passed"), todos("failed")


def run(mid, build, work):
    m = next((m for m in MUTANTS if m[0] == mid), None)
    if m is None:
        raise SystemExit(f"job_mutants.py: no mutant '{mid}'")
    _, todo, what, edits = m
    os.makedirs(work, exist_ok=True)
    script = os.path.join(work, "run.sbatch")
    with open(script, "w") as f:
        f.write(apply(edits, open(SCRIPT).read()))
    os.chmod(script, 0o755)
    rc, _, _, failed = check_job(build, script, os.path.join(work, "check"))
    got = failed - {"all"}
    ok = rc == 1 and got == {todo}
    print(("ok   " if ok else "FAIL ") + f"mutant {mid} ({what}): check --job fails TODO(s) "
          f"{sorted(got) or '-'}, expected exactly {todo} (exit {rc})")
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("command", choices=["list", "verify", "run"])
    ap.add_argument("id", nargs="?")
    ap.add_argument("--build")
    ap.add_argument("--work")
    a = ap.parse_args()
    if a.command == "list":
        for m in MUTANTS:
            print(m[0], m[1])
        sys.exit(0)
    if a.command == "verify":
        sys.exit(verify())
    if os.geteuid() != 0:
        print("the test cluster needs root; skipping")
        sys.exit(77)
    sys.exit(run(a.id, a.build, a.work))
