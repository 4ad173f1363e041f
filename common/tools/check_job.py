#!/usr/bin/env python3
"""Check an exercise's Slurm job script by what its jobs DO.

`./kit check EXERCISE --job`: starts the throw-away two-node Slurm of tests/slurm/cluster.sh
(needs root and Debian's Slurm packages), submits the job script twice (as written, and reshaped
to 2 nodes x 2 GPUs), stops the cluster, and judges each job-script TODO: one line per TODO, ✔ or
✘ with the reason. The jobs run the solution's trainer, so only the script is judged. The
details are in common/tools/checklib/job.py.

`./kit check EXERCISE --job-output DIR|JOBID`: judges, with the same code, what one job of a real
cluster left (its .out/.err and run folder); no Slurm, no root. What only a second shape of the
job shows is said to be not judged (common/tools/checklib/job_output.py).

usage: check_job.py --exercise NAME --script FILE --program PROG --data DIR --cluster CLUSTER_SH
                    [--record FILE] [--workdir DIR] [--keep]
       check_job.py --exercise NAME --output DIR|JOBID
Exit status: 0 every TODO judged passes, 1 some fail, 2 something to run it with is missing (or
nothing to judge).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from checklib import job, job_output  # noqa: E402

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exercise", required=True)
    ap.add_argument("--output", metavar="DIR|JOBID",
                    help="judge what this job left (its folder, .out file or job id) instead")
    ap.add_argument("--script", help="the job script to judge")
    ap.add_argument("--program", help="the trainer the jobs run")
    ap.add_argument("--data", help="the data folder the jobs read")
    ap.add_argument("--cluster", help="tests/slurm/cluster.sh")
    ap.add_argument("--record", metavar="FILE", help="add the result to this JSON (kit list)")
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    a = ap.parse_args()
    if a.output is not None:
        sys.exit(job_output.main(a))
    missing = [o for o in ("script", "program", "data", "cluster") if getattr(a, o) is None]
    if missing:
        ap.error("without --output, these are needed: " + ", ".join("--" + o for o in missing))
    sys.exit(job.main(a))
