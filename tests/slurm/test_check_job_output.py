#!/usr/bin/env python3
"""`kit check 01 --job-output` (common/tools/checklib/job_output.py) on jobs of the test cluster
read back as folders, as a student's job on a real cluster leaves them. Each script below is
first checked with `--job` (common/tools/check_job.py: two jobs, with probes); what its job as
written left in its submit folder (ex01-<id>.out/.err, runs/ex01-<id>/) is copied elsewhere and
judged with `./kit check 01 --job-output` there, which must agree with `--job`:
  * solution.sbatch: every TODO passes, as with --job; TODO 14's reshaped half is "not judged";
    the same verdicts from the folder, the .out file, the run folder and the job id;
  * run.sbatch as shipped: fails TODOs 14, 15 and 17, each named on a ✘ row; TODO 16 (one task
    on one GPU of one node is right whatever srun asks) is "not judged", never passed;
  * stage 14 (rendered by stages.py): the same passed and failed TODOs as --job (16 fails: one
    task on a node of 4 GPUs).

usage: test_check_job_output.py --build DIR --work DIR      (exit 77, skipped, when not root)
"""
import os
import shutil
import subprocess
import sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from verdict import expect, finish, root_test_args  # noqa: E402 (tests/support)
from job_mutants import EX, ROOT, check_job  # noqa: E402 (its output streams; see there)


def todos(out, key):
    rows = dict(l.split(": ", 1) for l in out.splitlines() if l.startswith(key + ": "))
    return set(rows.get(key, "-").split(",")) - {"-", ""}


def job_output(where, cwd=None):
    """./kit check 01 --job-output WHERE: (exit status, output, passed, failed, not judged)."""
    p = subprocess.run([os.path.join(ROOT, "kit"), "check", EX[:2], "--job-output", where],
                       capture_output=True, text=True, cwd=cwd, timeout=120)
    out = p.stdout + p.stderr
    print(out, end="", flush=True)
    return p.returncode, out, todos(out, "passed"), todos(out, "failed"), todos(out, "not judged")


def leave(a, script, name):
    """--job on script; then its as-written job's submit folder, copied to WORK/NAME-left (the
    check's own work folder, probes and all, stays behind). Returns (--job's passed, failed,
    the copy, the job id)."""
    rc, _, passed, failed = check_job(a.build, script, os.path.join(a.work, name))
    src = os.path.join(a.work, name, "as-written")
    dst = os.path.join(a.work, name + "-left")
    shutil.copytree(src, dst)
    ids = [f[len("ex01-"):-len(".out")] for f in os.listdir(dst) if f.endswith(".out")]
    expect(rc in (0, 1) and len(ids) == 1, f"{name}: --job ran, its job as written left one .out",
           f"exit {rc}, {sorted(os.listdir(dst))}")
    return passed, failed, dst, (ids or ["?"])[0]


def main():
    a = root_test_args("--build", "--work", why="the test cluster needs root")
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)

    passed, failed, left, jid = leave(a, os.path.join(ROOT, "sbatch", EX, "solution.sbatch"),
                                      "solution")
    expect(passed == {"14", "15", "16", "17", "all"} and not failed,
           "solution: --job passes every TODO", f"passed {passed}, failed {failed}")
    for what, where, cwd in (("its folder", left, None),
                             ("its .out file", os.path.join(left, f"ex01-{jid}.out"), None),
                             ("its run folder", os.path.join(left, "runs", f"ex01-{jid}"), None),
                             ("its job id, from the submit folder", jid, left)):
        rc, out, p, f, nj = job_output(where, cwd)
        expect(rc == 0 and (p, f) == (passed, failed) and nj == {"14"},
               f"solution, from {what}: the verdicts of --job (all pass), TODO 14's reshaped "
               "half not judged", f"exit {rc}, passed {p}, failed {f}, not judged {nj}")

    passed, failed, left, _ = leave(a, os.path.join(ROOT, "sbatch", EX, "run.sbatch"), "shipped")
    expect(failed - {"all"} == {"14", "15", "16", "17"}, "shipped: --job fails TODOs 14-17",
           f"failed {failed}")
    rc, out, p, f, nj = job_output(left)
    crossed = {t for t in ("14", "15", "17") if f"\u2718 TODO {t} " in out}
    expect(rc == 1 and f == {"14", "15", "17"} and crossed == f and "16" in nj and "16" not in p,
           "shipped, from its folder: ✘ on TODOs 14, 15 and 17, each named; TODO 16 not judged "
           "(1 GPU, 1 node), not passed", f"exit {rc}, passed {p}, failed {f}, not judged {nj}")

    stage = os.path.join(a.work, "stage-14")
    subprocess.run([sys.executable, os.path.join(ROOT, "common/tools/stages.py"), "stage", EX,
                    "14", stage], check=True, capture_output=True)
    passed, failed, left, _ = leave(a, os.path.join(stage, "run.sbatch"), "stage-14")
    rc, out, p, f, nj = job_output(left)
    expect(rc == 1 and (p, f) == (passed, failed) and f == {"15", "16", "17"},
           "stage 14, from its folder: the verdicts of --job (passes 14, fails 15, 16, 17)",
           f"exit {rc}, --job: passed {passed} failed {failed}; --job-output: passed {p} "
           f"failed {f}")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
