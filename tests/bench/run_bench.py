#!/usr/bin/env python3
"""run_bench.py -- the DDP benchmark (issues 2 and 14): runs the configurations, prints the table,
the DDP overhead over the compute floor with its parts, and the C++ / PyTorch ratios with their
spread.

    run_bench.py --bench build/bin/bench_ddp --ddprun build/bin/ddprun --data build/data/wikitext-2
    (or: cmake --build build --target bench)
    --vocab 33278 instead of --data: the real WikiText-2 vocabulary size

Configurations, each run --repeats times, interleaved (repeat 1 of every configuration, then
repeat 2, ...), so that a burst of load on the machine hits all of them alike:
    cpp 2x1 floor (no DDP)  2 ranks x 1 thread computing at once, nothing averaged (--ddp off):
                            the compute floor of the C++ side
    cpp 2x1 overlap         kit::DistributedDataParallel, all-reduce during backward
    cpp 2x1 no-overlap      the teaching variant: one all-reduce per bucket after backward
    py  2x1 floor (no DDP)  the floor of the Python side
    py  2x1 DDP             torch.nn.parallel.DistributedDataParallel (Gloo)
and, unless --no-extra, the single process with 2 threads (cpp 1x2, py 1x2). With --small-batch B
(default 2; 0: none) the first five again at B sequences per rank, where the overhead dominates.

Per configuration the table gives the median over the repeats of each run's median step. The
overhead of DDP is, per repeat, its step time minus the floor of the same repeat and side; the
ratios C++ / PyTorch (step time, overhead) are taken per repeat, and printed as the median with
the range over the repeats: a ratio whose range includes 1 shows no difference.

With --device cuda (a GPU node): every process on a GPU, NCCL instead of Gloo, --ranks GPU
ranks (default 1: kit DDP and torch DDP each on a world of one GPU, the floor one process
without DDP), one intra-op thread per process on both sides. On a GPU both implementations
report the tail as the wait (see bench_ddp.cpp): NCCL's wait() does not block the CPU.

Only the Python standard library here; the torch side runs under --python (the bench target passes
the Python whose torch is the build's LibTorch).
Threads: OMP_NUM_THREADS and --threads are set to the same value for both implementations.
Memory: the kit keeps freed memory in the process (glibc's mallopt, set by setup():
common/kit/runtime/process.cpp); the Python runs get the same two settings through glibc's
MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_, so that the ratios compare C++ with Python, not
two allocator settings. BENCH_MALLOC=default runs both sides with glibc's defaults.
Each batch ends with issue 14's goals, judged repeat by repeat ("met in every repeat", "met by the
median only (k of n repeats)", "not met"): the kit's step at most 0.95x PyTorch's, and its DDP
overhead at most PyTorch's.
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

# The kit's allocator settings (kit/runtime/process.cpp, 1 GiB each) for both sides; or glibc's
# defaults for both (the kit's own switch is KIT_MALLOC=default).
if os.environ.get("BENCH_MALLOC") == "default":
    MALLOC_ENV = {"KIT_MALLOC": "default"}
else:
    MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}

HERE = os.path.dirname(os.path.abspath(__file__))


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return float("nan")


# Issue 14's goal for the step time: the kit's at most this fraction of PyTorch's.
GOAL = 0.95


def goal_verdict(values, limit, repeats):
    """Whether per-repeat values stay at or below limit: in every repeat, by the median only, or not."""
    met = sum(1 for v in values if v <= limit)
    if met == len(values):
        return "met in every repeat (%d of %d)" % (met, repeats)
    if statistics.median(values) <= limit:
        return "met by the median only (%d of %d repeats)" % (met, repeats)
    return "not met (%d of %d repeats)" % (met, repeats)


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
    ap.add_argument("--python", default=sys.executable,
                    help="python whose torch is the C++ side's LibTorch (default: this one)")
    ap.add_argument("--steps", type=int, default=int(os.environ.get("BENCH_STEPS", 30)))
    ap.add_argument("--warmup", type=int, default=int(os.environ.get("BENCH_WARMUP", 5)))
    ap.add_argument("--repeats", type=int, default=int(os.environ.get("BENCH_REPEATS", 5)))
    ap.add_argument("--small-batch", type=int, default=int(os.environ.get("BENCH_SMALL_BATCH", 2)),
                    help="also run floor and DDP at this batch per rank (0: do not)")
    ap.add_argument("--no-extra", action="store_true", help="without the single-process runs")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run before giving up")
    ap.add_argument("--log", default="", help="append every BENCH line to this file")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cpu: Gloo ranks on the CPU; cuda: one GPU per rank, NCCL")
    ap.add_argument("--ranks", type=int, default=0,
                    help="DDP ranks (default: 2 on the CPU, 1 on GPUs; at most one per GPU)")
    args = ap.parse_args()
    ranks = args.ranks or (1 if args.device == "cuda" else 2)

    vocab_cmd = [args.bench, "--print-vocab"] + (["--data", args.data] if args.data else [])
    vocab = args.vocab or int(subprocess.run(vocab_cmd, check=True, capture_output=True, text=True).stdout.split()[-1])
    py = [args.python, os.path.join(HERE, "bench_ddp.py")]
    common = ["--vocab", str(vocab), "--steps", str(args.steps), "--warmup", str(args.warmup),
              "--device", args.device]
    ddp_n = [args.ddprun, "--nproc-per-node", str(ranks), "--"]
    # The DDP runs ask for DDP even on a world of one (a single GPU rank).
    ddp_on = ["--ddp", "on"]

    # Configurations by role, for the default batch and (--small-batch) a small one. On the CPU:
    # `ranks` processes x 1 thread ("cpp 2x1 overlap"), and the single process with `ranks` threads
    # ("cpp 1x2"); on GPUs one thread per process ("cpp 1 GPU overlap").
    if args.device == "cpu":
        shape, base_threads, rank_threads = "%dx1" % ranks, ranks, 1
        name = shape
    else:
        shape, base_threads, rank_threads = "%d GPU" % ranks, 1, 1
        name = "gpu%d" % ranks
    bt, rt = str(base_threads), str(rank_threads)
    # The compute floor: every rank computes exactly as under DDP (same ranks, threads, batch,
    # all at once), but nothing is averaged: --ddp off. On one GPU rank, that is one process.
    floor_cmd = ddp_n if ranks > 1 else []
    cpu = args.device == "cpu"

    def configs_for(batch):
        tag = "" if batch == 0 else " b%d" % batch
        opts = common + (["--batch", str(batch)] if batch else [])
        out = [
            ("floor_cpp", "cpp %s floor (no DDP)%s" % (shape, tag), rank_threads,
             floor_cmd + [args.bench, "--threads", rt, "--ddp", "off", "--name", "cpp%s-floor" % name] + opts),
            ("overlap", "cpp %s overlap%s" % (shape, tag), rank_threads,
             ddp_n + [args.bench, "--threads", rt, "--overlap", "1", "--name", "cpp%s-overlap" % name]
             + ddp_on + opts),
            ("no_overlap", "cpp %s no-overlap%s" % (shape, tag), rank_threads,
             ddp_n + [args.bench, "--threads", rt, "--overlap", "0", "--name", "cpp%s-no-overlap" % name]
             + ddp_on + opts),
            ("floor_py", "py %s floor (no DDP)%s" % (shape, tag), rank_threads,
             floor_cmd + py + ["--threads", rt, "--ddp", "off", "--name", "py%s-floor" % name] + opts),
            ("py_ddp", "py %s DDP%s" % (shape, tag), rank_threads,
             ddp_n + py + ["--threads", rt, "--name", "py%s-ddp" % name] + ddp_on + opts),
        ]
        if cpu and not args.no_extra and batch == 0:
            # One process with all the cores: what DDP on this machine is up against.
            out += [("base", "cpp 1x%d (no DDP)" % ranks, base_threads,
                     [args.bench, "--threads", bt, "--ddp", "off", "--name", "cpp1x%s" % bt] + opts),
                    ("py_base", "py 1x%d (no DDP)" % ranks, base_threads,
                     py + ["--threads", bt, "--ddp", "off", "--name", "py1x%s" % bt] + opts)]
        return out

    groups = [(0, configs_for(0))]
    if args.small_batch:
        groups.append((args.small_batch, configs_for(args.small_batch)))
    configs = [(label, threads, cmd) for _, group in groups for _, label, threads, cmd in group]
    role_of = [{r: label for r, label, _, _ in group} for _, group in groups]
    role = role_of[0]

    results = {label: [] for label, _, _ in configs}
    loads = []
    print("DDP benchmark: vocab %d, %d timed steps after %d warm-up, %d repeats, %d cores, load %.2f%s"
          % (vocab, args.steps, args.warmup, args.repeats, os.cpu_count() or 0, loadavg(),
             ", %d GPU rank(s)" % ranks if args.device == "cuda" else ""), flush=True)
    print("malloc: %s" % ("glibc's defaults on both sides (BENCH_MALLOC=default)"
                          if "KIT_MALLOC" in MALLOC_ENV else
                          "the kit's settings on both sides (freed memory stays in the process)"),
          flush=True)
    for r in range(args.repeats):
        for label, threads, cmd in configs:
            env = dict(os.environ, OMP_NUM_THREADS=str(threads))
            env.update(MALLOC_ENV)
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

    def values(label, key):
        return [float(f[key]) for f in results[label]]

    def med(label, key):
        return statistics.median(values(label, key))

    def spread(v, fmt="%.0f"):
        return (fmt + " to " + fmt) % (min(v), max(v))

    def allr_rate(label):
        """MiB/s of the gradient all-reduce: gradient bytes over its wall time (0: no time)."""
        ms = med(label, "reduce_ms_median")
        return med(label, "reduce_bytes") / 1048576 / (ms / 1e3) if ms > 0 else 0

    def ratio(a, b):
        return [x / y for x, y in zip(a, b)]

    params = {label: results[label][0]["params"] for label in results}
    cpp_params, py_params = params[role["overlap"]], params[role["py_ddp"]]
    print()
    print("parameters: C++ TransformerLM %s, Python TransformerLM %s -> %s"
          % (cpp_params, py_params, "same" if cpp_params == py_params else "DIFFERENT"))
    print("buckets (MiB, launch order, after the first step's rebuild): C++ %s | torch DDP %s"
          % (results[role["overlap"]][0]["buckets"], results[role["py_ddp"]][0]["buckets"]))
    print("machine load (1-min average) during the runs: median %.1f, range %.1f-%.1f, on %d cores"
          % (statistics.median(loads), min(loads), max(loads), os.cpu_count() or 0))
    print()
    head = "%-30s %8s %11s %7s %7s %7s %7s %7s %8s %8s %8s %7s %9s" % (
        "config", "step ms", "(range)", "fwd ms", "bwd ms", "wait ms", "tail ms", "copy ms",
        "allr ms", "allr MB/s", "loop MB/s", "cpu ms", "samples/s")
    print(head)
    print("-" * len(head))
    for label, _, _ in configs:
        ddp = results[label][0]["ddp"] == "1"
        opt = lambda key, fmt="%.1f": fmt % med(label, key) if ddp else "-"  # noqa: E731
        print("%-30s %8.1f %11s %7.1f %7.1f %7s %7s %7s %8s %8s %8s %7.1f %9.1f" % (
            label, med(label, "step_ms_median"), spread(values(label, "step_ms_median")),
            med(label, "fwd_ms_median"), med(label, "bwd_ms_median"), opt("wait_ms_median"),
            opt("tail_ms_median"), opt("copy_ms_median", "%.2f"), opt("reduce_ms_median"),
            "%.0f" % allr_rate(label) if ddp else "-", opt("loopback_mb_per_s", "%.0f"),
            med(label, "cpu_ms_median"), med(label, "samples_per_s")))

    print()
    for (batch, _), rl in zip(groups, role_of):
        per = lambda r, key="step_ms_median": values(rl[r], key)  # noqa: E731
        over_cpp = [d - f for d, f in zip(per("overlap"), per("floor_cpp"))]
        over_no = [d - f for d, f in zip(per("no_overlap"), per("floor_cpp"))]
        over_py = [d - f for d, f in zip(per("py_ddp"), per("floor_py"))]
        print("batch %s per rank: DDP overhead = step time - floor (median, range over %d repeats)"
              % (batch or results[rl["overlap"]][0]["batch"], args.repeats))
        print("  floor        C++ %.1f ms (%s), PyTorch %.1f ms (%s)"
              % (med(rl["floor_cpp"], "step_ms_median"), spread(per("floor_cpp")),
                 med(rl["floor_py"], "step_ms_median"), spread(per("floor_py"))))
        print("  overhead     C++ overlap %.1f ms (%s), C++ no-overlap %.1f ms (%s), PyTorch %.1f ms (%s)"
              % (statistics.median(over_cpp), spread(over_cpp, "%.1f"), statistics.median(over_no),
                 spread(over_no, "%.1f"), statistics.median(over_py), spread(over_py, "%.1f")))
        print("  its parts    copy in/out: C++ %.2f ms, PyTorch %.2f ms (estimate: its copies replayed)"
              % (med(rl["overlap"], "copy_ms_median"), med(rl["py_ddp"], "copy_ms_median")))
        print("               wait after backward: C++ %.1f ms (tail %.1f), PyTorch tail %.1f ms"
              % (med(rl["overlap"], "wait_ms_median"), med(rl["overlap"], "tail_ms_median"),
                 med(rl["py_ddp"], "tail_ms_median")))
        mb = med(rl["overlap"], "reduce_bytes") / 1048576
        for side in ("overlap", "no_overlap", "py_ddp"):
            print("               all-reduce %-11s %.1f ms for %.2f MiB = %.0f MiB/s; Gloo alone, same run: %.1f ms = %.0f MiB/s"
                  % (side.replace("_", "-").replace("py-ddp", "PyTorch") + ":",
                     med(rl[side], "reduce_ms_median"), mb, allr_rate(rl[side]),
                     med(rl[side], "loopback_ms_median"), med(rl[side], "loopback_mb_per_s")))
        ratios = [
            ("step time, overlap", ratio(per("overlap"), per("py_ddp"))),
            ("step time, no-overlap", ratio(per("no_overlap"), per("py_ddp"))),
            ("floor", ratio(per("floor_cpp"), per("floor_py"))),
            ("CPU time per step", ratio(per("overlap", "cpu_ms_median"), per("py_ddp", "cpu_ms_median"))),
        ]
        # A ratio of overheads means something only when both overheads stood out of the noise.
        overheads_clear = min(over_py) > 0 and min(over_cpp) > 0
        if overheads_clear:
            ratios.append(("DDP overhead, overlap", ratio(over_cpp, over_py)))
        for what, v in ratios:
            m = statistics.median(v)
            verdict = ("C++ lower in every repeat" if max(v) < 1 else "C++ higher in every repeat"
                       if min(v) > 1 else "no difference shown (the range includes 1)")
            print("  C++ / PyTorch %-22s %.3f (range %s): %s" % (what, m, spread(v, "%.3f"), verdict))
        if not overheads_clear:
            print("  C++ / PyTorch DDP overhead: no ratio (an overhead was 0 or less in a repeat: "
                  "within the noise of the floor)")
        # Issue 14's goals, judged repeat by repeat: the kit's step at most GOAL x PyTorch's, and
        # its DDP overhead at most PyTorch's.
        for what, v in ratios[:2]:
            print("  goal: C++ %-22s <= %.2f x PyTorch's: %s"
                  % (what, GOAL, goal_verdict(v, GOAL, args.repeats)))
        # The overheads are compared by their difference within each repeat: a ratio of two
        # overheads of a few ms, each the difference of two noisy step times, swings far more.
        gap = [c - p for c, p in zip(over_cpp, over_py)]
        print("  goal: C++ DDP overhead (overlap) <= PyTorch's: %s (difference C++ - PyTorch: "
              "median %+.1f ms, range %s)"
              % (goal_verdict(gap, 0, args.repeats), statistics.median(gap), spread(gap, "%+.1f")))
        print()
    if args.device == "cpu":
        print("wait ms: C++ DDPStats wait after backward; Python: tail ms (torch DDP has no such counter).")
    else:
        print("wait ms: tail ms on both sides (on a GPU, NCCL's wait() does not block the CPU).")
    print("tail ms: last parameter gradient produced -> backward() returns (same definition both sides).\n"
          "copy ms: C++ DDPStats (into buckets only; .grad is a window on the bucket); Python: torch DDP's\n"
          "  copies in and out, replayed on the run's gradients (an estimate).\n"
          "allr ms: first bucket all-reduce started -> last one finished (C++ DDPStats, torch's\n"
          "  backward_comm_time), overlapped backward included; allr MB/s: gradient bytes / allr ms;\n"
          "  loop MB/s: one all-reduce of the same bytes alone, after the timed steps of the same run.\n"
          "cpu ms: process CPU time per step (all threads), mean of the ranks; step ms: slowest rank.")
    if args.device == "cuda":
        print("GPU runs: the clock is read after torch.cuda.synchronize() / torch::cuda::synchronize(),"
              " so fwd/bwd/step ms are GPU times.")
    return 0 if cpp_params == py_params else 1


if __name__ == "__main__":
    sys.exit(main())
