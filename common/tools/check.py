#!/usr/bin/env python3
"""Check a trainer build of an exercise by what it DOES, TODO by TODO.

Runs the trainer once alone, once on several ranks of one node (ddprun; Gloo on CPU here, the
GPUs on a cluster node) and once with every rank on a node of its own (rank != local rank), with
the run trace switched on (KIT_TRACE_DIR, see common/kit/check/trace.h), and runs the solution on the
same data and seed. Then it judges every TODO from the traces and the ranks' output, prints one
line per TODO (✔ or ✘ with the reason), closes with a row that compares the run with the
solution's event by event and names where they first part (checklib/compare.py), and exits 1 if
any fails.

This is the one implementation of "student code reaches the same loss and uses every GPU": the
test suite (tests/student, tests/mutations) and `./kit check` all call it.

One engine (common/tools/checklib/: runs, traces, verdicts, build errors, shared judgments)
plus each exercise's rules (common/tools/rules/<target>.py: flags, data, which TODO is which).

usage: check.py --exercise NAME --binary PROG --solution PROG
                (--bin-dir DIR | --ddprun PROG [--make-corpus PROG ...])
                [--source FILE] [--ranks N] [--workdir DIR] [--reference-dir DIR] [--record FILE]
                [--keep] [--core-runs]
       check.py --exercise NAME --explain-build LOG --source FILE
                (the build of FILE failed: show the compiler's first error, name the TODO near it)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from checklib import engine  # noqa: E402
from checklib.verdicts import Verdicts, record  # noqa: E402,F401 (kit list's recorder, tests)

if __name__ == "__main__":
    sys.exit(engine.main(sys.argv[1:], __doc__))
