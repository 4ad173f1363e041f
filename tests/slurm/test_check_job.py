#!/usr/bin/env python3
"""`kit check 01 --job` (common/tools/check_job.py) on exercise 01's job script as shipped, at
every stage 14..17 and as the solution:
  * as shipped: fails TODOs 14, 15, 16 and 17, each by name;
  * stage k (rendered by common/tools/stages.py): passes exactly TODOs 14..k, fails the others;
  * solution.sbatch: passes every TODO (and both jobs complete).
Each check starts and stops its own test cluster (tests/slurm/cluster.sh).

usage: test_check_job.py --build DIR --work DIR      (exit 77, skipped, when not root)
"""
import os
import shutil
import subprocess
import sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from verdict import expect, finish, root_test_args  # noqa: E402 (tests/support)
from job_mutants import EX, ROOT, check_job  # noqa: E402 (its output streams; see there)

TODOS = ["14", "15", "16", "17"]


def check(a, script, name):
    return check_job(a.build, script, os.path.join(a.work, name))


def main():
    a = root_test_args("--build", "--work", why="the test cluster needs root")
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    rc, _, passed, failed = check(a, os.path.join(ROOT, "sbatch", EX, "run.sbatch"), "shipped")
    expect(rc == 1 and failed - {"all"} == set(TODOS) and passed - {"all"} == set(),
           "as shipped: fails TODOs 14, 15, 16 and 17", "its output is above")
    for k in (14, 15, 16, 17):
        d = os.path.join(a.work, f"stage-{k}")
        subprocess.run([sys.executable, os.path.join(ROOT, "common/tools/stages.py"), "stage", EX,
                        str(k), d], check=True, capture_output=True)
        rc, _, passed, failed = check(a, os.path.join(d, "run.sbatch"), f"check-{k}")
        want = {t for t in TODOS if int(t) <= k}
        expect(passed - {"all"} == want and failed - {"all"} == set(TODOS) - want and
               "all" in passed, f"stage {k}: passes exactly TODOs 14..{k}, both jobs complete",
               "its output is above")
    rc, _, passed, failed = check(a, os.path.join(ROOT, "sbatch", EX, "solution.sbatch"), "solution")
    expect(rc == 0 and passed == set(TODOS) | {"all"} and not failed,
           "solution.sbatch: every TODO passes", "its output is above")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
