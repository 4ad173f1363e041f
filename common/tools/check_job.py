#!/usr/bin/env python3
"""Check an exercise's Slurm job script by what its jobs DO (`./kit check EXERCISE --job`).

Starts the throw-away two-node Slurm of tests/slurm/cluster.sh (needs root and Debian's Slurm
packages), submits the job script twice (as written, and reshaped to 2 nodes x 2 GPUs), stops
the cluster, and judges each job-script TODO: one line per TODO, ✔ or ✘ with the reason. The
jobs run the solution's trainer, so only the script is judged. The details are in
common/tools/checklib/job.py.

usage: check_job.py --exercise NAME --script FILE --program PROG --data DIR --cluster CLUSTER_SH
                    [--record FILE] [--workdir DIR] [--keep]
Exit status: 0 every TODO passes, 1 some fail, 2 something to run it with is missing.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from checklib import job  # noqa: E402

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exercise", required=True)
    ap.add_argument("--script", required=True, help="the job script to judge")
    ap.add_argument("--program", required=True, help="the trainer the jobs run")
    ap.add_argument("--data", required=True, help="the data folder the jobs read")
    ap.add_argument("--cluster", required=True, help="tests/slurm/cluster.sh")
    ap.add_argument("--record", metavar="FILE", help="add the result to this JSON (kit list)")
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    sys.exit(job.main(ap.parse_args()))
