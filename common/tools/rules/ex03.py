"""Exercise 03 (exercise 01's trainer, then ZeRO-1, 2, 3): which runs, which TODO is which, and
the formula.

The engine runs the trainer with --zero-stage 0 (DDP: alone, on N ranks, and the solution as the
reference). judge() then runs it once more on N ranks for each ZeRO stage, and once stopped and
resumed, and the solution once on N ranks for each ZeRO stage (the peaks' reference). Rank 0
prints "parameters P in units u1 u2 ... on N ranks", the epoch and test losses as exercise 01
does, and every rank "rank R: NAME holds params P grads G optimizer O gathered X bytes, peak Y"
(Y: the most bytes of live tensors the rank had during a training step, kit/train/memory.h). A stage
passes when

  * its losses are the solution's DDP losses, each within LOSS_TOL, and
  * every rank holds exactly what the formula says, fp32 with AdamW, padded to N equal shards:
        DDP     params 4P        grads 4P           optimizer 8P
        ZeRO-1  params 4P        grads 4P           optimizer 8 ceil(P/N)
        ZeRO-2  params 4P        grads 4 ceil(P/N)  optimizer 8 ceil(P/N)
        ZeRO-3  params 4 S3      grads 4 S3         optimizer 8 S3,   S3 = sum of ceil(u/N)
    (ZeRO-3 shards each unit on its own) and ZeRO-3's gathered peak is one unit, not the model,
  * and the ranks' peaks are not above the solution's at the same stage and settings by more
    than half a full copy of the weights (PEAK_MARGIN): what a rank holds between steps can be
    the formula's while a full copy of something (the weights, the gradients) lives during the
    step, which only the peak shows.
The formula is computed here from the unit sizes, not read from the program."""
import json
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor

from checklib import compare
from checklib.runs import Locked, Run, read
from rules import ex01

ZERO_FLAGS = ["--epochs", "2", "--max-steps", "3"]
RUN_FLAGS = list(ex01.RUN_FLAGS)
RUN_FLAGS[RUN_FLAGS.index("--epochs"):RUN_FLAGS.index("--epochs") + 2] = ZERO_FLAGS
RUN_FLAGS += ["--zero-stage", "0"]
NODES_FLAGS = None
STOP_AFTER = 4  # the stopped run: after step 4 of 6, in the second epoch
# Each epoch's losses and the test loss are printed with 5 decimals. A ZeRO stage computes the
# same averages as DDP, but a reduce-scatter may add the ranks' gradients in another order than
# an all-reduce: equal up to rounding, so up to 2 units of the last printed digit. Measured
# (the solution, AdamW's default eps, full two-epoch runs on 2, 3 and 4 ranks): the printed
# losses of every stage equal DDP's; the per-step losses in metrics.csv differ by <= 9.5e-7.
LOSS_TOL = 2e-5
RESULT_LINES = ex01.RESULT_LINES
LABELS = {"report": "1", "zero1": "2", "zero2": "3", "zero3": "4", "checkpoint": "5"}
STAGES = {1: "zero1", 2: "zero2", 3: "zero3"}
HELD = re.compile(r"^rank (\d+): (DDP|ZeRO-[123]) holds params (\d+) grads (\d+) optimizer (\d+) "
                  r"gathered (\d+) bytes, peak (\d+)\s*$", re.M)
# The peak check is after full-size copies (4P bytes: the fp32 weights, or their gradients): the
# lowest of the ranks' peaks fails when it is above the highest of the solution's ranks' at the
# same stage by more than PEAK_MARGIN x 4P, half such a copy. Which tensors are alive at a step's
# highest point varies with the timing of the collectives' threads. Measured (the solution, these
# flags, 2 ranks, 8 runs of each stage, 6 of them with the three stages at once as the check runs
# them): the peaks spread over 29656 bytes under ZeRO-1 and -2 (1963764 to 1993420) and 103096
# under ZeRO-3 (1774876 to 1877972: one gathered unit, the output layer, alive a little longer),
# both below the margin (2P = 118618 bytes); a kept copy of the weights adds 237236
# (tests/mutations: zero3-keeps-full-copy, caught at +237236 to +337204 in 3 runs).
PEAK_MARGIN = 0.5
UNITS = re.compile(r"^parameters (\d+) in units([ 0-9]+) on (\d+) ranks\s*$", re.M)
PLACES = {"init": ("kit::TransformerLM model(", "the line that creates the model"),
          "forward": ("kit::TransformerLM model(", "the model's options (dropout, sizes)"),
          "update": ("optimizer.emplace(", "the line that creates the optimizer"),
          "checkpoint": ("trainer.save(", "the checkpoints' save"),
          "final": ("evaluate(model, test_loader", "the final evaluation")}


def data_key():
    return ex01.data_key()


def prepare_data(check, directory):
    return ex01.prepare_data(check, directory)


def formula(name, units, n):
    """(params, grads, optimizer) bytes per rank under `name` for these unit sizes on n ranks."""
    P = sum(units)
    S = math.ceil(P / n)
    S3 = sum(math.ceil(u / n) for u in units)
    return {"DDP": (4 * P, 4 * P, 8 * P), "ZeRO-1": (4 * P, 4 * P, 8 * S),
            "ZeRO-2": (4 * P, 4 * S, 8 * S), "ZeRO-3": (4 * S3, 4 * S3, 8 * S3)}[name]


def losses(run):
    """Rank 0's losses, in order: each epoch's train and validation loss, then the test loss."""
    log = run.logs.get(0, "")
    out = [float(x) for m in ex01.LOSS_LINE.finditer(log) for x in m.groups()]
    return out + [float(m.group(1)) for m in ex01.TEST_LINE.finditer(log)]


def held(name, run, r):
    """(params, grads, optimizer, gathered, peak) that rank r of `run` printed under `name`, or
    None."""
    got = [m.groups()[2:] for m in HELD.finditer(run.logs.get(r, "")) if m.group(1) == str(r)
           and m.group(2) == name]
    return tuple(int(x) for x in got[-1]) if got else None


def bytes_wrong(name, run, ranks, units):
    """Why the bytes some rank printed under `name` are not the formula's, or ""."""
    want = formula(name, units, ranks)
    for r in range(ranks):
        got = held(name, run, r)
        if got is None:
            return (f"rank {r} printed no line \"rank {r}: {name} holds ... peak ...\" (every "
                    "rank prints its own: TODO 1)")
        for what, g, w, d in zip(("params", "grads", "optimizer state"), got, want,
                                 formula("DDP", units, ranks)):
            if g != w:
                still = " (DDP's figure: is it still DDP?)" if g == d != w else ""
                return (f"rank {r} holds {g} bytes of {what} under {name}, the formula says {w} "
                        f"on {ranks} ranks{still}")
        if name == "ZeRO-3" and not 0 < got[3] < 4 * sum(units):
            return (f"rank {r} gathered {got[3]} bytes of weights at once under ZeRO-3: one "
                    "unit's worth is expected, never the whole model")
    return ""


def peak_wrong(name, run, solution, ranks, units):
    """Why this run's peaks under `name` are above the solution's at the same stage by more than
    PEAK_MARGIN of a full copy, or "". Its lowest rank against the solution's highest: which rank
    peaks a little higher, and by how much, varies from run to run (PEAK_MARGIN's comment)."""
    theirs = [held(name, solution, r) for r in range(ranks)]
    mine = [held(name, run, r) for r in range(ranks)]
    if any(t is None for t in theirs) or any(m is None for m in mine):
        return ""  # a missing line: bytes_wrong says so; the solution's run failed: its own test
    top = max(t[4] for t in theirs)
    low = min(range(ranks), key=lambda r: mine[r][4])
    allowed = top + PEAK_MARGIN * 4 * sum(units)
    if mine[low][4] > allowed:
        return (f"every rank peaked above the solution under {name} (rank {low}, the lowest: "
                f"{mine[low][4]} bytes of live tensors in a step, the solution {top}, "
                f"+{mine[low][4] - top} bytes, more than half a full copy of the weights, "
                f"{int(PEAK_MARGIN * 4 * sum(units))}): between steps it holds the formula's "
                f"bytes, but during the step something full-size lives that {name} exists to "
                "avoid (a copy of the weights or gradients?)")
    return ""


def solution_runs(check):
    """The solution's run at each ZeRO stage with the same flags: the peaks' reference. With
    --reference-dir made once and reused while the solution binary and the flags stay the same
    (as the engine's DDP reference; the lock keeps parallel checks from racing), else in this
    check's folder."""
    solution, ranks = check.args.solution, check.ranks

    def launch_all(base):
        runs = {stage: Run(os.path.join(base, f"solution-zero{stage}"), ranks) for stage in STAGES}
        with ThreadPoolExecutor(len(runs)) as pool:
            for f in [pool.submit(run.launch, solution, "node", check.data, check.tool("ddprun"),
                                  stage_flags(stage)) for stage, run in runs.items()]:
                f.result()
        return runs

    base = check.args.reference_dir
    if not base:
        return launch_all(check.workdir)
    with Locked(base):
        st = os.stat(solution)
        key = json.dumps([solution, st.st_mtime_ns, st.st_size, ranks, RUN_FLAGS, data_key(),
                          sorted(STAGES)])
        stamp = os.path.join(base, "zero-key.json")
        runs = {stage: Run(os.path.join(base, f"solution-zero{stage}"), ranks) for stage in STAGES}
        if read(stamp) == key and all(os.path.isfile(os.path.join(r.dir, "result.json"))
                                      for r in runs.values()):
            return {stage: run.load() for stage, run in runs.items()}
        runs = launch_all(base)
        if all(run.code == 0 for run in runs.values()):
            with open(stamp, "w") as f:
                f.write(key)
        return runs


def losses_wrong(name, run, reference, resumed=False):
    """Why `run`'s losses are not the reference DDP run's, or "". resumed: the run continued a
    stopped one in its second epoch, so it prints the second epoch's losses and the test loss."""
    if run.failure():
        return run.failure()
    mine, ddp = losses(run), losses(reference)
    if resumed:
        ddp = ddp[2:]
    if len(mine) != len(ddp):
        return f"rank 0 printed {len(mine)} losses under {name}, DDP {len(ddp)}"
    for a, b in zip(mine, ddp):
        if abs(a - b) > LOSS_TOL:
            return (f"a loss of {a:.5f} under {name} where DDP has {b:.5f}: sharding must not "
                    "change what is computed (every gradient averaged, every weight updated once)")
    return ""


def stage_flags(stage):
    return RUN_FLAGS[:-1] + [str(stage)]


def stop(check, stage):
    """The run at `stage`, stopped after STOP_AFTER steps (KIT_TEST_STOP_AFTER_STEP of the test
    hooks that the build's lib/libkit_test_hooks.so installs when preloaded; the trainer itself
    reads no such variable)."""
    hooks = os.path.join(os.path.dirname(check.tool("ddprun")), "..", "lib", "libkit_test_hooks.so")
    env = {"KIT_TEST_STOP_AFTER_STEP": str(STOP_AFTER), "LD_PRELOAD": os.path.abspath(hooks)}
    return Run(os.path.join(check.workdir, f"stopped{stage}"), check.ranks).launch(
        check.args.binary, "node", check.data, check.tool("ddprun"), stage_flags(stage), env)


def judge_resume(check, stage, first=None):
    """The run at `stage` stopped after STOP_AFTER steps (`first`, or made here), then run
    again: it must resume from its sharded checkpoint and end with the uninterrupted losses."""
    v, ranks, name = check.verdicts, check.ranks, f"ZeRO-{stage}"
    what = f"{name} stopped after step {STOP_AFTER} resumes from its sharded checkpoint"
    first = first or stop(check, stage)
    if first.failure():
        return v.add("checkpoint", False, what, f"the stopped run failed: {first.failure()}")
    saved = os.path.join(first.out_dir, "checkpoints")
    steps = sorted(os.listdir(saved)) if os.path.isdir(saved) else []
    shards = [f"shard-{r}-of-{ranks}.pt" for r in range(ranks)]
    if not steps or not all(os.path.isfile(os.path.join(saved, steps[-1], "zero", s))
                            for s in shards):
        return v.add("checkpoint", False, what, f"no checkpoint with every rank's shard "
                     f"({', '.join(shards)}) in {saved}/step-*/zero after the stop")
    # The second run writes into the first's out-dir (the later --out-dir wins).
    again = check.launch(check.args.binary, f"resumed{stage}", ranks, "node", check.data,
                         stage_flags(stage) + ["--out-dir", first.out_dir])
    why = losses_wrong(name, again, check.reference, resumed=True)
    if not why and not re.search(r"^resuming from .* step %d\s*$" % STOP_AFTER,
                                 again.logs.get(0, ""), re.M):
        why = "the second run did not say \"resuming from ...\": it started afresh"
    v.add("checkpoint", not why, what, why)


def judge(check):
    v, many, ranks = check.verdicts, check.many, check.ranks
    head = UNITS.search(many.logs.get(0, ""))
    if head is None or many.failure():
        for concept in ("report", "zero1", "zero2", "zero3", "checkpoint"):
            v.add(concept, False, "the DDP run works", many.failure() or "rank 0 printed no "
                  "\"parameters ... in units ...\" line: the given DDP trainer must run first")
        return
    units = [int(x) for x in head.group(2).split()]
    why = bytes_wrong("DDP", many, ranks, units)
    v.add("report", not why, f"every rank of {ranks} prints the bytes it holds (DDP: the formula's)",
          why)
    # The three stages' runs and a stopped ZeRO-3 run go at once: each is mostly the start of
    # two processes, so together they take little more than one (kit check 03 stays quick).
    runs = {stage: (check.launch, (check.args.binary, f"zero{stage}", ranks, "node", check.data,
                                   stage_flags(stage))) for stage in STAGES}
    runs["stopped"] = (stop, (check, 3))
    runs["solution"] = (solution_runs, (check,))
    with ThreadPoolExecutor(len(runs)) as pool:
        done = {k: pool.submit(f, *a) for k, (f, a) in runs.items()}
        done = {k: f.result() for k, f in done.items()}
    working = []
    for stage, concept in STAGES.items():
        name = f"ZeRO-{stage}"
        why = losses_wrong(name, done[stage], check.reference) or \
            bytes_wrong(name, done[stage], ranks, units) or \
            peak_wrong(name, done[stage], done["solution"][stage], ranks, units)
        v.add(concept, not why, f"{name} on {ranks} ranks: DDP's losses, the formula's bytes, "
              "the solution's peak", why)
        if not why:
            working.append(stage)
    if working:  # the highest stage that works; ZeRO-3's stopped run is made already
        judge_resume(check, working[-1], done["stopped"] if working[-1] == 3 else None)
    else:
        v.add("checkpoint", False, "a ZeRO run resumes from its sharded checkpoint",
              "needs a ZeRO stage that works first (TODOs 2 to 4)")
    compare.judge_run(check, f"your DDP run on {ranks} ranks follows the solution's",
                      "" if losses(many) == losses(check.reference) else
                      "the losses differ from the solution's")
