#!/usr/bin/env python3
"""run_bench.py -- the DDP benchmark of issue 2: runs the configurations, prints a table.

    run_bench.py --bench build/bin/bench_ddp --ddprun build/bin/ddprun --data build/data/wikitext-2
    (or: cmake --build build --target bench)
    --vocab 33278 instead of --data: the real WikiText-2 vocabulary size

Configurations (each run --repeats times, interleaved, so that a burst of load on the machine
hits all of them alike; a figure is the median over the repeats of each run's median step):
    cpp 1x2            one process, 2 intra-op threads, no DDP (the baseline)
    cpp 2x1 overlap    2 ranks x 1 thread, kit::DistributedDataParallel, all-reduce during backward
    cpp 2x1 no-overlap 2 ranks x 1 thread, one all-reduce per bucket after backward
    py  2x1 DDP        2 ranks x 1 thread, torch.nn.parallel.DistributedDataParallel (Gloo)
and, unless --no-extra:
    py  1x2            the Python baseline
    cpp 2x1 overlap, head bucket   only when the LM head is larger than 1 MiB: kit DDP with a
                       first bucket large enough for the head, i.e. the first bucket torch's DDP
                       ends up with after its bucket rebuild (see the README)

Only the Python standard library here; the torch side runs under --python (Debian's python3-torch).
Threads: OMP_NUM_THREADS and --threads are set to the same value for both implementations.
Nothing is asserted about times; the exit code is non-zero only if a run fails or the two models
do not have the same number of parameters.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return float("nan")


def parse_bench(output):
    lines = [l for l in output.splitlines() if l.startswith("BENCH ")]
    if len(lines) != 1:
        return None
    return dict(kv.split("=", 1) for kv in lines[0].split()[1:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", required=True, help="the bench_ddp executable")
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--data", default="", help="bundled corpus: sets the vocabulary size")
    ap.add_argument("--vocab", type=int, default=0, help="vocabulary size (default: --data's)")
    ap.add_argument("--python", default="/usr/bin/python3", help="python with torch (Debian's)")
    ap.add_argument("--steps", type=int, default=int(os.environ.get("BENCH_STEPS", 30)))
    ap.add_argument("--warmup", type=int, default=int(os.environ.get("BENCH_WARMUP", 5)))
    ap.add_argument("--repeats", type=int, default=int(os.environ.get("BENCH_REPEATS", 3)))
    ap.add_argument("--no-extra", action="store_true", help="only the 4 configurations of issue 2")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run before giving up")
    ap.add_argument("--log", default="", help="append every BENCH line to this file")
    args = ap.parse_args()

    vocab_cmd = [args.bench, "--print-vocab"] + (["--data", args.data] if args.data else [])
    vocab = args.vocab or int(subprocess.run(vocab_cmd, check=True, capture_output=True, text=True).stdout.split()[-1])
    py = [args.python, os.path.join(HERE, "bench_ddp.py")]
    common = ["--vocab", str(vocab), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    ddp2 = [args.ddprun, "--nproc-per-node", "2", "--"]

    # (label, threads per process, command)
    configs = [
        ("cpp 1x2", 2, [args.bench, "--threads", "2", "--name", "cpp1x2"] + common),
        ("cpp 2x1 overlap", 1, ddp2 + [args.bench, "--threads", "1", "--overlap", "1", "--name", "cpp2x1-overlap"] + common),
        ("cpp 2x1 no-overlap", 1, ddp2 + [args.bench, "--threads", "1", "--overlap", "0", "--name", "cpp2x1-no-overlap"] + common),
        ("py 2x1 DDP", 1, ddp2 + py + ["--threads", "1", "--name", "py2x1-ddp"] + common),
    ]
    if not args.no_extra:
        # The LM head (vocab x (d_model + 1) floats) plus 0.5 MiB: the whole head in bucket 0.
        head_mb = (vocab * 129 * 4) / 1048576 + 0.5
        configs.append(("py 1x2", 2, py + ["--threads", "2", "--name", "py1x2"] + common))
    if not args.no_extra and vocab * (128 + 1) * 4 > 1 << 20:
        # The head does not fit the kit's 1 MiB first bucket (see the README): what a first
        # bucket holding it, as torch's DDP gets after its bucket rebuild, changes.
        configs += [
            ("cpp 2x1 overlap, head bucket", 1,
             ddp2 + [args.bench, "--threads", "1", "--overlap", "1", "--first-bucket-mb",
                     "%.3f" % head_mb, "--name", "cpp2x1-overlap-headbucket"] + common),
        ]

    results = {label: [] for label, _, _ in configs}
    loads = []
    print("DDP benchmark: vocab %d, %d timed steps after %d warm-up, %d repeats, %d cores, load %.2f"
          % (vocab, args.steps, args.warmup, args.repeats, os.cpu_count() or 0, loadavg()), flush=True)
    for r in range(args.repeats):
        for label, threads, cmd in configs:
            env = dict(os.environ, OMP_NUM_THREADS=str(threads))
            loads.append(loadavg())
            t = time.time()
            try:
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                sys.stderr.write("run timed out after %d s: %s\n" % (args.timeout, " ".join(cmd)))
                return 1
            fields = parse_bench(proc.stdout)
            if proc.returncode != 0 or fields is None:
                sys.stderr.write("run failed (%s, exit %d):\n%s\n%s\n" % (label, proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:]))
                return 1
            results[label].append(fields)
            if args.log:
                with open(args.log, "a") as f:
                    f.write("repeat=%d load=%.2f %s\n" % (r, loads[-1], [l for l in proc.stdout.splitlines() if l.startswith("BENCH ")][0]))
            print("  [%d/%d] %-30s step %8.1f ms  (%.0f s)" % (r + 1, args.repeats, label, float(fields["step_ms_median"]), time.time() - t), flush=True)
    loads.append(loadavg())

    def med(label, key):
        return statistics.median(float(f[key]) for f in results[label])

    def spread(label, key):
        v = [float(f[key]) for f in results[label]]
        return "%.0f-%.0f" % (min(v), max(v))

    params = {label: results[label][0]["params"] for label in results}
    cpp_params = params["cpp 2x1 overlap"]
    py_params = params["py 2x1 DDP"]
    print()
    print("parameters: C++ TransformerLM %s, Python TransformerLM %s -> %s"
          % (cpp_params, py_params, "same" if cpp_params == py_params else "DIFFERENT"))
    print("buckets (MiB, launch order): C++ %s | C++ head bucket %s | torch DDP %s"
          % (results["cpp 2x1 overlap"][0]["buckets"],
             results.get("cpp 2x1 overlap, head bucket", [{"buckets": "-"}])[0]["buckets"],
             results["py 2x1 DDP"][0]["buckets"]))
    print("machine load (1-min average) during the runs: median %.1f, range %.1f-%.1f, on %d cores"
          % (statistics.median(loads), min(loads), max(loads), os.cpu_count() or 0))
    print()
    head = "%-30s %10s %9s %8s %8s %8s %8s %9s %10s" % (
        "config", "step ms", "(range)", "fwd ms", "bwd ms", "wait ms", "tail ms", "cpu ms", "samples/s")
    print(head)
    print("-" * len(head))
    for label, _, _ in configs:
        wait = med(label, "wait_ms_median")
        ddp = results[label][0]["ddp"] == "1"
        print("%-30s %10.1f %9s %8.1f %8.1f %8s %8s %9.1f %10.1f" % (
            label, med(label, "step_ms_median"), spread(label, "step_ms_median"),
            med(label, "fwd_ms_median"), med(label, "bwd_ms_median"),
            "%.1f" % wait if ddp else "-", "%.1f" % med(label, "tail_ms_median") if ddp else "-",
            med(label, "cpu_ms_median"), med(label, "samples_per_s")))
    ratio = med("cpp 2x1 overlap", "step_ms_median") / med("py 2x1 DDP", "step_ms_median")
    ratio_cpu = med("cpp 2x1 overlap", "cpu_ms_median") / med("py 2x1 DDP", "cpu_ms_median")
    ratio_no = med("cpp 2x1 no-overlap", "step_ms_median") / med("py 2x1 DDP", "step_ms_median")
    print()
    print("C++ / Python DDP step time (2x1, overlap): %.2f   (no-overlap: %.2f; CPU time per step: %.2f)"
          % (ratio, ratio_no, ratio_cpu))
    print("overlap vs no-overlap (C++ 2x1): step %.1f vs %.1f ms, wait after backward %.1f vs %.1f ms"
          % (med("cpp 2x1 overlap", "step_ms_median"), med("cpp 2x1 no-overlap", "step_ms_median"),
             med("cpp 2x1 overlap", "wait_ms_median"), med("cpp 2x1 no-overlap", "wait_ms_median")))
    print("wait ms: C++ DDPStats wait after backward; Python: tail ms (torch DDP has no such counter)."
          "\ntail ms: last parameter gradient produced -> backward() returns (same definition both sides)."
          "\ncpu ms: process CPU time per step (all threads), mean of the ranks; step ms: slowest rank.")
    return 0 if cpp_params == py_params else 1


if __name__ == "__main__":
    sys.exit(main())
