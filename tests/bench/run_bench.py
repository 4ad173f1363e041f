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

With --device cuda (a GPU node): every process on a GPU, NCCL instead of Gloo, --ranks GPU
ranks (default 1: kit DDP and torch DDP each on a world of one GPU), one intra-op thread per
process on both sides:
    cpp 1 GPU, no DDP        the baseline
    cpp DDP 1 GPU overlap    kit::DistributedDataParallel (NCCL), all-reduce during backward
    cpp DDP 1 GPU no-overlap one all-reduce per bucket after backward
    py DDP 1 GPU             torch DDP (NCCL, device_ids=[LOCAL_RANK])
and the extras as above. On a GPU both implementations report the tail as the wait (see
bench_ddp.cpp): NCCL's wait() does not block the CPU, so the kit's DDPStats has nothing to say.

Only the Python standard library here; the torch side runs under --python (the bench target passes
the Python whose torch is the build's LibTorch).
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
    ap.add_argument("--python", default=sys.executable,
                    help="python whose torch is the C++ side's LibTorch (default: this one)")
    ap.add_argument("--steps", type=int, default=int(os.environ.get("BENCH_STEPS", 30)))
    ap.add_argument("--warmup", type=int, default=int(os.environ.get("BENCH_WARMUP", 5)))
    ap.add_argument("--repeats", type=int, default=int(os.environ.get("BENCH_REPEATS", 3)))
    ap.add_argument("--no-extra", action="store_true", help="only the 4 configurations of issue 2")
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

    # Labels by role. On the CPU: ranks x 1 thread, the single process with `ranks` threads
    # ("cpp 2x1 overlap", "cpp 1x2"); on GPUs one thread per process ("cpp DDP 1 GPU overlap").
    if args.device == "cpu":
        shape, base_threads, rank_threads = "%dx1" % ranks, ranks, 1
        role = {"base": "cpp 1x%d" % ranks, "overlap": "cpp %s overlap" % shape,
                 "no_overlap": "cpp %s no-overlap" % shape, "py_ddp": "py %s DDP" % shape,
                 "py_base": "py 1x%d" % ranks, "head": "cpp %s overlap, head bucket" % shape}
        name = "%dx1" % ranks
    else:
        shape, base_threads, rank_threads = "%d GPU" % ranks, 1, 1
        role = {"base": "cpp 1 GPU, no DDP", "overlap": "cpp DDP %s overlap" % shape,
                 "no_overlap": "cpp DDP %s no-overlap" % shape, "py_ddp": "py DDP %s" % shape,
                 "py_base": "py 1 GPU, no DDP", "head": "cpp DDP %s overlap, head bucket" % shape}
        name = "gpu%d" % ranks
    bt, rt = str(base_threads), str(rank_threads)

    # (label, threads per process, command)
    configs = [
        (role["base"], base_threads,
         [args.bench, "--threads", bt, "--ddp", "off", "--name", "cpp1x%s" % bt] + common),
        (role["overlap"], rank_threads,
         ddp_n + [args.bench, "--threads", rt, "--overlap", "1", "--name", "cpp%s-overlap" % name]
         + ddp_on + common),
        (role["no_overlap"], rank_threads,
         ddp_n + [args.bench, "--threads", rt, "--overlap", "0", "--name", "cpp%s-no-overlap" % name]
         + ddp_on + common),
        (role["py_ddp"], rank_threads,
         ddp_n + py + ["--threads", rt, "--name", "py%s-ddp" % name] + ddp_on + common),
    ]
    if not args.no_extra:
        # The LM head (vocab x (d_model + 1) floats) plus 0.5 MiB: the whole head in bucket 0.
        head_mb = (vocab * 129 * 4) / 1048576 + 0.5
        configs.append((role["py_base"], base_threads,
                        py + ["--threads", bt, "--ddp", "off", "--name", "py1x%s" % bt] + common))
    if not args.no_extra and vocab * (128 + 1) * 4 > 1 << 20:
        # The head does not fit the kit's 1 MiB first bucket (see the README): what a first
        # bucket holding it, as torch's DDP gets after its bucket rebuild, changes.
        configs += [
            (role["head"], rank_threads,
             ddp_n + [args.bench, "--threads", rt, "--overlap", "1", "--first-bucket-mb",
                      "%.3f" % head_mb, "--name", "cpp%s-overlap-headbucket" % name]
             + ddp_on + common),
        ]

    results = {label: [] for label, _, _ in configs}
    loads = []
    print("DDP benchmark: vocab %d, %d timed steps after %d warm-up, %d repeats, %d cores, load %.2f%s"
          % (vocab, args.steps, args.warmup, args.repeats, os.cpu_count() or 0, loadavg(),
             ", %d GPU rank(s)" % ranks if args.device == "cuda" else ""), flush=True)
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
    cpp_params = params[role["overlap"]]
    py_params = params[role["py_ddp"]]
    print()
    print("parameters: C++ TransformerLM %s, Python TransformerLM %s -> %s"
          % (cpp_params, py_params, "same" if cpp_params == py_params else "DIFFERENT"))
    print("buckets (MiB, launch order): C++ %s | C++ head bucket %s | torch DDP %s"
          % (results[role["overlap"]][0]["buckets"],
             results.get(role["head"], [{"buckets": "-"}])[0]["buckets"],
             results[role["py_ddp"]][0]["buckets"]))
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
    ratio = med(role["overlap"], "step_ms_median") / med(role["py_ddp"], "step_ms_median")
    ratio_cpu = med(role["overlap"], "cpu_ms_median") / med(role["py_ddp"], "cpu_ms_median")
    ratio_no = med(role["no_overlap"], "step_ms_median") / med(role["py_ddp"], "step_ms_median")
    print()
    print("C++ / Python DDP step time (%s, overlap): %.2f   (no-overlap: %.2f; CPU time per step: %.2f)"
          % (shape, ratio, ratio_no, ratio_cpu))
    print("overlap vs no-overlap (C++ %s): step %.1f vs %.1f ms, wait after backward %.1f vs %.1f ms"
          % (shape, med(role["overlap"], "step_ms_median"), med(role["no_overlap"], "step_ms_median"),
             med(role["overlap"], "wait_ms_median"), med(role["no_overlap"], "wait_ms_median")))
    if args.device == "cpu":
        print("wait ms: C++ DDPStats wait after backward; Python: tail ms (torch DDP has no such counter).")
    else:
        print("wait ms: tail ms on both sides (on a GPU, NCCL's wait() does not block the CPU).")
    print("tail ms: last parameter gradient produced -> backward() returns (same definition both sides)."
          "\ncpu ms: process CPU time per step (all threads), mean of the ranks; step ms: slowest rank.")
    if args.device == "cuda":
        print("GPU runs: the clock is read after torch.cuda.synchronize() / torch::cuda::synchronize(),"
              " so fwd/bwd/step ms are GPU times.")
    return 0 if cpp_params == py_params else 1


if __name__ == "__main__":
    sys.exit(main())
