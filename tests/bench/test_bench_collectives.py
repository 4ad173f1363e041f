#!/usr/bin/env python3
"""Tests of the collectives benchmark (common/bench/bench_collectives.cpp) and its plot.

  test_bench_collectives.py badinput --bench PROG
      each bad command line (a size that is not a size, one out of range, min above max, an
      unknown collective, a factor below 2) ends within seconds with exactly one line on stderr
      that names the problem, nothing on stdout, and exit code 2
  test_bench_collectives.py smoke --bench PROG --ddprun PROG --plot SCRIPT --work DIR
      2 ranks, 8 B .. 64 KiB: a row per collective and size in the printed table and the CSV,
      sizes as nccl-tests counts them (divisible by the ranks where shares are needed), every
      time above zero, algbw = bytes / time and busbw = algbw x the bus factor of 2 ranks; then
      the plot script fits alpha and beta to it and draws one curve per collective
"""
import argparse
import csv
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from verdict import expect, finish  # noqa: E402

BAD = [
    (["--min-bytes", "abc"], "--min-bytes needs a size"),
    (["--max-bytes", "12X"], "--max-bytes needs a size"),
    (["--max-bytes", ""], "--max-bytes needs a size"),
    (["--min-bytes", "0"], "between 1 byte and 16G"),
    (["--max-bytes", "32G"], "between 1 byte and 16G"),
    (["--max-bytes", "99999999999999G"], "needs a size"),
    (["--min-bytes", "1M", "--max-bytes", "1K"], "larger than --max-bytes"),
    (["--collectives", "allreduce"], "unknown collective 'allreduce'"),
    (["--collectives", "all_reduce,gossip"], "unknown collective 'gossip'"),
    (["--factor", "1"], "--factor needs a whole number in [2, 1024]"),
    (["--iters", "-3"], "--iters needs a whole number"),
    (["--bogus", "1"], "unknown flag '--bogus'"),
]
FACTOR = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "broadcast": 1.0}  # 2 ranks


def badinput(a):
    for args, words in BAD:
        try:
            p = subprocess.run([a.bench] + args, capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            expect(False, f"{' '.join(args)}: ends (it hung for 30 s)")
            continue
        lines = p.stderr.strip().splitlines()
        expect(p.returncode == 2 and len(lines) == 1 and words in lines[0] and not p.stdout,
               f"{' '.join(args) or '(empty)'}: one line naming the problem, exit 2",
               f"exit {p.returncode}, stderr: {p.stderr!r}, stdout: {p.stdout[:200]!r}")


def smoke(a):
    os.makedirs(a.work, exist_ok=True)
    table = os.path.join(a.work, "bench.csv")
    p = subprocess.run([a.ddprun, "--nproc-per-node", "2", "--", a.bench, "--min-bytes", "8",
                        "--max-bytes", "64K", "--factor", "8", "--iters", "3", "--warmup", "1",
                        "--csv", table], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if not expect(p.returncode == 0, "2 ranks, 8 B .. 64 KiB: the run succeeds", p.stdout + p.stderr):
        return
    with open(table, newline="") as f:
        rows = list(csv.DictReader(f))
    sizes = [8 * 8 ** k for k in range(5)]  # 8 B .. 32 KiB: the next, 256 KiB, is past 64 KiB
    want = {(c, s) for c in FACTOR for s in sizes}
    got = {(r["collective"], int(r["bytes"])) for r in rows}
    expect(got == want and len(rows) == len(want), "one CSV row per collective and size "
           "(8 B .. 32 KiB, x8)", f"missing {sorted(want - got)}, extra {sorted(got - want)}")
    printed = [l.split() for l in p.stdout.splitlines() if l.strip() and not l.startswith("#")]
    expect(len(printed) == len(want), "one printed row per collective and size, from rank 0 only",
           p.stdout)
    for r in rows:
        t, b = float(r["time_us"]) * 1e-6, int(r["bytes"])
        algbw, busbw = float(r["algbw_gbps"]), float(r["busbw_gbps"])
        ok = (t > 0 and r["ranks"] == "2" and r["backend"] == "gloo"
              and int(r["elements"]) * 4 == b and int(r["elements"]) % 2 == 0
              and math.isclose(algbw, b / t / 1e9, rel_tol=1e-3)
              and math.isclose(busbw, algbw * FACTOR[r["collective"]], rel_tol=1e-3))
        expect(ok, f"{r['collective']} {b} B: time > 0, algbw = bytes / time, busbw = algbw x "
               f"{FACTOR[r['collective']]}", str(r))
    plots = os.path.join(a.work, "plots")
    p = subprocess.run([sys.executable, a.plot, "--out", plots, "--label", "smoke", table],
                       capture_output=True, text=True, timeout=60)
    fitted = [l for l in p.stdout.splitlines() if " alpha = " in l and " beta = " in l]
    expect(p.returncode == 0 and len(fitted) == 4, "the plot script prints alpha and beta of "
           "each collective", p.stdout + p.stderr)
    svg = open(os.path.join(plots, "collectives-busbw.svg")).read() if p.returncode == 0 else ""
    expect(svg.count("<polyline") == 8 and all(c in svg for c in FACTOR),
           "the plot has a measured and a model curve per collective", svg[:300])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["badinput", "smoke"])
    ap.add_argument("--bench", required=True)
    ap.add_argument("--ddprun")
    ap.add_argument("--plot")
    ap.add_argument("--work")
    a = ap.parse_args()
    badinput(a) if a.mode == "badinput" else smoke(a)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
