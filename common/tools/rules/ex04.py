"""Exercise 04 (exercise 01's finished trainer, then tensor and context parallelism on a
dp x cp x tp mesh): which runs, which TODO is which, and what each must show.

The engine runs the build as exercise 01's check does, with RUN_FLAGS (tp 1, cp 1: every rank a
data-parallel replica): alone, on 2 ranks, and the device check. The exercise as shipped is
exercise 01's finished trainer, so those runs pass it; what the TODOs change shows in the runs
of this file, each on the student's build (MESHES, all at once):

  tp2    2 ranks, --tp 2: each block split over both ranks
  cp2    2 ranks, --cp 2: each sequence split over both ranks
  mesh4  4 ranks, --tp 2 --order dp-cp-tp: dp 2 x tp 2 laid out dp first, so that a tp group is
         {0, 2}, not two neighbours (an order ignored, a group taken from the wrong direction,
         the world for a subgroup: each shows here)
  stop   2 ranks, --tp 2, stopped after STOP_AFTER steps (the build's test hooks, preloaded),
         then run again in its folder: it must resume from every rank's own shard

and the solution's reference runs (kept in --reference-dir): alone (tp 1, dp 1: the reference
of tp2, cp2 and the stop) and on 2 ranks (dp 2: the reference of mesh4, whose data is split over
its 2 dp replicas as theirs is), all with KIT_TRACE_WEIGHTS=1: every rank's weights and averaged
gradients after the first backward (kit/check/model_trace.h).

A TODO passes when, in each run where it matters:
  1  every rank prints its line of the mesh ("rank R of W: tp a of T, cp b of C, dp c of D (order
     O)") with the coordinates that this file computes from --tp, --cp and --order;
  2  each rank's samplers split the data over the dp replicas (num_replicas = dp size, rank = the
     dp coordinate: the trace's "sampler ... replicas= rank=");
  3, 4  each rank holds the formula's share of the MLP's (attention's) weights, the weights and the
     first averaged gradients are the matching slices of the reference's (tp 1: rows of linear1
     and of each of q, k and v; columns of linear2 and of the output projection), and the
     collectives of those lines are on the rank's tp group (cp's all-gathers of keys and values,
     also made by attention, on its cp group), 2 all-reduces of [batch, seq / cp, d] per block
     and per training step for each TODO: Megatron's f and g, forward and backward;
  5  DDP's collectives are on the rank's dp x cp group (the ranks that hold the same weights);
  6  the loss's and the evaluation's collectives are on that same group, and rank 0 prints the
     reference's losses;
  7  at cp 2 the run reaches the reference's losses, per step (the mean of a cp group's step
     losses: each holds the loss of its part of the sequences) and printed;
  8  the stopped run left every rank's shard, and the second run resumes from it to the
     reference's losses;
  9  the process group is closed at the end (exercise 01's judge, on the engine's run).
A run that stops in a line of a TODO (a library error ends with the trainer's line) is that
TODO's \u2718."""
import csv
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor

from checklib import archive, compare, engine, judges, stops
from checklib.runs import Locked, Run, kv
from rules import ex01

# Exercise 01's flags with 4 heads (they split over tp 2 and 4) and a feedforward width other
# than 4 d... kept at 64 = 2 d, so that linear1's rows and attention's q, k, v rows differ in
# number (a slice of the wrong layer shows).
RUN_FLAGS = list(ex01.RUN_FLAGS)
RUN_FLAGS[RUN_FLAGS.index("--heads") + 1] = "4"
# 5 steps an epoch (of 30): the check looks at each TODO's behaviour, not at a trained model, and
# runs the trainer 7 times (a mutant test runs the whole check: the time counts many times).
RUN_FLAGS += ["--max-steps", "5"]
NODES_FLAGS = None  # where each rank puts its model is exercise 01's lesson, already passed
EPOCHS = ex01.EPOCHS
STOP_AFTER = 4  # the stopped run: after step 4 of 5, in the first epoch
PRELOAD = ["kit_test_hooks"]
# Short runs: a rank that waits 12 s in a collective waits for a rank that never comes.
RUN_ENV = {"KIT_TIMEOUT": "12", "KIT_TRACE_WEIGHTS": "1"}
MESHES = {"tp2": (2, ["--tp", "2"]), "cp2": (2, ["--cp", "2"]),
          "mesh4": (4, ["--tp", "2", "--order", "dp-cp-tp"])}
# Printed losses: 5 decimals. Per-step losses (the trace's, 8 digits): tensor parallelism adds
# the partial sums of a layer in another order than one rank's matrix product does. Measured
# (2026-11-27, the solution, these flags, 60 steps): the per-step losses of tp 2, tp 4 and dp 2 x
# tp 2 differ from tp 1's (dp 2's) by at most 9.6e-7, the printed ones not at all; cp 2's mean
# of the cp group's step losses by at most STEP_TOL's measured part below (judge_steps).
LOSS_TOL = 2e-5
STEP_TOL = 1e-5
# The first averaged gradients against the reference's slices: relative to the tensor's largest
# value (the same sums, added in another order).
GRAD_TOL = 1e-4
RESULT_LINES = ex01.RESULT_LINES
LABELS = {"mesh": "1", "sampler": "2", "mlp": "3", "attention": "4", "ddp": "5", "loss": "6",
          "cp": "7", "checkpoint": "8", "destroy": "9"}
COLLECTIVE_FILES = {"ddp.cpp": "ddp"}
PLACES = {"init": ("kit::ParallelTransformerLM model(", "the line that creates the model"),
          "forward": ("kit::ParallelTransformerLM model(", "the model's options (dropout, sizes)"),
          "update": ("torch::optim::AdamW optimizer(", "the line that creates the optimizer"),
          "checkpoint": ("checkpoints.save_sharded(", "the checkpoints' save"),
          "final": ("evaluate(model, test_loader", "the final evaluation")}
MESH_LINE = re.compile(r"^rank (\d+) of (\d+): tp (\d+) of (\d+), cp (\d+) of (\d+), dp (\d+) of "
                       r"(\d+) \(order ([a-z-]+)\)\s*$", re.M)
HELD = re.compile(r"^rank (\d+) holds (\d+) parameters: attention (\d+), mlp (\d+), the rest "
                  r"(\d+)\s*$", re.M)


def data_key():
    return ex01.data_key()


def prepare_data(check, directory):
    return ex01.prepare_data(check, directory)


# --- the mesh, computed here -------------------------------------------------------------------
class Layout:
    """Where each rank of a world of `world` sits for tp, cp and `order` (fastest-varying first),
    and its groups' members: what kit::Mesh must make, computed independently of it."""

    def __init__(self, world, tp=1, cp=1, order="tp-cp-dp"):
        self.world, self.order = world, order
        self.size = {"tp": tp, "cp": cp, "dp": world // (tp * cp)}
        self.dims = order.split("-")

    def coords(self, rank):
        out, rest = {}, rank
        for d in self.dims:
            out[d] = rest % self.size[d]
            rest //= self.size[d]
        return out

    def members(self, rank, dims):
        """The ranks whose coordinates agree with `rank`'s outside `dims` (e.g. ("dp", "cp"))."""
        me = self.coords(rank)
        return sorted(r for r in range(self.world)
                      if all(self.coords(r)[d] == me[d] for d in self.dims if d not in dims))


def layout_of(name):
    ranks, flags = MESHES[name]
    get = lambda f, d: flags[flags.index(f) + 1] if f in flags else d  # noqa: E731
    return Layout(ranks, int(get("--tp", 1)), int(get("--cp", 1)), get("--order", "tp-cp-dp"))


def members_of(group, ranks):
    if group in (None, "", "world"):
        return list(range(ranks))
    return sorted(int(r) for r in group.split(",") if r.isdigit())


def show(ranks):
    return "{" + ", ".join(str(r) for r in ranks) + "}"


# --- the runs ----------------------------------------------------------------------------------
def stopped_env(check):
    return {"KIT_TEST_STOP_AFTER_STEP": str(STOP_AFTER),
            "LD_PRELOAD": check.library("kit_test_hooks")}


def flags_of(name):
    return RUN_FLAGS + MESHES[name][1]


def reference(check, name, ranks):
    """The solution's run with RUN_FLAGS on `ranks` ranks (1: tp 1's reference; 2: dp 2's), made
    once per solution binary, flags and data in --reference-dir (engine.reference_run's key),
    else in this check's folder."""
    base = check.args.reference_dir or check.workdir
    saved = check.ranks
    check.ranks = ranks  # reference_run runs on check.ranks
    try:
        return engine.reference_run(check, base, check.data, name, RUN_FLAGS)
    finally:
        check.ranks = saved


def launch_all(check):
    """The student's runs of MESHES and the stopped run, and the solution's two references, at
    once: {name: run}. The stopped run's second half is run after (resume())."""
    a = check.args
    with ThreadPoolExecutor(len(MESHES) + 1) as pool:
        mine = {name: pool.submit(check.launch, a.binary, name, ranks, "node", check.data,
                                  flags_of(name))
                for name, (ranks, _) in MESHES.items()}
        mine["stop"] = pool.submit(check.launch, a.binary, "stop", 2, "node", check.data,
                                   flags_of("tp2"), stopped_env(check))
        if a.reference_dir:
            with Locked(a.reference_dir):
                refs = {"ref1": reference(check, "tp1", 1), "ref2": reference(check, "dp2", 2)}
        else:
            refs = {"ref1": reference(check, "tp1", 1), "ref2": reference(check, "dp2", 2)}
        out = {name: f.result() for name, f in mine.items()}
    out.update(refs)
    return out


def resume(check, first):
    """The stopped run again, in its out-dir (the later --out-dir wins)."""
    return check.launch(check.args.binary, "resumed", 2, "node", check.data,
                        flags_of("tp2") + ["--out-dir", first.out_dir])


# --- reading them ------------------------------------------------------------------------------
def losses(run):
    """Rank 0's printed losses: each epoch's train and validation loss, then the test loss."""
    log = run.logs.get(0, "")
    out = [float(x) for m in ex01.LOSS_LINE.finditer(log) for x in m.groups()]
    return out + [float(m.group(1)) for m in ex01.TEST_LINE.finditer(log)]


def step_losses(run, rank):
    return [float(kv(f)["loss"]) for f in run.events(rank, "step") if "loss" in kv(f)]


def calls(run, rank):
    return [kv(f) for f in run.events(rank, "coll")]


class Judge:
    """The places of the student's lines (a call site -> its TODO) and the verdicts."""

    def __init__(self, check):
        self.check, self.v = check, check.verdicts

    def todo_of(self, site):
        c = self.check
        return stops.place(site, c.source, c.args.exercise, COLLECTIVE_FILES, self.v)[0]

    def stop(self, run):
        """(todo, text) of a run that failed: the TODO whose line it stopped in, or None."""
        c = self.check
        s = stops.explain(run, c.source, c.args.exercise, COLLECTIVE_FILES, self.v)
        return s.todo, s.how + (f" ({s.where})" if s.where else "")


def describe_run(name):
    ranks, flags = MESHES[name]
    return f"the {' '.join(flags)} run on {ranks} ranks"


# --- the judgments, TODO by TODO ---------------------------------------------------------------
def judge_mesh(v, runs):
    what = "every rank prints where it sits on the mesh, with the coordinates of --tp, --cp and --order"
    for name in MESHES:
        run, lay = runs[name], layout_of(name)
        for r in range(lay.world):
            said = [m for m in MESH_LINE.finditer(run.logs.get(r, "")) if m.group(1) == str(r)]
            if not said:
                if run.events(r, "sampler") or run.finished():
                    anywhere = MESH_LINE.search(run.logs.get(0, "")) if r else None
                    v.add("mesh", False, what, f"in {describe_run(name)} rank {r} printed no line "
                          "\"rank R of W: tp a of T, cp b of C, dp c of D (order O)\""
                          + (" (rank 0's line is there: print it on every rank, with std::printf)"
                             if anywhere else ""))
                else:
                    v.unreached("mesh", what, f"{describe_run(name)} stopped before it")
                return
            g = said[-1].groups()
            want = lay.coords(r)
            got = {"tp": (int(g[2]), int(g[3])), "cp": (int(g[4]), int(g[5])),
                   "dp": (int(g[6]), int(g[7]))}
            exp = {d: (want[d], lay.size[d]) for d in ("tp", "cp", "dp")}
            if got != exp or g[8] != lay.order:
                v.add("mesh", False, what, f"in {describe_run(name)} rank {r} says \""
                      f"{said[-1].group(0).strip()}\"; with tp {lay.size['tp']}, cp "
                      f"{lay.size['cp']} and --order {lay.order} it sits at tp {want['tp']}, cp "
                      f"{want['cp']}, dp {want['dp']} (the order's first direction varies fastest)")
                return
    v.add("mesh", True, what)


def judge_samplers(v, runs):
    what = "each rank's samplers split the data over the dp replicas only (num_replicas, rank)"
    for name in MESHES:
        run, lay = runs[name], layout_of(name)
        for r in range(lay.world):
            made = [kv(f) for f in run.events(r, "sampler")]
            if len(made) < 3:
                if not run.finished():
                    v.unreached("sampler", what, f"{describe_run(name)} stopped before it")
                    return
                v.add("sampler", False, what, f"in {describe_run(name)} rank {r} made "
                      f"{len(made)} sampler(s), the trainer 3 (train, validation, test)")
                return
            dp = lay.coords(r)["dp"]
            for split, s in zip(("training", "validation", "test"), made[:3]):
                got = (int(s.get("replicas", -1)), int(s.get("rank", -1)))
                if got != (lay.size["dp"], dp):
                    v.add("sampler", False, what, f"in {describe_run(name)} rank {r}'s {split} "
                          f"sampler splits the data over {got[0]} replicas as replica {got[1]}; "
                          f"it is replica {dp} of {lay.size['dp']} (mesh.dp_rank() of "
                          "mesh.dp_size()): the ranks of a tp or cp group read the same batches")
                    return
    v.add("sampler", True, what)


def held_formula(lay, rank, d, ff, layers):
    """(attention, mlp) parameters that `rank` holds: q, k, v's rows and linear1's rows split
    over tp, the output projection's and linear2's columns too, their biases whole."""
    tp = lay.size["tp"]
    attention = 3 * d * d // tp + 3 * d // tp + d * d // tp + d
    mlp = ff * d // tp + ff // tp + d * ff // tp + d
    return attention * layers, mlp * layers


def flag(name, default):
    return int(RUN_FLAGS[RUN_FLAGS.index(name) + 1]) if name in RUN_FLAGS else default


def slice_of(name, full, lay, rank):
    """The part of the tp 1 tensor `full` (an archive.Tensor) that `rank` holds of parameter
    `name`, as (shape, values); None where the parameter is not split."""
    tp, t = lay.size["tp"], lay.coords(rank)["tp"]
    shape, vals = list(full.shape), full.values
    if tp == 1:
        return None

    def rows(blocks):
        n = shape[0] // blocks
        width = int(math.prod(shape[1:])) if len(shape) > 1 else 1
        out = []
        for b in range(blocks):
            lo = b * n + t * n // tp
            out += vals[lo * width:(lo + n // tp) * width]
        return [shape[0] // tp] + shape[1:], out

    def cols():
        n = shape[1] // tp
        out = []
        for i in range(shape[0]):
            out += vals[i * shape[1] + t * n:i * shape[1] + (t + 1) * n]
        return [shape[0], n], out

    if name.endswith("attention.qkv.weight") or name.endswith("attention.qkv.bias"):
        return rows(3)
    if name.endswith("mlp.linear1.weight") or name.endswith("mlp.linear1.bias"):
        return rows(1)
    if name.endswith("attention.out.weight") or name.endswith("mlp.linear2.weight"):
        return cols()
    return None


def first_backward(run, rank):
    """{name: (weight, gradient)} that `rank` traced after its first backward, or None."""
    trace = os.path.join(run.dir, "trace")
    try:
        with open(os.path.join(trace, f"first-backward-rank{rank}.names")) as f:
            names = f.read().split()
        t = archive.tensors(os.path.join(trace, f"first-backward-rank{rank}.pt"))
    except (OSError, ValueError):
        return None
    return {n: (t.get(f"w{i}"), t.get(f"g{i}")) for i, n in enumerate(names)}


def differs(a_shape, a_vals, b_shape, b_vals):
    """Why two tensors differ beyond GRAD_TOL, or ""."""
    if list(a_shape) != list(b_shape):
        return f"shape {list(a_shape)}, expected {list(b_shape)}"
    scale = max((abs(x) for x in b_vals), default=0.0) or 1.0
    for i, (x, y) in enumerate(zip(a_vals, b_vals)):
        if abs(x - y) > GRAD_TOL * scale:
            return f"element {i}: {x:.6g}, expected {y:.6g}"
    return ""


def judge_shards(v, runs, concept, part, j):
    """TODO 3 (part "mlp") or 4 ("attention"): what each rank holds, its weights and first
    averaged gradients against the reference's slices, and where its collectives go."""
    what = {"mlp": "the MLP is split column -> row over the tp group: each rank holds its "
                   "slices, their gradients are tp 1's, Megatron's two all-reduces a step",
            "attention": "attention's heads are split over the tp group: each rank holds its "
                         "heads' q, k, v rows and output columns, their gradients are tp 1's, "
                         "two all-reduces a step"}[part]
    d, ff, layers = flag("--d-model", 32), flag("--feedforward", 64), flag("--layers", 1)
    batch = flag("--batch-size", 8)
    seq = flag("--seq-len", 16)
    for name in MESHES:
        run, lay = runs[name], layout_of(name)
        ref = runs["ref2" if lay.size["dp"] == 2 else "ref1"]
        if not ref.finished():
            v.note(concept, f"the solution's reference run failed: {ref.failure()}")
            return
        for r in range(lay.world):
            # What the rank holds.
            h = [m for m in HELD.finditer(run.logs.get(r, "")) if m.group(1) == str(r)]
            if not h:
                if run.finished():
                    v.add(concept, False, what, f"in {describe_run(name)} rank {r} printed no "
                          "\"rank R holds N parameters: ...\" line")
                else:
                    todo, why = j.stop(run)
                    if todo == j.v.todo(concept):
                        v.add(concept, False, what, f"{describe_run(name)} stopped: {why}")
                    else:
                        v.unreached(concept, what, f"{describe_run(name)} stopped before it")
                return
            got = int(h[-1].group(3 if part == "attention" else 4))
            want = held_formula(lay, r, d, ff, layers)[0 if part == "attention" else 1]
            if got != want:
                v.add(concept, False, what, f"in {describe_run(name)} rank {r} holds {got} "
                      f"parameters of {part}; split over tp {lay.size['tp']} it holds {want}")
                return
            # The collectives of the TODO's lines: on the tp group (cp's on the cp group).
            tp_group = lay.members(r, ("tp",))
            cp_group = lay.members(r, ("cp",))
            per_step, steps = 0, 0
            for c in calls(run, r):
                if j.todo_of(c.get("site", "")) != j.v.todo(concept):
                    continue
                on = members_of(c.get("group"), lay.world)
                # Attention's keys and values are all-gathered over cp (reduce-scattered back);
                # the model's file gathers each layer's slices over tp.
                gathers = c.get("kind") in ("all_gather", "reduce_scatter")
                if on != tp_group and not (gathers and on == cp_group):
                    v.add(concept, False, what, f"in {describe_run(name)} rank {r}'s "
                          f"{c.get('kind')} #{c.get('seq')} ({c.get('site')}) is on the group "
                          f"{show(on)}; its tp group is {show(tp_group)}")
                    return
            if lay.size["tp"] > 1:
                per_step = count_per_step(run, r, j, concept, f"[{batch},{seq // lay.size['cp']},{d}]")
                if per_step is not None and per_step != 2 * layers:
                    v.add(concept, False, what, f"in {describe_run(name)} rank {r} made "
                          f"{per_step} all-reduce(s) of [batch, seq, d] on its tp group in the "
                          f"first training step from this TODO's lines; Megatron's split makes "
                          f"{2 * layers} (one forward, one backward, per block)")
                    return
            # The weights and their first averaged gradients: the reference's slices.
            mine = first_backward(run, r)
            theirs = first_backward(ref, lay.coords(r)["dp"] if ref.ranks > 1 else 0)
            if mine is None or theirs is None:
                if run.finished():
                    v.add(concept, False, what, f"in {describe_run(name)} rank {r} traced no "
                          "weights after the first backward (the training forward goes through "
                          "ddp)")
                    return
                v.unreached(concept, what, f"{describe_run(name)} stopped before it")
                return
            for pname, (w, g) in mine.items():
                if f".{part}." not in pname or pname not in theirs:
                    continue
                tw, tg = theirs[pname]
                for kind, a, b in (("weights", w, tw), ("first averaged gradient", g, tg)):
                    cut = slice_of(pname, b, lay, r)
                    shape, vals = cut if cut else (b.shape, b.values)
                    why = differs(a.shape, a.values, shape, vals)
                    if why:
                        whose = "slice of tp 1's" if cut else "tp 1's"
                        v.add(concept, False, what, f"in {describe_run(name)} rank {r}'s "
                              f"{kind} of {pname} are not the matching {whose} ({why})")
                        return
    v.add(concept, True, what)


def count_per_step(run, rank, j, concept, shape):
    """All-reduces of `shape` made from `concept`'s lines between the first training forward and
    the first step's end, or None if the run never got there."""
    seq = run.traces[rank]
    n, started = 0, False
    for k, fields in seq:
        if k == "forward":
            started = True
        elif k == "step" and started:
            return n
        elif k == "coll" and started:
            c = kv(fields)
            if c.get("kind") == "all_reduce" and c.get("shape") == shape.replace(" ", "") and \
                    j.todo_of(c.get("site", "")) == j.v.todo(concept):
                n += 1
    return None


def judge_group(v, runs, concept, what, pick, j, need):
    """Every collective `pick(call)` selects is on the rank's dp x cp group; where that group has
    more than one rank, rank 0 made at least one (need: what it is)."""
    for name in MESHES:
        run, lay = runs[name], layout_of(name)
        made = False
        for r in range(lay.world):
            want = lay.members(r, ("dp", "cp"))
            for c in calls(run, r):
                if not pick(c):
                    continue
                on = members_of(c.get("group"), lay.world)
                made = made or r == 0
                if on != want:
                    v.add(concept, False, what, f"in {describe_run(name)} rank {r}'s "
                          f"{c.get('kind')} #{c.get('seq')} ({c.get('site')}) is on the group "
                          f"{show(on)}; the ranks that hold its weights, its dp x cp group, are "
                          f"{show(want)}")
                    return False
        if not made and len(lay.members(0, ("dp", "cp"))) > 1:
            if run.finished():
                v.add(concept, False, what, f"in {describe_run(name)} rank 0 made no {need}")
                return False
            todo, why = j.stop(run)
            if todo == v.todo(concept):
                v.add(concept, False, what, f"{describe_run(name)} stopped: {why}")
                return False
    return True


def losses_wrong(run, ref, resumed=False):
    if run.failure():
        return run.failure()
    mine, theirs = losses(run), losses(ref)
    if len(mine) != len(theirs):
        return (f"rank 0 printed {len(mine)} of the {len(theirs)} losses (each epoch's train and "
                "validation loss, the test loss)")
    for a, b in zip(mine, theirs):
        if abs(a - b) > LOSS_TOL:
            return f"a printed loss of {a:.5f} where tp 1 has {b:.5f}"
    return ""


def steps_wrong(run, ref, lay):
    """Why the per-step losses (the mean over each cp group of its ranks' step losses, for each dp
    replica) are not the reference's (its rank of that dp replica), or ""."""
    for dp in range(lay.size["dp"]):
        group = [r for r in range(lay.world) if lay.coords(r)["dp"] == dp and lay.coords(r)["tp"] == 0]
        per = [step_losses(run, r) for r in group]
        want = step_losses(ref, dp if ref.ranks > 1 else 0)
        n = min(len(p) for p in per)
        if n < len(want):
            return f"{n} training steps traced where the reference made {len(want)}"
        for k in range(len(want)):
            mean = sum(p[k] for p in per) / len(per)
            if abs(mean - want[k]) > STEP_TOL:
                return (f"step {k + 1}'s loss (dp replica {dp}, the mean over its cp ranks) is "
                        f"{mean:.7f} where the reference's is {want[k]:.7f}")
    return ""


def judge_losses(v, runs, j):
    """TODO 6's printed losses and TODO 7's run at cp 2 against the references."""
    what6 = ("the training mean and the evaluation's sums are averaged (added up) over the "
             "ranks of other data and positions, mesh.dp_cp(), not over the tp copies")
    loss_sites = lambda c: j.todo_of(c.get("site", "")) == v.todo("loss")  # noqa: E731
    grouped = judge_group(v, runs, "loss", what6, loss_sites, j,
                          "collective from TODO 6's lines (the losses are not averaged)")
    if grouped:
        for name in ("tp2", "mesh4"):
            run = runs[name]
            ref = runs["ref2" if layout_of(name).size["dp"] == 2 else "ref1"]
            why = losses_wrong(run, ref) if run.finished() else ""
            if why:
                v.add("loss", False, what6, f"{describe_run(name)}: {why}")
                grouped = False
                break
        if grouped:
            v.add("loss", True, what6)
    what7 = "at cp 2 each rank trains on its part of every sequence, to tp 1's losses step by step"
    run, lay = runs["cp2"], layout_of("cp2")
    if run.failure():
        todo, why = j.stop(run)
        if todo in (None, v.todo("cp")):
            v.add("cp", False, what7, f"{describe_run('cp2')} stopped: {why}")
        else:
            v.add("cp", False, what7, f"{describe_run('cp2')} stopped in TODO {todo}",
                  cause=todo)
        return
    why = steps_wrong(run, runs["ref1"], lay) or losses_wrong(run, runs["ref1"])
    causes = [t for t in (v.todo("ddp"), v.todo("loss"), v.todo("sampler"))
              if t in v.failed()]
    if why and causes:
        v.add("cp", False, what7, f"{why} (TODO {causes[0]} fails above)", cause=causes[0])
    else:
        v.add("cp", not why, what7, why)


def judge_checkpoint(v, check, runs, j):
    what = "every rank saves its own shard and the next run resumes from it to tp 1's losses"
    first = runs["stop"]
    if first.startup:
        v.add("checkpoint", False, what, first.failure())
        return
    if first.failure() and not re.search(r"stop", first.failure() or "", re.I):
        todo, why = j.stop(first)
        if todo and todo != v.todo("checkpoint"):
            v.unreached("checkpoint", what, f"the stopped run stopped in TODO {todo} first")
        else:
            v.add("checkpoint", False, what, f"the run stopped after {STOP_AFTER} steps: {why}")
        return
    saved = os.path.join(first.out_dir, "checkpoints")
    newest = sorted((d for d in (os.listdir(saved) if os.path.isdir(saved) else [])
                     if re.fullmatch(r"step-\d+", d)), key=lambda s: int(s[5:]))
    shards = [f"shard-{r}-of-2.pt" for r in range(2)]
    if not newest or not all(os.path.isfile(os.path.join(saved, newest[-1], "zero", s))
                             for s in shards):
        v.add("checkpoint", False, what, f"after the stop, no checkpoint holds every rank's shard "
              f"({', '.join(shards)} in checkpoints/step-*/zero): rank 0 alone saved what it holds")
        return
    again = resume(check, first)
    if again.failure():
        todo, why = j.stop(again)
        v.add("checkpoint", False, what, f"the second run stopped: {why}")
        return
    if not re.search(r"^resuming from ", again.logs.get(0, ""), re.M):
        v.add("checkpoint", False, what, "the second run did not say \"resuming from ...\": it "
              "started afresh")
        return
    why = losses_wrong(again, runs["ref1"])
    if why:
        v.add("checkpoint", False, what, f"the resumed run: {why} (it went on from other weights "
              "than the stopped run's)")
        return
    v.add("checkpoint", True, what)


def judge(check):
    v, j = check.verdicts, Judge(check)
    runs = launch_all(check)
    for name in MESHES:
        run = runs[name]
        if run.failure():
            todo, why = j.stop(run)
            if todo:
                v.add(todo, False, f"{describe_run(name)} gets to its end", why, first=True)
    judge_mesh(v, runs)
    judge_samplers(v, runs)
    judge_shards(v, runs, "mlp", "mlp", j)
    judge_shards(v, runs, "attention", "attention", j)
    what5 = "DDP averages over the ranks that hold the same weights, mesh.dp_cp()"
    ddp_calls = lambda c: c.get("site", "").startswith("ddp.cpp:")  # noqa: E731
    if judge_group(v, runs, "ddp", what5, ddp_calls, j, "DDP collective"):
        v.add("ddp", True, what5)
    judge_losses(v, runs, j)
    judge_checkpoint(v, check, runs, j)
    judges.check_destroy(v, check.many, check.ranks)
    compare.judge_run(check, f"your run on {check.ranks} ranks (tp 1) follows the solution's")
