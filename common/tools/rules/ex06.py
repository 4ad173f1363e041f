"""Exercise 06 (the weather ViT on one device, made fast one flag at a time): which runs, which
TODO is which, and what each must show.

One process, no ranks (SINGLE_PROCESS: checklib/engine.py runs the student's build and the
solution's alone, every run at once). Each TODO has a run with its flag alone, on top of the
same small run (COMMON: a ViT of embed 32 and depth 2 on generated 4 x 16 x 32 fields, 6 steps),
and "fp32" is the run with no flag: the same program without the optimisation, what each flag's
run is compared with. A TODO passes when its run

  1 (--workers 2)    reads every training and validation sample on a loader thread, never on the
                     training thread, with at least two threads each assembling batches, two
                     batches of different threads being assembled at the same time; fetches
                     batch k + 1 before step k ends (the copy that overlaps step k on a GPU); and
                     has the fp32 run's losses (workers change no number);
  2 (--amp bf16)     has a model output in bfloat16 at every training and validation forward,
                     while the fp32 run has float32 ones; every step's loss, the validation loss
                     and u10's RMSE within BF16_TOL of the fp32 run's; where the run with every
                     flag wrote its profile, its matmuls took bfloat16 inputs;
  3 (--tf32)         has ATen's float32 matmul precision "high" (TF32) at every training forward,
                     the fp32 run "highest";
  4 (--fused-adamw)  steps with kit::FusedAdamW (one fused step a training step), the fp32 run
                     with torch::optim::AdamW (none); its losses within FUSED_TOL of the fp32
                     run's (the same update, to rounding);
  5 (--profile-dir)  writes DIR/trace.json, a Chrome trace (JSON with "traceEvents", ATen
                     operators among them) with exactly the steps asked for marked
                     ProfilerStep#N, prints the top-operators table, and keeps the fp32 run's
                     losses.
Each flag stops a TODO that is not done yet with one line ("--amp: TODO 2 is not done yet"), its
TODO's own ✘; a run that stops at a line of another TODO (Autocast's error names its caller)
leaves this one "not reached". The closing row compares the run with every flag on (RUN_FLAGS)
with the solution's, event by event (checklib/compare.py). What needs a GPU is said, not
passed: pinned memory and the copy's overlap, fp16 with its gradient scaler, TF32's speed."""
import json
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor  # noqa: F401 (the engine runs them at once)

from checklib import compare, engine, stops
from checklib.runs import kv
from checklib.verdicts import CROSS  # noqa: F401

SINGLE_PROCESS = True
NODES_FLAGS = None
# 4 channels on 16 x 32, 2 training files and 1 validation file of 16 steps: 30 training and 15
# validation samples, of which the runs use 24 and 8.
FIELD_FLAGS = ["--channels", "4", "--lat", "16", "--lon", "32", "--steps", "16",
               "--train-files", "2", "--valid-files", "1", "--seed", "3"]
STEPS = 6
# --lr other than AdamW's default (1e-3): options lost on the way to an optimizer show.
COMMON = ["--epochs", "1", "--max-steps", str(STEPS), "--batch-size", "4", "--train-samples",
          "24", "--valid-samples", "8", "--patch-size", "8", "--embed-dim", "32", "--depth", "2",
          "--heads", "2", "--lr", "3e-3", "--seed", "7"]
PROFILE_DIR = "kineto-out"  # relative: inside the run's own folder (its working directory)
PROFILE_START, PROFILE_STEPS = 2, 2  # not the defaults (3 and 3): a fixed window shows
PROFILE_FLAGS = ["--profile-dir", PROFILE_DIR, "--profile-start", str(PROFILE_START),
                 "--profile-steps", str(PROFILE_STEPS)]
FLAGS = {"loader": ["--workers", "2"], "amp": ["--amp", "bf16"], "tf32": ["--tf32"],
         "fused": ["--fused-adamw"], "profile": PROFILE_FLAGS}
FLAG_RUNS = {"fp32": list(COMMON)}
FLAG_RUNS.update({name: COMMON + flags for name, flags in FLAGS.items()})
# The workers' run reads slowly: every HDF5 read 3 ms later (libkit_test_hooks.so,
# common/testing/slow_reads_env.cpp), as from a real file system. The check's fields are so small
# that a worker reads a whole batch in a fraction of a millisecond, and on a busy machine one
# worker then reads everything before the other has started (seen: every batch but the first on
# worker 2); with slow reads the loader is the bottleneck and both workers are busy at once.
READ_DELAY_MS = 3


def slow_reads(check):
    hooks = os.path.join(os.path.dirname(check.tool("ddprun")), "..", "lib", "libkit_test_hooks.so")
    return {"KIT_TEST_READ_DELAY_MS": str(READ_DELAY_MS), "LD_PRELOAD": os.path.abspath(hooks)}


FLAG_ENV = {"loader": slow_reads}
RUN_FLAGS = COMMON + [f for flags in FLAGS.values() for f in flags]
LABELS = {"loader": "1", "amp": "2", "tf32": "3", "fused": "4", "profile": "5"}
# bf16 keeps 8 bits of mantissa: activations rounded to 3 significant digits. Measured on the
# solution (these flags, 2026-11-27): the bf16 run's losses differ from the fp32 run's by at most
# MEASURED relative; the tolerance is five times that. (A run left in fp32 is caught by the dtype,
# not by this.)
BF16_TOL = 0.05
# The fused kernel computes AdamW's update in one expression, torch::optim::AdamW in ten: the same
# numbers to rounding. Measured (the same runs): at most FUSED_MEASURED relative over 6 steps;
# AdamW's default learning rate in place of --lr moves the losses by 1e-2 and more.
FUSED_TOL = 1e-4
# Workers, TF32 on a CPU and the profiler change no number: the losses of those runs are the fp32
# run's (printed with %.9g in the trace), up to this.
SAME_TOL = 1e-6
NOT_DONE = re.compile(r"TODO (\d+) is not done yet")
LOSS_LINE = re.compile(r"train loss ([0-9.]+), valid loss ([0-9.]+), u10 RMSE ([0-9.]+)")
FINAL_LINE = re.compile(r"final valid loss ([0-9.]+), u10 RMSE ([0-9.]+)")
RESULT_LINES = (LOSS_LINE, FINAL_LINE)
TABLE_LINE = re.compile(r"^top operators by self time", re.M)
PLACES = {"init": ("kit::WeatherViT model(", "the line that creates the model"),
          "forward": ("kit::WeatherViT model(", "the model's options"),
          "update": ("const auto adamw =", "the optimizer's options"),
          "final": ("std::tie(valid_loss, rmse) = evaluate(", "the evaluation")}
GPU_NOTES = {
    "loader": "pinned memory, and the next batch's copy overlapping the GPU's work: on a CPU the "
              "batches stay where they are; tests/gpu/run.sh times them on a GPU",
    "amp": "--amp fp16 and its gradient scaler: fp16 autocast is refused on a CPU; the scaler's "
           "logic has unit tests (unit.GradScaler.*), and tests/gpu/run.sh trains with fp16",
    "tf32": "what TF32 does to the step time: only NVIDIA GPUs from Ampere on have it "
            "(tests/gpu/run.sh measures it)",
}


def data_key():
    return FIELD_FLAGS


def prepare_data(check, directory):
    data = os.path.join(directory, "era5")
    return engine.generated_data(data, [check.tool("make_weather"), "--out", data] + FIELD_FLAGS,
                                 "stats/global_means.npy")


# --- what a run left -------------------------------------------------------------------------

def losses(run):
    """Every training step's loss, in order (the trace's step events)."""
    return [float(kv(f)["loss"]) for f in run.events(0, "step")]


def results(run):
    """(valid loss, u10 RMSE) of the last result line, or None."""
    found = [m for m in map(FINAL_LINE.search, run.logs.get(0, "").splitlines()) if m]
    return tuple(map(float, found[-1].groups())) if found else None


def precisions(run, training):
    """(output dtype, matmul precision) of every training forward (training=True) or every
    validation forward."""
    out = []
    for f in run.events(0, "precision"):
        d = kv(f)
        if (d.get("step") != "0") == training:
            out.append((d.get("output"), d.get("matmul")))
    return out


def samples(run, split):
    """[(index, worker, start_ns, end_ns)] of the samples of `split` the run read."""
    out = []
    for f in run.events(0, "sample"):
        name, _, rest = f.partition(" ")
        if name == split:
            d = kv(rest)
            out.append((int(d["index"]), int(d["worker"]), int(d["start_ns"]), int(d["end_ns"])))
    return out


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def worst(mine, theirs):
    """The largest relative difference between two lists of numbers of the same length."""
    return max((relative(a, b) for a, b in zip(mine, theirs)), default=0.0)


# --- each TODO ---------------------------------------------------------------------------------

def stopped(check, concept, run, what, stopped_at):
    """Judges a run that did not finish and returns True; False for a run that did. A "TODO n is
    not done yet" line is TODO n's own ✘; a stop at a line of another TODO leaves this one not
    reached (that TODO gets the ✘, said once, first)."""
    if run.finished():
        return False
    v = check.verdicts
    s = stops.explain(run, check.source, check.args.exercise, {}, v)
    m = NOT_DONE.search(s.how)
    if m and m.group(1) == v.todo(concept):
        v.add(concept, False, what, f"the run stops: {s.how}")
    elif m or (s.todo and s.todo != v.todo(concept)):
        other = m.group(1) if m else s.todo
        stopped_at.setdefault(other, (s.how, s.where))
        v.unreached(concept, what, f"the run stopped in TODO {other}")
    else:
        v.add(concept, False, what, s.how + (f" ({s.where})" if s.where else ""))
    return True


def same_losses(run, baseline, tol, name):
    """Why the run's step losses are not the baseline's within tol, or ""."""
    a, b = losses(run), losses(baseline)
    if len(a) != len(b):
        return f"{len(a)} training steps with {name}, {len(b)} without"
    for k, (x, y) in enumerate(zip(a, b), 1):
        if relative(x, y) > tol:
            return (f"step {k}'s loss is {x:.6f} with {name}, {y:.6f} without (relative "
                    f"difference {relative(x, y):.1e}, more than {tol:g})")
    return ""


def loader_wrong(run, baseline):
    """Why the --workers 2 run does not read in parallel on loader threads, or fetch ahead."""
    for split, name in (("train", "training"), ("valid", "validation")):
        read = samples(run, split)
        if not read:
            return f"no {name} sample was read (the run traced none)"
        on_main = [i for i, w, _, _ in read if w == 0]
        if on_main:
            return (f"{len(on_main)} of the {len(read)} {name} samples were read on the training "
                    f"thread (sample {on_main[0]} first): with --workers 2 the loader's threads "
                    "read them" + (" (both loaders take the options)" if split == "valid" else ""))
    read = samples(run, "train")
    workers = sorted({w for _, w, _, _ in read})
    if len(workers) < 2:
        return (f"every training sample was read by loader thread {workers[0]}: --workers 2 "
                "gives two threads, and only one read")
    if not overlapping_batches(read):
        return ("the loader's threads never assembled two batches at the same time: each waited "
                "for the other")
    order = [(k, f) for k, f in run.traces[0] if k in ("batch", "step")
             and (k == "step" or f.startswith("train "))]
    ahead = fetched_ahead(order)
    if ahead is not None:
        return (f"batch {ahead + 1} was fetched only after step {ahead} ended: nothing was on "
                "its way to the device while the model computed (kit::DeviceBatches fetches the "
                "next batch before handing out the current one)")
    why = same_losses(run, baseline, SAME_TOL, "--workers 2")
    return f"{why}: the workers must not change the batches" if why else ""


def fetched_ahead(order):
    """The first step k (1-based) whose next training batch was fetched after step k ended
    (the trace's "step" comes after the optimizer step), or None when every next batch was on
    its way before."""
    batches = steps = 0
    total_batches = sum(1 for k, _ in order if k == "batch")
    for k, _ in order:
        if k == "batch":
            batches += 1
        else:
            steps += 1
            # before step `steps` ended, batch steps + 1 must have been fetched (if there is one)
            if batches < min(steps + 1, total_batches):
                return steps
    return None


def overlapping_batches(read):
    """Whether two batches of different loader threads were assembled at the same time: each
    thread's samples in runs of one batch (consecutive reads of one thread), as time spans."""
    spans = {}
    for _, w, start, end in read:
        spans.setdefault(w, []).append((start, end))
    batches = []  # (start, end, worker): a thread's consecutive reads with no gap of the others
    events = sorted((start, end, w) for w, s in spans.items() for start, end in s)
    for start, end, w in events:
        if batches and batches[-1][2] == w:
            batches[-1] = (batches[-1][0], max(batches[-1][1], end), w)
        else:
            batches.append((start, end, w))
    for i, (s1, e1, w1) in enumerate(batches):
        for s2, e2, w2 in batches[i + 1:]:
            if w1 != w2 and s2 < e1 and s1 < e2:
                return True
    return False


def judge_loader(check, stopped_at):
    v, (run, _), (base, _) = check.verdicts, check.flag_runs["loader"], check.flag_runs["fp32"]
    what = ("--workers 2: the samples read on two loader threads at once, the next batch fetched "
            "while the model computes, the same losses")
    if stopped(check, "loader", run, what, stopped_at):
        return
    v.add("loader", not (why := loader_wrong(run, base)), what, why)
    v.note("loader", GPU_NOTES["loader"])


def judge_amp(check, stopped_at):
    v, (run, _), (base, _) = check.verdicts, check.flag_runs["amp"], check.flag_runs["fp32"]
    what = (f"--amp bf16: every forward's output in bfloat16 (training and validation), the "
            f"losses and u10's RMSE within {BF16_TOL:g} of the fp32 run's")
    if stopped(check, "amp", run, what, stopped_at):
        return
    why = ""
    train, valid = precisions(run, True), precisions(run, False)
    if not train:
        why = "the model recorded no training forward"
    elif any(o != "BFloat16" for o, _ in train):
        k = next(i for i, (o, _) in enumerate(train, 1) if o != "BFloat16")
        why = (f"training forward {k} returned {train[k - 1][0]}: its matmuls did not run under "
               "autocast (is the Autocast object alive, and named, while the forward runs?)")
    elif not valid or any(o != "BFloat16" for o, _ in valid):
        why = (f"a validation forward returned {next((o for o, _ in valid if o != 'BFloat16'), 'nothing')}: "
               "evaluate() runs without autocast")
    if not why and base.finished():
        plain = [o for o, _ in precisions(base, True) + precisions(base, False)]
        if any(o != "Float" for o in plain):
            why = (f"without --amp a forward returned {next(o for o in plain if o != 'Float')}: "
                   "a run without the flag must stay in fp32 (Autocast takes args.amp)")
        else:
            why = numbers_wrong(run, base, BF16_TOL, "--amp bf16")
    if not why:
        why = profile_dtype_wrong(check)
    v.add("amp", not why, what, why)
    v.note("amp", GPU_NOTES["amp"])


def numbers_wrong(run, base, tol, name):
    why = same_losses(run, base, tol, name)
    if why:
        return why
    a, b = results(run), results(base)
    if a is None or b is None:
        return "no \"final valid loss ..., u10 RMSE ...\" line"
    for what, x, y in zip(("validation loss", "u10 RMSE"), a, b):
        if relative(x, y) > tol:
            return f"the {what} is {x:.5f} with {name}, {y:.5f} without"
    return ""


def profile_dtype_wrong(check):
    """Where the run with every flag wrote its profile: why its matmuls did not take bfloat16
    inputs, or "" (also when there is no profile to read: TODO 5 judges that)."""
    run = check.many
    path = os.path.join(run.dir, PROFILE_DIR, "trace.json")
    if not run.finished() or not os.path.isfile(path):
        return ""
    try:
        events = json.load(open(path)).get("traceEvents", [])
    except (OSError, ValueError):
        return ""
    mm = [e for e in events if e.get("name") in ("aten::mm", "aten::addmm", "aten::bmm",
                                                   "aten::matmul", "aten::linear")]
    if mm and not any("c10::BFloat16" in (e.get("args", {}).get("Input type") or []) for e in mm):
        return (f"the profile of the run with every flag ({PROFILE_DIR}/trace.json) has "
                f"{len(mm)} matmuls and none took bfloat16 inputs")
    return ""


def judge_tf32(check, stopped_at):
    v, (run, _), (base, _) = check.verdicts, check.flag_runs["tf32"], check.flag_runs["fp32"]
    what = ("--tf32: ATen's float32 matmul precision \"high\" (TF32) at every training forward, "
            "\"highest\" without the flag")
    if stopped(check, "tf32", run, what, stopped_at):
        return
    train = precisions(run, True)
    why = ""
    if not train:
        why = "the model recorded no training forward"
    elif any(m != "high" for _, m in train):
        k = next(i for i, (_, m) in enumerate(train, 1) if m != "high")
        why = (f"training forward {k} ran with matmul precision \"{train[k - 1][1]}\": TF32 was "
               "not on while the model trained")
    elif base.finished() and any(m != "highest" for _, m in precisions(base, True)):
        why = ("without --tf32 the matmul precision is \"high\" too: a run without the flag must "
               "stay in full fp32 (set_tf32 takes args.tf32)")
    v.add("tf32", not why, what, why)
    v.note("tf32", GPU_NOTES["tf32"])


def judge_fused(check, stopped_at):
    v, (run, _), (base, _) = check.verdicts, check.flag_runs["fused"], check.flag_runs["fp32"]
    what = (f"--fused-adamw: every step by kit::FusedAdamW, torch::optim::AdamW without the flag, "
            f"the losses within {FUSED_TOL:g} of AdamW's")
    if stopped(check, "fused", run, what, stopped_at):
        return
    fused = [kv(f) for f in run.events(0, "optimizer_step")]
    steps = len(run.events(0, "step"))
    why = ""
    if not fused:
        why = "no step was made by kit::FusedAdamW: the optimizer is not the fused one"
    elif len(fused) != steps:
        why = f"{len(fused)} fused optimizer steps for {steps} training steps"
    elif base.finished() and base.events(0, "optimizer_step"):
        why = ("without --fused-adamw the steps are kit::FusedAdamW's too: a run without the "
               "flag keeps torch::optim::AdamW")
    elif base.finished():
        why = numbers_wrong(run, base, FUSED_TOL, "--fused-adamw")
        if why:
            why += ": the fused step must give AdamW's update (the same options: learning rate, " \
                   "weight decay)"
    v.add("fused", not why, what, why)


def profile_wrong(run, base):
    path = os.path.join(run.dir, PROFILE_DIR, "trace.json")
    if not os.path.isfile(path):
        return (f"no {PROFILE_DIR}/trace.json after a run with --profile-dir {PROFILE_DIR} "
                f"--profile-start {PROFILE_START} --profile-steps {PROFILE_STEPS}")
    try:
        trace = json.load(open(path))
    except (OSError, ValueError) as e:
        return f"{PROFILE_DIR}/trace.json does not parse as JSON ({str(e).splitlines()[0]})"
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        return f"{PROFILE_DIR}/trace.json has no \"traceEvents\" list: not a Chrome trace"
    if not any(str(e.get("name", "")).startswith("aten::") for e in events if isinstance(e, dict)):
        return f"{PROFILE_DIR}/trace.json holds no ATen operator: nothing was recorded"
    marks = sorted({e.get("name") for e in events if isinstance(e, dict)
                    and str(e.get("name", "")).startswith("ProfilerStep#")},
                   key=lambda n: int(n.split("#")[1]))
    want = [f"ProfilerStep#{k}" for k in range(PROFILE_START, PROFILE_START + PROFILE_STEPS)]
    if marks != want:
        return (f"the trace marks {', '.join(marks) or 'no step'}, the flags asked for "
                f"{', '.join(want)}")
    if not TABLE_LINE.search(run.logs.get(0, "")):
        return "no table of the top operators was printed"
    why = same_losses(run, base, SAME_TOL, "--profile-dir") if base.finished() else ""
    return f"{why}: profiling must not change the training" if why else ""


def judge_profile(check, stopped_at):
    v, (run, _), (base, _) = check.verdicts, check.flag_runs["profile"], check.flag_runs["fp32"]
    what = (f"--profile-dir: a Chrome trace of steps {PROFILE_START}-"
            f"{PROFILE_START + PROFILE_STEPS - 1} (ProfilerStep#N) and the top operators printed")
    if stopped(check, "profile", run, what, stopped_at):
        return
    why = profile_wrong(run, base)
    v.add("profile", not why, what, why)


def judge(check):
    v, stopped_at = check.verdicts, {}
    for judge_one in (judge_loader, judge_amp, judge_tf32, judge_fused, judge_profile):
        judge_one(check, stopped_at)
    for todo, (how, where) in stopped_at.items():
        v.add(todo, False, "every run gets to its end", how + (f" ({where})" if where else ""),
              first=True)
    mine, theirs = results(check.many), results(check.reference)
    same = mine is not None and theirs is not None and all(
        math.isclose(a, b, rel_tol=1e-4, abs_tol=2e-5) for a, b in zip(mine, theirs))
    compare.judge_run(check, "your run with every flag on follows the solution's, to the same "
                      "validation loss and u10 RMSE",
                      "" if same else f"final validation loss and u10 RMSE {mine} vs the "
                      f"solution's {theirs}")
