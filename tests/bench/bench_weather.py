#!/usr/bin/env python3
"""Exercise 06's table of speed-ups: the weather ViT's trainer after each TODO, NERSC's single-GPU
table for this machine.

Each row adds one optimisation to the row above, as NERSC's course adds them: the shipped
exercise (no TODO done: the baseline), then the solution with --workers, --tf32 (GPU only),
--amp bf16, --fused-adamw; on a GPU also fp16 with its gradient scaler in place of bf16. Every
configuration trains the same model on the same generated fields for a fixed number of steps and
prints, from the trainer's own last lines, the median step time, samples/s, the peak of tensor
memory (on a CPU the live CPU tensors, kit/train/memory.h; on a GPU the caching allocator's
peak) and u10's RMSE on the validation fields after those steps. The configurations run
--repeats times, interleaved (repeat 1 of every row, then repeat 2, ...), so that a burst of load
from elsewhere hits all rows alike; the table gives each row's median and the spread (lowest to
highest samples/s). A row that cannot help on this device says so instead of a number.

A benchmark, not a test: nothing asserts a time (`ctest -L bench` runs it in miniature,
bench.weather_smoke).

usage: bench_weather.py --exercise BIN --solution BIN --make-weather BIN --work DIR
                        [--device cpu|cuda] [--steps N] [--repeats R] [--csv FILE] [--profile]
                        [--fields="MAKE_WEATHER FLAGS"] [--model="TRAINER FLAGS"]
                        [-- EXTRA TRAINER FLAGS]
"""
import argparse
import datetime
import os
import re
import shlex
import statistics
import subprocess
import sys

PERF = re.compile(r"performance: (\d+) steps, median step ([0-9.]+) ms, ([0-9.]+) samples/s, "
                  r"peak memory ([0-9.]+) MiB")
FINAL = re.compile(r"final valid loss ([0-9.]+), u10 RMSE ([0-9.]+)")
DEVICE = re.compile(r"^training on (\S+) \((.*)\)$", re.M)

# The fields and the model: NERSC's 20 channels and its model's proportions, scaled to the device.
SHAPES = {
    "cpu": {"fields": ["--channels", "20", "--lat", "32", "--lon", "64", "--steps", "264",
                       "--train-files", "2", "--valid-files", "1", "--seed", "11"],
            "model": ["--patch-size", "8", "--embed-dim", "192", "--depth", "4", "--heads", "4",
                      "--batch-size", "16", "--valid-samples", "64"],
            "workers": "2"},
    "cuda": {"fields": ["--channels", "20", "--lat", "128", "--lon", "256", "--steps", "200",
                        "--train-files", "2", "--valid-files", "1", "--seed", "11"],
             "model": ["--patch-size", "8", "--embed-dim", "384", "--depth", "12", "--heads", "8",
                       "--batch-size", "16", "--valid-samples", "64"],
             "workers": "8"},
}


def configurations(device, workers):
    """(label, which binary, flags, why it is not run here or "") in table order; each row adds
    to the one above it."""
    loader = ["--workers", workers]
    rows = [("baseline (the exercise as shipped)", "exercise", [], ""),
            (f"+ loader: {workers} workers, pinned, batch ahead", "solution", loader, "")]
    if device == "cuda":
        rows.append(("+ TF32 matmuls", "solution", loader + ["--tf32"], ""))
        tf32 = ["--tf32"]
    else:
        rows.append(("+ TF32 matmuls", "solution", loader + ["--tf32"],
                     "GPU only: a CPU has no TF32 (the flag changes nothing here)"))
        tf32 = []
    rows.append(("+ bf16 autocast", "solution", loader + tf32 + ["--amp", "bf16"], ""))
    rows.append(("+ fused AdamW", "solution", loader + tf32 + ["--amp", "bf16", "--fused-adamw"], ""))
    if device == "cuda":
        rows.append(("  fp16 + scaler in place of bf16", "solution",
                     loader + tf32 + ["--amp", "fp16", "--fused-adamw"], ""))
    return rows


def run_one(binary, data, out, flags, steps, extra):
    cmd = [binary, "--data-dir", data, "--out-dir", out, "--epochs", "1", "--max-steps",
           str(steps)] + flags + extra
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"bench_weather: {' '.join(cmd)} failed (exit {p.returncode}):\n"
                         f"{(p.stderr or p.stdout).strip()[-2000:]}")
    perf, final = PERF.search(p.stdout), FINAL.search(p.stdout)
    if not perf or not final:
        raise SystemExit(f"bench_weather: no performance or final line from {' '.join(cmd)}:\n{p.stdout}")
    dev = DEVICE.search(p.stdout)
    return {"step_ms": float(perf.group(2)), "samples_s": float(perf.group(3)),
            "peak_mib": float(perf.group(4)), "rmse": float(final.group(2)),
            "device": dev.group(2) if dev else "?", "stdout": p.stdout}


def main(argv):
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exercise", required=True)
    ap.add_argument("--solution", required=True)
    ap.add_argument("--make-weather", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--csv", help="also write the table's medians and spreads here")
    ap.add_argument("--profile", action="store_true",
                    help="then profile 3 steps of the last row (WORK/profile/trace.json): steps "
                         "11-13, after the warm-up (2-4 for runs of fewer than 14 steps)")
    # One string each, written --fields="--channels 3 ..." (a value that starts with "--").
    ap.add_argument("--fields", help="make_weather's flags in place of the device's, one string")
    ap.add_argument("--model", help="the trainer's model flags in place of the device's, one string")
    a = ap.parse_args(argv)
    shape = SHAPES[a.device]
    fields = shlex.split(a.fields) if a.fields is not None else shape["fields"]
    model = shlex.split(a.model) if a.model is not None else shape["model"]
    batch = model[model.index("--batch-size") + 1] if "--batch-size" in model else "?"
    os.makedirs(a.work, exist_ok=True)
    data = os.path.join(a.work, "fields")
    stamp = os.path.join(data, ".made-by")
    if not os.path.isfile(stamp) or open(stamp).read() != " ".join(fields):
        subprocess.run([a.make_weather, "--out", data] + fields, check=True, capture_output=True)
        with open(stamp, "w") as f:
            f.write(" ".join(fields))
    binaries = {"exercise": a.exercise, "solution": a.solution}
    rows = configurations(a.device, shape["workers"])
    results = {label: [] for label, *_ in rows}
    device_name = "?"
    for r in range(a.repeats):
        for label, which, flags, skip in rows:
            if skip:
                continue
            out = os.path.join(a.work, f"run-{len(results[label])}")
            got = run_one(binaries[which], data, out, flags + model, a.steps, extra)
            device_name = got["device"]
            results[label].append(got)
            print(f"  repeat {r + 1}: {label}: {got['samples_s']:.1f} samples/s", flush=True)

    today = datetime.date.today().isoformat()
    print(f"\nexercise 06, the weather ViT on {device_name} ({a.device}), {today}: {a.steps} steps "
          f"of batch {batch} per run, {a.repeats} repeats interleaved (median, spread of samples/s)")
    print(f"fields: make_weather {' '.join(fields)}; model: {' '.join(model + extra)}")
    head = f"{'configuration':<44} {'samples/s':>10} {'spread':>13} {'step ms':>9} " \
           f"{'peak MiB':>9} {'u10 RMSE':>9} {'speed-up':>9}"
    print(head)
    print("-" * len(head))
    base = None
    table = []
    for label, which, flags, skip in rows:
        if skip:
            print(f"{label:<44} {skip}")
            table.append((label, None))
            continue
        got = results[label]
        sps = statistics.median(g["samples_s"] for g in got)
        row = {"samples_s": sps, "low": min(g["samples_s"] for g in got),
               "high": max(g["samples_s"] for g in got),
               "step_ms": statistics.median(g["step_ms"] for g in got),
               "peak_mib": statistics.median(g["peak_mib"] for g in got),
               "rmse": statistics.median(g["rmse"] for g in got)}
        base = base or sps
        row["speedup"] = sps / base
        table.append((label, row))
        print(f"{label:<44} {sps:>10.1f} {row['low']:>6.1f}-{row['high']:<6.1f} "
              f"{row['step_ms']:>9.1f} {row['peak_mib']:>9.1f} {row['rmse']:>9.4f} "
              f"{row['speedup']:>8.2f}x")
    if a.csv:
        with open(a.csv, "w") as f:
            f.write(f"# exercise 06 bench, {device_name}, {today}, {a.steps} steps, "
                    f"{a.repeats} repeats (tests/bench/bench_weather.py)\n")
            f.write("configuration,samples_s,low,high,step_ms,peak_mib,u10_rmse,speedup,note\n")
            for label, row in table:
                note = next(s for l, _, _, s in rows if l == label)
                if row is None:
                    f.write(f"\"{label.strip()}\",,,,,,,,\"{note}\"\n")
                else:
                    f.write(f"\"{label.strip()}\",{row['samples_s']:.2f},{row['low']:.2f},"
                            f"{row['high']:.2f},{row['step_ms']:.2f},{row['peak_mib']:.1f},"
                            f"{row['rmse']:.4f},{row['speedup']:.3f},\n")
    if a.profile:
        label, which, flags, _ = [r for r in rows if not r[3]][-1]
        out = os.path.join(a.work, "profiled")
        start = 11 if a.steps >= 14 else 2
        got = run_one(binaries[which], data, out, flags + model + [
            "--profile-dir", os.path.join(a.work, "profile"), "--profile-start", str(start),
            "--profile-steps", "3"], max(a.steps, start + 3), extra)
        print(f"\nprofile of \"{label.strip()}\":")
        print("\n".join(l for l in got["stdout"].splitlines()
                        if l.startswith(("profile of", "top ", "  ")) and "samples/s" not in l))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
