"""Exercise 03 (exercise 01's trainer, then ZeRO-1, 2, 3): which runs, which TODO is which, and
the formula.

The engine runs the trainer with --zero-stage 0 (DDP: alone, on N ranks, with one rank per
node, and the solution as the reference) and, for each ZeRO stage, with the other --lr and
--clip-grad of FLAG_RUNS. judge() compares the student's DDP run with the solution's first (where
it differs, the ZeRO stages are compared with the student's DDP run, and the closing row names
the line), then runs the build on N ranks at each ZeRO stage, and at each stage once stopped
after STOP_AFTER steps and run again, and the solution the same way (the peaks' and the
checkpoints' reference). Rank 0
prints "parameters P in units u1 u2 ... on N ranks", the epoch and test losses as exercise 01
does, and every rank "rank R: NAME holds params P grads G optimizer O gathered X bytes, peak Y"
(Y: the most bytes of live tensors the rank had during a training step, kit/train/memory.h). A stage
passes when

  * its losses are the solution's DDP losses (the student's own DDP run's, where that already
    differs from the solution's), each within LOSS_TOL, and
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
The formula is computed here from the unit sizes, not read from the program. TODO 5 passes
when, at every stage with DDP's losses, the stopped run's newest checkpoint holds the solution's
shards (checklib/archive.py reads them) and the second run resumes from it to DDP's losses. A run
that stops in a line of another TODO (a library error ends with the trainer's calling line) is
that TODO's ✘; the stage it stopped is "not reached" past the losses it printed."""
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor

from checklib import archive, compare, engine, stops
from checklib.runs import Locked, Run
from checklib.verdicts import CROSS
from rules import ex01

ZERO_FLAGS = ["--epochs", "2", "--max-steps", "3"]
RUN_FLAGS = list(ex01.RUN_FLAGS)
RUN_FLAGS[RUN_FLAGS.index("--epochs"):RUN_FLAGS.index("--epochs") + 2] = ZERO_FLAGS
RUN_FLAGS += ["--zero-stage", "0"]
# One rank per simulated node (every LOCAL_RANK 0), DDP, 2 steps: TODO 1's line must name the
# global rank, which equals the local rank only on the first node.
SHORT_FLAGS = list(RUN_FLAGS[:-2])
SHORT_FLAGS[SHORT_FLAGS.index("--epochs") + 1] = "1"
SHORT_FLAGS[SHORT_FLAGS.index("--max-steps") + 1] = "2"
NODES_FLAGS = SHORT_FLAGS + ["--zero-stage", "0"]
# The flags TODOs 2-4 must honour (ZeroOptions' `adamw` and .max_grad_norm), with values other
# than RUN_FLAGS' defaults (--lr 1e-3, --clip-grad 0: off), at each stage (checklib/engine.py
# runs the student's build and the solution's with each): a hard-coded rate, or options without
# .max_grad_norm, pass the default run and not this one. AdamW's step hardly depends on the
# gradient's scale (m / sqrt(v)), so an ordinary norm (0.05) moved the printed losses by 1-2e-5,
# within LOSS_TOL (measured, ZeRO-1 without .max_grad_norm); clipped to 1e-6, the 59309
# gradients' root mean square is 4e-9, below AdamW's eps (1e-8), so the steps shrink.
FLAG_VALUES = ["--lr", "0.003", "--clip-grad", "1e-6"]
FLAG_RUNS = {f"flags{stage}": SHORT_FLAGS + FLAG_VALUES + ["--zero-stage", str(stage)]
             for stage in (1, 2, 3)}
STOP_AFTER = 4  # the stopped run: after step 4 of 6, in the second epoch
# A step of these runs takes well under a second; a rank that waits 12 s in a collective or the
# rendezvous waits for a rank that never comes (a save only rank 0 calls). Shorter than the
# engine's 30 s so that the check of such a hang, once per stage, is quick.
RUN_ENV = {"KIT_TIMEOUT": "12"}
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
# (tests/mutations: zero3-keeps-full-copy, caught at +237236 to +337204 in 3 runs). Again
# 2026-11-26, with the six runs of the student's build and the solution's six at once as the
# check runs them now (6 checks of the solution, 2 ranks, 14 peaks a stage): spreads of 49988
# (ZeRO-1), 49984 (ZeRO-2) and 99968 bytes (ZeRO-3, 2243608 to 2343576, higher than above since
# ZeRO-3 no longer recomputes its forward by default), still below the margin.
PEAK_MARGIN = 0.5
# A checkpoint's shards against the solution's at the same step: the same library computes both,
# so equal but for the order of a sum (relative 1e-4 of the tensor's largest value).
SHARD_TOL = 1e-4
UNITS = re.compile(r"^parameters (\d+) in units([ 0-9]+) on (\d+) ranks\s*$", re.M)
PLACES = {"init": ("kit::TransformerLM model(", "the line that creates the model"),
          "forward": ("kit::TransformerLM model(", "the model's options (dropout, sizes)"),
          "update": ("optimizer.emplace(", "the line that creates the optimizer"),
          "checkpoint": ("trainer.save(", "the checkpoints' save"),
          "final": ("evaluate(model, test_loader", "the final evaluation"),
          "saved": ('save_model(args.out_dir + "/model-final.pt")', "the final model's save")}


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


def hooks_env():
    """The environment of a run stopped after STOP_AFTER steps: KIT_TEST_STOP_AFTER_STEP of the
    test hooks that the build's lib/libkit_test_hooks.so installs when preloaded (the trainer
    itself reads no such variable)."""
    return {"KIT_TEST_STOP_AFTER_STEP": str(STOP_AFTER)}


def stopped_env(check):
    hooks = os.path.join(os.path.dirname(check.tool("ddprun")), "..", "lib", "libkit_test_hooks.so")
    return dict(hooks_env(), LD_PRELOAD=os.path.abspath(hooks))


def solution_runs(check):
    """The solution's run at each ZeRO stage with the same flags (the peaks' reference), and its
    run stopped after STOP_AFTER steps (the checkpoints' reference): engine.reference_run's, kept
    in --reference-dir and reused while the solution binary, the flags and the generated data
    stay the same (the lock keeps parallel checks from racing), else made in this check's
    folder. {stage: run}, {stage: stopped run}."""
    base = check.args.reference_dir or check.workdir
    jobs = {(stage, False): (f"zero{stage}", None) for stage in STAGES}
    jobs.update({(stage, True): (f"stopped{stage}", stopped_env(check)) for stage in STAGES})

    def launch_all():
        with ThreadPoolExecutor(len(jobs)) as pool:
            done = {k: pool.submit(engine.reference_run, check, base, check.data, name,
                                   stage_flags(k[0]), env) for k, (name, env) in jobs.items()}
            return {k: f.result() for k, f in done.items()}

    if check.args.reference_dir:
        with Locked(base):
            runs = launch_all()
    else:
        runs = launch_all()
    return ({s: runs[(s, False)] for s in STAGES}, {s: runs[(s, True)] for s in STAGES})


def losses_wrong(name, run, reference, resumed=False, whose="DDP"):
    """Why `run`'s losses are not the reference DDP run's, or "". resumed: the run continued a
    stopped one in its second epoch, so it prints the second epoch's losses and the test loss.
    whose: the reference's name in the message ("your DDP run" when the student's own DDP run
    is the reference because it already differs from the solution's)."""
    if run.failure():
        return run.failure()
    mine, ddp = losses(run), losses(reference)
    if resumed:
        ddp = ddp[2:]
    if len(mine) != len(ddp):
        return f"rank 0 printed {len(mine)} losses under {name}, {whose} {len(ddp)}"
    for a, b in zip(mine, ddp):
        if abs(a - b) > LOSS_TOL:
            return (f"a loss of {a:.5f} under {name} where {whose} has {b:.5f}: sharding must not "
                    "change what is computed (every gradient averaged, every weight updated once)")
    return ""


def same_losses(a, b):
    x, y = losses(a), losses(b)
    return len(x) == len(y) and all(abs(p - q) <= LOSS_TOL for p, q in zip(x, y))


def stage_flags(stage):
    return RUN_FLAGS[:-1] + [str(stage)]


def stop(check, stage):
    """The student's run at `stage`, stopped after STOP_AFTER steps."""
    return Run(os.path.join(check.workdir, f"stopped{stage}"), check.ranks).launch(
        check.args.binary, "node", check.data, check.tool("ddprun"), stage_flags(stage),
        stopped_env(check))


def explain(check, run):
    """How and where `run` stopped (checklib/stops.py: a library error that ends with the
    trainer's line, "(train.cpp:251)", is placed in that line's TODO)."""
    return stops.explain(run, check.source, check.args.exercise,
                         getattr(check.rules, "COLLECTIVE_FILES", {}), check.verdicts)


def last_checkpoint(run):
    """The newest step-N folder of `run`'s checkpoints, or None."""
    saved = os.path.join(run.out_dir, "checkpoints")
    steps = sorted((d for d in (os.listdir(saved) if os.path.isdir(saved) else [])
                    if re.fullmatch(r"step-\d+", d)), key=lambda d: int(d[5:]))
    return os.path.join(saved, steps[-1]) if steps else None


def tensor_name(stage, key, count):
    """What entry `key` of a ZeRO shard file is (kit/train/zero_checkpoint.cpp's order: the
    weights' shard, AdamW's exp_avg and exp_avg_sq, per unit under ZeRO-3; the step counts last)."""
    k = int(key)
    parts = ("its shard of the weights", "its shard of AdamW's exp_avg",
             "its shard of AdamW's exp_avg_sq")
    if k == count - 1:
        return "AdamW's step count" + ("s" if stage == 3 else "")
    return parts[k % 3] + (f" of unit {k // 3}" if stage == 3 else "")


def shards_wrong(stage, mine, theirs, ranks):
    """Why the newest checkpoint of the student's stopped run does not hold what the solution's
    holds at the same step (every rank's shard: weights, optimizer state, step counts), or ""."""
    a, b = last_checkpoint(mine), last_checkpoint(theirs)
    if b is None:
        return ""  # the solution's stopped run saved nothing: its own tests say so
    if a is None or os.path.basename(a) != os.path.basename(b):
        return (f"the newest checkpoint after the stop is {os.path.basename(a or 'none')}, the "
                f"solution's {os.path.basename(b)}")
    for r in range(ranks):
        name = f"zero/shard-{r}-of-{ranks}.pt"
        try:
            got = archive.tensors(os.path.join(a, name))
        except (OSError, ValueError):
            return f"{os.path.basename(a)} has no readable {name}: rank {r} saved no shard there"
        want = archive.tensors(os.path.join(b, name))
        for key in sorted(want, key=int):
            what = f"rank {r}'s {name} in {os.path.basename(a)}: {tensor_name(stage, key, len(want))}"
            if key not in got or got[key].shape != want[key].shape:
                return (f"{what} has shape {got[key].shape if key in got else 'none'}, the "
                        f"solution's {want[key].shape}")
            scale = max((abs(x) for x in want[key].values), default=0.0)
            for i, (x, y) in enumerate(zip(got[key].values, want[key].values)):
                if not math.isclose(x, y, rel_tol=SHARD_TOL, abs_tol=SHARD_TOL * scale):
                    return (f"{what} differs from the solution's (element {i}: {x:.6g}, the "
                            f"solution's {y:.6g}): the checkpoint does not hold this rank's state")
    return ""


def saved_shards_wrong(check, stage, first, theirs):
    """Why the run at `stage`, stopped after STOP_AFTER steps (`first`), has not saved every
    rank's shard, or not the shards of `theirs` (the solution's stopped run; None: not compared),
    or "". A stop of the first run is judged by the caller."""
    ranks = check.ranks
    newest = last_checkpoint(first)
    shards = [f"shard-{r}-of-{ranks}.pt" for r in range(ranks)]
    if newest is None or not all(os.path.isfile(os.path.join(newest, "zero", s)) for s in shards):
        return (f"no checkpoint with every rank's shard ({', '.join(shards)}) in "
                f"{first.out_dir}/checkpoints/step-*/zero after the stop"), None
    return shards_wrong(stage, first, theirs, ranks) if theirs is not None else ""


def resume(check, stage, first):
    """The run at `stage` again, in the stopped run's out-dir (the later --out-dir wins)."""
    return check.launch(check.args.binary, f"resumed{stage}", check.ranks, "node", check.data,
                        stage_flags(stage) + ["--out-dir", first.out_dir])


def resumed_wrong(check, name, again, baseline, whose):
    if again.failure():
        s = explain(check, again)
        return f"the second run stopped: {s.how}" + (f" ({s.where})" if s.where else "")
    why = losses_wrong(name, again, baseline, resumed=True, whose=whose)
    if not why and not re.search(r"^resuming from .* step %d\s*$" % STOP_AFTER,
                                 again.logs.get(0, ""), re.M):
        why = "the second run did not say \"resuming from ...\": it started afresh"
    return why


def local_rank_wrong(check, units):
    """Why the bytes lines of the run with one rank per node (every LOCAL_RANK 0) do not name
    each rank's global rank, or "": on one node the local rank is the global one."""
    nodes, ranks = check.nodes, check.ranks
    if nodes is None or not nodes.finished():
        return ""
    for r in range(ranks):
        if held("DDP", nodes, r) is None:
            said = [m.group(1) for m in HELD.finditer(nodes.logs.get(r, ""))]
            return (f"with one rank per node, rank {r} printed "
                    + (f"\"rank {said[-1]}: DDP holds ...\"" if said else "no bytes line")
                    + ": the line must name the global rank (kit::Setup's rank), which the "
                    "local rank equals only on the first node")
    return bytes_wrong("DDP", nodes, ranks, units)


def saved_wrong(run, name, units):
    """Why the model files of `run`, a run that finished, are not the whole model: no
    model-final.pt (every stage writes it; under ZeRO-3 kit::save0 gathers the sharded model to
    rank 0), or a file (model-best.pt, model-final.pt) with fewer bytes than the model's 4P of fp32
    weights (save0 of the model itself under ZeRO-3, whose own tensors are empty): (the file,
    why), or (None, "")."""
    need = 4 * sum(units)
    if not os.path.isfile(os.path.join(run.out_dir, "model-final.pt")):
        return "model-final.pt", (f"under {name} the run finished without model-final.pt: every "
                                  "stage saves the whole model (under ZeRO-3 kit::save0 of the "
                                  "sharded model gathers it to rank 0)")
    for f in ("model-best.pt", "model-final.pt"):
        path = os.path.join(run.out_dir, f)
        if os.path.isfile(path) and os.path.getsize(path) < need:
            return f, (f"under {name} {f} holds {os.path.getsize(path)} bytes, fewer than the "
                    f"{need} of the model's fp32 weights: its weights are empty (under ZeRO-3 "
                    "no rank has the whole model: kit::save0 of the sharded model gathers it)")
    return None, ""


def flag_wrong(check, stage):
    """Why the run of FLAG_RUNS at `stage` (other --clip-grad and --lr) does not have the
    solution's losses, or "": a stage made with a hard-coded learning rate or without
    .max_grad_norm passes the run with the defaults."""
    pair = check.flag_runs.get(f"flags{stage}")
    if not pair or not pair[0].finished() or not pair[1].finished():
        return ""  # a stop there is the stage run's stop, judged there
    mine, theirs = pair
    a, b = losses(mine), losses(theirs)
    for x, y in zip(a, b):
        if abs(x - y) > LOSS_TOL:
            return (f"with {' '.join(FLAG_VALUES)}: a loss of {x:.5f} where the solution has "
                    f"{y:.5f}: ZeroOptions must take the learning rate (`adamw`) and "
                    ".max_grad_norm from the flags")
    return ""


def judge(check):
    v, many, ranks = check.verdicts, check.many, check.ranks
    head = UNITS.search(many.logs.get(0, ""))
    if head is None or many.failure():
        for concept in ("report", "zero1", "zero2", "zero3", "checkpoint"):
            v.add(concept, False, "the DDP run works", many.failure() or "rank 0 printed no "
                  "\"parameters ... in units ...\" line: the given DDP trainer must run first")
        return
    units = [int(x) for x in head.group(2).split()]
    why = bytes_wrong("DDP", many, ranks, units) or local_rank_wrong(check, units)
    report_ok = not why
    v.add("report", report_ok, f"every rank of {ranks} prints the bytes it holds, under its global "
          "rank (DDP: the formula's)", why)
    # The student's own DDP run first: it has none of this exercise's TODOs, so where it already
    # differs from the solution's, that is the first thing to fix, and each ZeRO stage is
    # compared with it (sharding must not change what the student's trainer computes).
    own = "" if same_losses(many, check.reference) else (
        compare.first_place(check) or "every traced event agrees, the printed losses do not ("
        + compare.Places(v, check.args.exercise, check.source, PLACES).at(anchor="final") + ")")
    baseline, whose = (many, "your DDP run") if own else (check.reference, "DDP")
    if own:
        print(f"  {CROSS} your DDP run (--zero-stage 0, no TODO of this exercise) already differs "
              f"from the solution's: {own}; each ZeRO stage is compared with your DDP run")
    # The three stages' runs, each stopped after STOP_AFTER steps, and the solution's: at once,
    # each mostly the start of two processes (kit check 03 stays quick).
    jobs = {stage: (check.launch, (check.args.binary, f"zero{stage}", ranks, "node", check.data,
                                   stage_flags(stage))) for stage in STAGES}
    jobs.update({("stopped", s): (stop, (check, s)) for s in STAGES})
    jobs["solution"] = (solution_runs, (check,))
    with ThreadPoolExecutor(len(jobs)) as pool:
        done = {k: pool.submit(f, *a) for k, (f, a) in jobs.items()}
        done = {k: f.result() for k, f in done.items()}
    solution, solution_stopped = done["solution"]
    stopped_at = {}  # TODO label of a stop -> (how, where), said once, first among its rows
    working, passed, saved = [], [], (None, "")
    for stage, concept in STAGES.items():
        name, run = f"ZeRO-{stage}", done[stage]
        what = f"{name} on {ranks} ranks: {whose}'s losses, the formula's bytes, the solution's peak"
        if run.failure():
            s = explain(check, run)
            if s.todo and s.todo != v.todo(concept):
                # Stopped in another TODO's line: this stage is judged as far as it got.
                stopped_at.setdefault(s.todo, (s.how, s.where))
                printed, want = losses(run), losses(baseline)[:len(losses(run))]
                if any(abs(a - b) > LOSS_TOL for a, b in zip(printed, want)):
                    v.add(concept, False, what, losses_wrong(name, run, baseline, whose=whose))
                else:
                    v.unreached(concept, what, f"the run stopped in TODO {s.todo} before its "
                                "bytes line")
                continue
            v.add(concept, False, what, s.how + (f" ({s.where})" if s.where else ""))
            continue
        why = losses_wrong(name, run, baseline, whose=whose)
        if not why:  # its losses are right: its checkpoints can be judged (TODO 5)
            working.append(stage)
        held_why = bytes_wrong(name, run, ranks, units)
        why = why or held_why or peak_wrong(name, run, solution[stage], ranks, units) or \
            ("" if own else flag_wrong(check, stage))  # the flag runs have no DDP run of yours
        # The bytes come from TODO 1's line: where that line is wrong, so are they.
        v.add(concept, not why, what, why, cause="report" if why and why == held_why and
              not report_ok else None)
        if not why:
            passed.append(stage)
        saved = saved if saved[0] else saved_wrong(run, name, units)
    judge_checkpoints(check, working, passed, done, solution_stopped, baseline, stopped_at)
    for todo, (how, where) in stopped_at.items():
        v.add(todo, False, f"the ZeRO runs on {ranks} ranks get to their end",
              how + (f" ({where})" if where else ""), first=True)
    closing(check, ranks, own, saved)


def judge_checkpoints(check, working, passed, done, solution_stopped, baseline, stopped_at):
    """TODO 5, at every stage whose losses are right (`working`): the stopped run's newest
    checkpoint holds every rank's shard, the solution's where the stage passed (`passed`: a
    stage that shards otherwise saves other shards, its own TODO's mistake), and the run resumes
    from it to the uninterrupted losses."""
    v = check.verdicts
    what = (f"every ZeRO stage with DDP's losses, stopped after step {STOP_AFTER}, saved the "
            "solution's shards and resumes from them")
    if not working:
        if not stopped_at:
            v.add("checkpoint", False, "a ZeRO run resumes from its sharded checkpoint",
                  "needs a ZeRO stage with DDP's losses first (TODOs 2 to 4)")
        return
    why = {}
    for stage in working:
        first = done[("stopped", stage)]
        if first.failure():
            s = explain(check, first)
            if s.todo and s.todo != v.todo("checkpoint"):
                stopped_at.setdefault(s.todo, (s.how, s.where))
                v.unreached("checkpoint", what, f"the run stopped in TODO {s.todo}")
                return
            why[stage] = f"the stopped run failed: {s.how}" + (f" ({s.where})" if s.where else "")
            continue
        why[stage] = saved_shards_wrong(check, stage, first, solution_stopped[stage]
                                        if stage in passed else None)
    # The second runs, from the checkpoints that hold what they should: at once.
    again = [s for s in working if not why.get(s)]
    with ThreadPoolExecutor(max(1, len(again))) as pool:
        runs = {s: pool.submit(resume, check, s, done[("stopped", s)]) for s in again}
        for stage, f in runs.items():
            why[stage] = resumed_wrong(check, f"ZeRO-{stage}", f.result(), baseline,
                                       "your DDP run" if baseline is check.many else "DDP")
    bad = [s for s in working if why.get(s)]
    label = ", ".join(f"ZeRO-{s}" for s in working)
    v.add("checkpoint", not bad, f"{what} ({label})",
          f"ZeRO-{bad[0]}: {why[bad[0]]}" if bad else "")


def closing(check, ranks, own, saved):
    """The closing row: the student's DDP run first, then a model file that cannot hold the
    weights (a line outside the TODOs), else the run against the solution's, event by event."""
    v = check.verdicts
    what = f"your DDP run on {ranks} ranks follows the solution's"
    file, why = saved
    if why and not v.first_to_fix():
        places = compare.Places(v, check.args.exercise, check.source, PLACES)
        n = places.find(f'"/{file}"')
        v.add("all", False, what, f"{why} ({places.line(n) if n else places.at(anchor='saved')})")
        return
    if own:  # no TODO of this exercise is in the DDP run: its own place, never "fix TODO n"
        v.add("all", False, what, f"the losses differ from the solution's; your run first leaves "
              f"the solution's here: {own}")
        return
    compare.judge_run(check, what, "")
