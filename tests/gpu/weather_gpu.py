#!/usr/bin/env python3
"""Exercise 06 on one GPU: what the CPU machine of CI cannot show (tests/gpu/run.sh runs it).

  * every precision trains: fp32, TF32, bf16 (on a GPU of compute capability 8.0 or more) and fp16
    with its gradient scaler (--clip-grad 1: the scaler unscales before clipping), each for the
    same steps; every loss finite, and u10's RMSE within AMP_TOL (fp16, bf16) or TF32_TOL of the
    fp32 run's;
  * autocast is on: every training forward's output is float16 / bfloat16 (the run trace,
    KIT_TRACE_DIR, as `kit check` reads it);
  * the loader's copies: with --workers and a profile, the batches travel from pinned memory
    ("Memcpy HtoD (Pinned -> Device)" in the Kineto trace) on a stream other than the kernels';
  * the profile holds GPU kernels, and the top-kernels table is printed.

Prints one line per check and a summary; exit 1 when one fails. Written where no GPU was
available (the kit's CI): its first run on a GPU is its test.

usage: weather_gpu.py SOLUTION MAKE_WEATHER WORK
"""
import glob
import json
import math
import os
import re
import subprocess
import sys

AMP_TOL = 0.15  # relative, u10's RMSE after 40 steps: bf16 and fp16 round activations
TF32_TOL = 0.05
FIELDS = ["--channels", "20", "--lat", "64", "--lon", "128", "--steps", "120",
          "--train-files", "2", "--valid-files", "1", "--seed", "11"]
MODEL = ["--patch-size", "8", "--embed-dim", "256", "--depth", "6", "--heads", "8",
         "--batch-size", "16", "--valid-samples", "64", "--epochs", "1", "--max-steps", "40",
         "--seed", "5"]
FINAL = re.compile(r"final valid loss ([0-9.naif]+), u10 RMSE ([0-9.naif]+)")
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def train(solution, data, work, name, flags):
    out = os.path.join(work, name)
    trace = os.path.join(out, "trace")
    os.makedirs(trace, exist_ok=True)
    p = subprocess.run([solution, "--data-dir", data, "--out-dir", out] + MODEL + flags,
                       capture_output=True, text=True, timeout=1800,
                       env=dict(os.environ, KIT_TRACE_DIR=trace))
    final = FINAL.search(p.stdout)
    losses, outputs = [], []
    for path in glob.glob(os.path.join(trace, "*.trace")):
        for line in open(path):
            kind, _, fields = line.partition(" ")
            kv = dict(f.split("=", 1) for f in fields.split() if "=" in f)
            if kind == "step":
                losses.append(float(kv["loss"]))
            elif kind == "precision" and kv.get("step") != "0":
                outputs.append(kv.get("output"))
    return {"code": p.returncode, "out": p.stdout, "err": p.stderr, "losses": losses,
            "outputs": outputs, "rmse": float(final.group(2)) if final else math.nan, "dir": out}


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    solution, make_weather, work = argv
    data = os.path.join(work, "fields")
    subprocess.run([make_weather, "--out", data] + FIELDS, check=True, capture_output=True)
    import torch  # the machine's CUDA torch: which GPU, and whether it has bf16
    cc = torch.cuda.get_device_capability(0)
    print(f"GPU: {torch.cuda.get_device_name(0)}, compute capability {cc[0]}.{cc[1]}")

    runs = {"fp32": train(solution, data, work, "fp32", [])}
    runs["tf32"] = train(solution, data, work, "tf32", ["--tf32"])
    runs["fp16"] = train(solution, data, work, "fp16", ["--amp", "fp16", "--clip-grad", "1"])
    if cc[0] >= 8:
        runs["bf16"] = train(solution, data, work, "bf16", ["--amp", "bf16"])
    else:
        bad = train(solution, data, work, "bf16", ["--amp", "bf16"])
        said = [l for l in bad["err"].splitlines() if l.strip()]
        check(bad["code"] != 0 and len(said) == 1 and "use --amp fp16" in said[0],
              f"bf16 on compute capability {cc[0]}.{cc[1]}: one line saying to use fp16: {said}")
    base = runs["fp32"]["rmse"]
    for name, r in runs.items():
        check(r["code"] == 0, f"{name}: the run finishes ({r['err'].strip()[-300:]})")
        check(r["losses"] and all(math.isfinite(x) for x in r["losses"]),
              f"{name}: {len(r['losses'])} finite losses")
        tol = TF32_TOL if name == "tf32" else AMP_TOL
        if name != "fp32":
            check(abs(r["rmse"] - base) <= tol * base,
                  f"{name}: u10 RMSE {r['rmse']:.4f}, fp32's {base:.4f} (within {tol:g})")
    for name, dtype in (("fp16", "Half"), ("bf16", "BFloat16")):
        if name in runs:
            got = set(runs[name]["outputs"])
            check(got == {dtype}, f"{name}: every training forward returned {dtype}: {sorted(got)}")
    check(set(runs["fp32"]["outputs"]) == {"Float"}, "fp32: every forward returned Float")

    # The loader's copies and the profile, on the fastest configuration.
    profile = os.path.join(work, "profile")
    r = train(solution, data, work, "profiled", ["--workers", "8", "--amp", "fp16",
                                                 "--fused-adamw", "--profile-dir", profile,
                                                 "--profile-start", "11", "--profile-steps", "3"])
    check(r["code"] == 0, f"the profiled run finishes ({r['err'].strip()[-300:]})")
    check("top GPU kernels by time" in r["out"], "the top-kernels table is printed")
    try:
        events = json.load(open(os.path.join(profile, "trace.json")))["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        check(False, f"{profile}/trace.json parses as a Chrome trace ({e})")
        events = []
    kernels = [e for e in events if e.get("cat") == "kernel"]
    copies = [e for e in events if "Memcpy HtoD" in str(e.get("name", ""))]
    check(len(kernels) > 0, f"the profile holds {len(kernels)} GPU kernels")
    pinned = [e for e in copies if "Pinned" in e["name"]]
    check(copies and len(pinned) == len(copies),
          f"{len(pinned)} of {len(copies)} host-to-device copies from pinned memory")
    kernel_streams = {e.get("args", {}).get("stream") for e in kernels}
    copy_streams = {e.get("args", {}).get("stream") for e in pinned}
    check(bool(copy_streams) and not copy_streams & kernel_streams,
          f"the batches travel on a stream of their own: copies on {sorted(map(str, copy_streams))}, "
          f"kernels on {sorted(map(str, kernel_streams))}")
    print(f"{len(failures)} failed" if failures else "exercise 06 on the GPU: every check passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
