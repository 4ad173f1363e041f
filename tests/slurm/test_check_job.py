#!/usr/bin/env python3
"""`kit check 01 --job` (common/tools/check_job.py) on exercise 01's job script as shipped, at
every stage 14..17 and as the solution:
  * as shipped: fails TODOs 14, 15, 16 and 17, each by name;
  * stage k (rendered by common/tools/stages.py): passes exactly TODOs 14..k, fails the others;
  * solution.sbatch: passes every TODO (and both jobs complete).
Each check starts and stops its own test cluster (tests/slurm/cluster.sh).

usage: test_check_job.py --build DIR --work DIR      (exit 77, skipped, when not root)
"""
import argparse
import os
import shutil
import subprocess
import sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from verdict import expect, finish  # noqa: E402 (tests/support)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EX = "01-transformer-lm-ddp"
TODOS = ["14", "15", "16", "17"]


def check(a, script, name):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "common/tools/check_job.py"),
                        "--exercise", EX, "--script", script,
                        "--program", os.path.join(a.build, "bin", "ex01-solution"),
                        "--data", os.environ.get("KIT_TEST_DATA",
                                                 os.path.join(a.build, "data/wikitext-2")),
                        "--cluster", os.path.join(ROOT, "tests/slurm/cluster.sh"),
                        "--workdir", os.path.join(a.work, name)], capture_output=True, text=True)
    rows = dict(l.split(": ", 1) for l in p.stdout.splitlines()
                if l.startswith(("passed: ", "failed: ")))
    return p, set(rows.get("passed", "-").split(",")) - {"-"}, \
        set(rows.get("failed", "-").split(",")) - {"-"}




def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("the test cluster needs root; skipping")
        return 77
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    p, passed, failed = check(a, os.path.join(ROOT, "sbatch", EX, "run.sbatch"), "shipped")
    expect(p.returncode == 1 and failed - {"all"} == set(TODOS) and passed - {"all"} == set(),
           "as shipped: fails TODOs 14, 15, 16 and 17", p.stdout + p.stderr)
    for k in (14, 15, 16, 17):
        d = os.path.join(a.work, f"stage-{k}")
        subprocess.run([sys.executable, os.path.join(ROOT, "common/tools/stages.py"), "stage", EX,
                        str(k), d], check=True, capture_output=True)
        p, passed, failed = check(a, os.path.join(d, "run.sbatch"), f"check-{k}")
        want = {t for t in TODOS if int(t) <= k}
        expect(passed - {"all"} == want and failed - {"all"} == set(TODOS) - want and
               "all" in passed, f"stage {k}: passes exactly TODOs 14..{k}, both jobs complete",
               p.stdout + p.stderr)
    p, passed, failed = check(a, os.path.join(ROOT, "sbatch", EX, "solution.sbatch"), "solution")
    expect(p.returncode == 0 and passed == set(TODOS) | {"all"} and not failed,
           "solution.sbatch: every TODO passes", p.stdout + p.stderr)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
