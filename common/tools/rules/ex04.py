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
import contextlib
import functools
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor

from checklib import archive, collectives, compare, engine, job_judge, judges
from checklib.evidence import Evidence as SharedEvidence, Placer, needs, verdicts
from checklib.runs import Locked, kv
from rules import ex01

# Exercise 01's flags with 4 heads (they split over tp 2 and 4). Its feedforward width, 64 = 2 d,
# stays: linear1's 64 rows and q, k and v's 3 x 32 differ in number, so a slice of the wrong layer
# shows in its shape.
RUN_FLAGS = list(ex01.RUN_FLAGS)
RUN_FLAGS[RUN_FLAGS.index("--heads") + 1] = "4"
# 5 steps an epoch (of 30): the check looks at each TODO's behaviour, not at a trained model, and
# runs the student's build 8 times (each mutant test runs the whole check: the time adds up).
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
# (2026-11-27, the solution, torch 2.13 CPU): over 60 steps the per-step losses of tp 2, tp 4 and
# dp 2 x tp 2 differ from tp 1's (dp 2's) by at most 9.6e-7, the printed ones not at all; with
# these flags (10 steps) tp 2 by 4.8e-7, dp 2 x tp 2 by 9.6e-7, and cp 2's mean over its cp
# group by 7.1e-7.
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
MESH_LINE = job_judge.MESH_LINE  # "rank R of W: tp a of T, cp b of C, dp c of D (order O)"
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

    complete = True

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
    """The world ranks of a group as the trace names it ("world", or "0,2"), in order."""
    return sorted(collectives.group_members(group, ranks))


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
    return engine.reference_run(check, base, check.data, name, RUN_FLAGS, ranks=ranks)


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
        # One solution run at a time per flag set, shared between checks (--reference-dir).
        with Locked(a.reference_dir) if a.reference_dir else contextlib.nullcontext():
            refs = {"ref1": reference(check, "tp1", 1), "ref2": reference(check, "dp2", 2)}
        out = {name: f.result() for name, f in mine.items()}
    out.update(refs)
    return out


def resume(check, first):
    """The stopped run again, in its out-dir (the later --out-dir wins)."""
    return check.launch(check.args.binary, "resumed", 2, "node", check.data,
                        flags_of("tp2") + ["--out-dir", first.out_dir])


# --- reading them ------------------------------------------------------------------------------
def step_losses(run, rank):
    return [float(kv(f)["loss"]) for f in run.events(rank, "step") if "loss" in kv(f)]


def Judge(check):
    """The places of the student's lines and of failed runs (checklib/evidence.py)."""
    return Placer(check, COLLECTIVE_FILES)


def describe_run(name):
    ranks, flags = MESHES[name]
    return f"the {' '.join(flags)} run on {ranks} ranks"


class Traced:
    """The mesh that each rank of `run` built, from its trace (kit::Mesh records "mesh rank=R
    tp=a/T cp=b/C dp=c/D order=O group_tp=... group_cp-dp=..."): the other TODOs are judged
    against the mesh the student made, right or wrong (TODO 1 judges that one)."""

    def __init__(self, run):
        self.world = run.ranks
        self.at = {r: kv(run.events(r, "mesh")[-1]) for r in range(run.ranks)
                   if run.events(r, "mesh")}
        self.complete = len(self.at) == run.ranks
        first = self.at.get(0, {})
        self.size = {d: int(first.get(d, "0/1").split("/")[1]) for d in ("tp", "cp", "dp")}
        self.order = first.get("order", "")

    def coords(self, r):
        return {d: int(self.at[r][d].split("/")[0]) for d in ("tp", "cp", "dp")}

    def members(self, r, dims):
        return members_of(self.at[r].get("group_" + "-".join(sorted(dims)), str(r)), self.world)


def Evidence(name):
    """What one run shows of each TODO (checklib/evidence.py), described as describe_run does."""
    return SharedEvidence(name, describe_run)


def judge_mesh(e, run, traced, name):
    """TODO 1: the mesh each rank built, against --tp, --cp and --order; its line on every rank."""
    lay = layout_of(name)
    if not traced.at:
        e.unreached("mesh", f"{describe_run(name)} stopped before its ranks made their mesh")
        return
    printed = 0
    for r in range(lay.world):
        if r not in traced.at:
            if run.finished():
                e.fail("mesh", f"rank {r} made no kit::Mesh")
                return
            continue  # a rank killed when another failed may not have written its trace
        want, got = lay.coords(r), traced.coords(r)
        if got != want or traced.order != lay.order or traced.size != lay.size:
            e.fail("mesh", f"rank {r} built a mesh where it sits at tp {got['tp']} of "
                   f"{traced.size['tp']}, cp {got['cp']} of {traced.size['cp']}, dp {got['dp']} of "
                   f"{traced.size['dp']} (order {traced.order}); --tp {lay.size['tp']} --cp "
                   f"{lay.size['cp']} --order {lay.order} put it at tp {want['tp']}, cp "
                   f"{want['cp']}, dp {want['dp']} (the order's first direction varies fastest)")
            return
        said = [m for m in MESH_LINE.finditer(run.logs.get(r, "")) if m.group(1) == str(r)]
        if not said:
            if run.events(r, "sampler") or run.finished():
                others = r and MESH_LINE.search(run.logs.get(0, ""))
                e.fail("mesh", f"rank {r} printed no line \"rank R of W: tp a of T, cp b of C, dp "
                       "c of D (order O)\"" + (" (rank 0's is there: every rank prints its own, "
                                               "with std::printf)" if others else ""))
                return
            continue  # stopped by another rank's failure between its mesh and its line
        printed += 1
    if not printed:
        e.unreached("mesh", f"{describe_run(name)} stopped before its ranks printed their line")
        return
    e.ok("mesh")


def judge_samplers(e, run, traced):
    seen = 0
    for r in range(run.ranks):
        made = [kv(f) for f in run.events(r, "sampler")]
        if len(made) < 3:
            if run.finished():
                e.fail("sampler", f"rank {r} made {len(made)} sampler(s), the trainer 3 (train, "
                       "validation, test)")
                return
            continue  # a rank stopped when another failed: the ranks that got there tell
        seen += 1
        dp, replicas = traced.coords(r)["dp"], traced.size["dp"]
        for split, s in zip(("training", "validation", "test"), made[:3]):
            got = (int(s.get("replicas", -1)), int(s.get("rank", -1)))
            if got != (replicas, dp):
                e.fail("sampler", f"rank {r}'s {split} sampler splits the data over {got[0]} "
                       f"replicas as replica {got[1]}; on the mesh it is dp replica {dp} of "
                       f"{replicas} (mesh.dp_rank() of mesh.dp_size()): the ranks of a tp or cp "
                       "group read the same batches")
                return
    if not seen:
        e.unreached("sampler", f"{describe_run(e.name)} stopped before its samplers")
        return
    e.ok("sampler")


def held_formula(tp, d, ff, layers):
    """(attention, mlp) parameters a rank holds: q, k, v's rows and linear1's rows split over tp,
    the output projection's and linear2's columns too, their biases whole."""
    attention = 3 * d * d // tp + 3 * d // tp + d * d // tp + d
    mlp = ff * d // tp + ff // tp + d * ff // tp + d
    return attention * layers, mlp * layers


def flag(name, default):
    return int(RUN_FLAGS[RUN_FLAGS.index(name) + 1]) if name in RUN_FLAGS else default


def slice_of(name, full, tp, t):
    """The part of the tp 1 tensor `full` (an archive.Tensor) that tp rank t of tp holds of
    parameter `name`, as (shape, values); None where the parameter is not split."""
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
    return first_backward_in(os.path.join(run.dir, "trace"), rank)


@functools.lru_cache(maxsize=None)
def first_backward_in(trace, rank):
    """first_backward's reading, once per file: the MLP's judgment and attention's read the same
    files, and a reference rank's file serves every rank of its dp replica."""
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


def judge_split(e, run, traced, part, j):
    """TODO 3 (part "mlp") or 4 ("attention"), what the run shows without comparing numbers:
    what each rank holds against the formula for its mesh's tp, its lines' collectives on its tp
    group (cp's gathers of keys and values on its cp group), Megatron's two all-reduces a step."""
    d, ff, layers = flag("--d-model", 32), flag("--feedforward", 64), flag("--layers", 1)
    batch, seq = flag("--batch-size", 8), flag("--seq-len", 16)
    tp = traced.size["tp"]
    for r in range(run.ranks):
        held = [m for m in HELD.finditer(run.logs.get(r, "")) if m.group(1) == str(r)]
        if not held:
            if run.finished():
                e.fail(part, f"rank {r} printed no \"rank R holds N parameters: ...\" line")
            else:
                e.unreached(part, f"{describe_run(e.name)} stopped before the model was made")
            return
        got = int(held[-1].group(3 if part == "attention" else 4))
        want = held_formula(tp, d, ff, layers)[0 if part == "attention" else 1]
        if got != want:
            e.fail(part, f"rank {r} holds {got} parameters of {part}; split over its mesh's tp "
                   f"group ({tp} ranks) it holds {want}")
            return
        tp_group, cp_group = traced.members(r, ("tp",)), traced.members(r, ("cp",))
        for c in collectives.calls(run, r):
            if j.todo_of(c.get("site", "")) != j.v.todo(part):
                continue
            on = members_of(c.get("group"), run.ranks)
            # Attention's keys and values are all-gathered over cp (reduce-scattered back); the
            # model's file gathers each layer's slices over tp.
            gathers = c.get("kind") in ("all_gather", "reduce_scatter")
            if on != tp_group and not (gathers and on == cp_group):
                e.fail(part, f"rank {r}'s {c.get('kind')} #{c.get('seq')} ({c.get('site')}) is on "
                       f"the group {show(on)}; its tp group is {show(tp_group)}")
                return
        if tp > 1:
            n = count_per_step(run, r, j, part, f"[{batch},{seq // traced.size['cp']},{d}]")
            if n is None:
                e.unreached(part, f"{describe_run(e.name)} stopped before its first step")
                return
            if n != 2 * layers:
                e.fail(part, f"rank {r} made {n} all-reduce(s) of [batch, seq, d] on its tp "
                       f"group in the first training step from this TODO's lines; Megatron's "
                       f"split makes {2 * layers} (one forward, one backward, per block)")
                return
    e.ok(part)


def count_per_step(run, rank, j, concept, shape):
    """All-reduces of `shape` made from `concept`'s lines between the first training forward and
    the first step's end, or None if the run never got there."""
    n, started = 0, False
    for k, fields in run.traces[rank]:
        if k == "forward":
            started = True
        elif k == "step" and started:
            return n
        elif k == "coll" and started:
            c = kv(fields)
            if c.get("kind") == "all_reduce" and c.get("shape") == shape and \
                    j.todo_of(c.get("site", "")) == j.v.todo(concept):
                n += 1
    return None


def judge_group(e, run, traced, concept, pick, need):
    """Every collective `pick(call)` selects is on the rank's dp x cp group of its mesh; where that
    group has more than one rank, rank 0 made at least one (need: what it is)."""
    made = False
    for r in range(run.ranks):
        want = traced.members(r, ("dp", "cp"))
        for c in collectives.calls(run, r):
            if not pick(c):
                continue
            on = members_of(c.get("group"), run.ranks)
            made = made or r == 0
            if on != want:
                e.fail(concept, f"rank {r}'s {c.get('kind')} #{c.get('seq')} ({c.get('site')}) is "
                       f"on the group {show(on)}; the ranks that hold its weights, its dp x cp "
                       f"group, are {show(want)}")
                return
    if not made and len(traced.members(0, ("dp", "cp"))) > 1:
        if run.finished():
            e.fail(concept, f"rank 0 made no {need}")
        else:
            e.unreached(concept, f"{describe_run(e.name)} stopped before it")
        return
    e.ok(concept)


def judge_cp_inputs(e, run, traced):
    """TODO 7, without numbers: attention's all-gathers over cp hold [batch, heads, seq / cp, ...]
    (each rank its part of every sequence, in training and in evaluation)."""
    seq = flag("--seq-len", 16)
    cp = traced.size["cp"]
    seen = 0
    for r in range(run.ranks):
        cp_group = traced.members(r, ("cp",))
        for c in collectives.calls(run, r):
            if c.get("kind") != "all_gather" or members_of(c.get("group"), run.ranks) != cp_group \
                    or len(cp_group) < 2:
                continue
            dims = [int(x) for x in re.findall(r"\d+", c.get("shape", ""))]
            if len(dims) != 4:
                continue
            seen += 1
            if dims[2] != seq // cp:
                e.fail("cp", f"rank {r}'s all-gather of keys and values #{c.get('seq')} "
                       f"({c.get('site')}) holds {dims[2]} positions of each sequence; its part "
                       f"is {seq} / cp {cp} = {seq // cp} (kit::cp_shard along the sequence, "
                       "dimension 1, of inputs and targets, in training and evaluation)")
                return
    if cp > 1 and not seen:
        if run.finished():
            e.fail("cp", "attention gathered no keys and values over the cp group: each rank "
                   "saw whole sequences")
        else:
            e.unreached("cp", f"{describe_run(e.name)} stopped before it")
        return
    e.ok("cp")


def judge_numbers(e, run, traced, ref, j):
    """The numbers, where the run's structure is right: each rank's weights and first averaged
    gradients of the split parts are the reference's slices (TODOs 3 and 4), and the losses are
    the reference's, per step (a cp group's mean) and printed (TODO 6, or 7 at cp 2)."""
    labels = j.v.labels
    for part in ("mlp", "attention"):
        first = needs(e, ("sampler", "mlp", "attention", "ddp"))
        if first:
            if first != part:
                e.unreached(part, f"its numbers need TODO {labels[first]} first")
            continue
        why = numbers_wrong(run, traced, ref, part)
        if why is None:
            e.unreached(part, f"{describe_run(e.name)} stopped before its first backward")
        elif why:
            e.fail(part, why)
    concept = "cp" if traced.size["cp"] > 1 else "loss"
    first = needs(e, ("sampler", "mlp", "attention", "ddp", "loss", "cp"))
    if first:
        if first != concept:
            e.unreached(concept, f"its losses need TODO {labels[first]} first")
        return
    if run.failure():
        todo, why = j.stop(run)
        e.fail(concept, f"stopped: {why}")
        return
    why = steps_wrong(run, ref, traced) or losses_wrong(run, ref)
    if why:
        e.fail(concept, why)


def numbers_wrong(run, traced, ref, part):
    """Why rank r's weights or first averaged gradients of `part` are not the slices of the
    reference's, "" when they are, None when the run traced none."""
    for r in range(run.ranks):
        mine = first_backward(run, r)
        theirs = first_backward(ref, traced.coords(r)["dp"] if ref.ranks > 1 else 0)
        if mine is None or theirs is None:
            return None
        tp, t = traced.size["tp"], traced.coords(r)["tp"]
        for pname, (w, g) in mine.items():
            if f".{part}." not in pname or pname not in theirs:
                continue
            tw, tg = theirs[pname]
            for kind, a, b in (("weights", w, tw), ("first averaged gradient", g, tg)):
                cut = slice_of(pname, b, tp, t)
                shape, vals = cut if cut else (b.shape, b.values)
                why = differs(a.shape, a.values, shape, vals)
                if why:
                    whose = "slice of tp 1's" if cut else "tp 1's"
                    return (f"rank {r}'s {kind} of {pname} are not the matching {whose} ({why}): "
                            "its part of the block is not the tp 1 block's")
    return ""


def losses_wrong(run, ref):
    mine, theirs = ex01.losses(run), ex01.losses(ref)
    if len(mine) != len(theirs):
        return (f"rank 0 printed {len(mine)} of the {len(theirs)} losses (each epoch's train and "
                "validation loss, the test loss)")
    for a, b in zip(mine, theirs):
        if abs(a - b) > LOSS_TOL:
            return f"rank 0 printed a loss of {a:.5f} where tp 1 has {b:.5f}"
    return ""


def steps_wrong(run, ref, traced):
    """Why the per-step losses (the mean over each cp group of its ranks' step losses, for each dp
    replica) are not the reference's (its rank of that dp replica), or ""."""
    for dp in range(traced.size["dp"]):
        group = [r for r in range(run.ranks)
                 if traced.coords(r)["dp"] == dp and traced.coords(r)["tp"] == 0]
        per = [step_losses(run, r) for r in group]
        want = step_losses(ref, dp if ref.ranks > 1 else 0)
        n = min((len(p) for p in per), default=0)
        if n < len(want):
            return f"{n} training steps traced where the reference made {len(want)}"
        for k in range(len(want)):
            mean = sum(p[k] for p in per) / len(per)
            if abs(mean - want[k]) > STEP_TOL:
                return (f"step {k + 1}'s loss (dp replica {dp}, the mean over its cp ranks) is "
                        f"{mean:.7f} where tp 1's is {want[k]:.7f}")
    return ""


def evidence_of(name, run, ref, j):
    """Everything `run` (one of MESHES) shows, TODO by TODO."""
    e = Evidence(name)
    if run.failure():  # a stop in a TODO's line is that TODO's
        todo, why = j.stop(run)
        concept = next((c for c, label in LABELS.items() if label == todo), None)
        if concept:
            e.fail(concept, f"stopped: {why}")
    traced, lay = Traced(run), layout_of(name)
    judge_mesh(e, run, traced, name)
    if not traced.at:
        for c in LABELS:
            e.unreached(c, f"{describe_run(name)} stopped before its ranks made their mesh")
        return e
    # The other TODOs are judged on the student's mesh where it has the sizes asked for (its
    # order, right or wrong, is TODO 1's: each group is judged as that mesh made it), else on the
    # mesh the flags ask for: a mesh without --tp has no tp group to judge a split against (and
    # where a rank's trace was cut short by another rank's failure, the flags' mesh stands in).
    if not traced.complete or traced.size != lay.size:
        traced = lay
    judge_samplers(e, run, traced)
    judge_split(e, run, traced, "mlp", j)
    judge_split(e, run, traced, "attention", j)
    judge_group(e, run, traced, "ddp", lambda c: c.get("site", "").startswith("ddp.cpp:"),
                "DDP collective")
    judge_group(e, run, traced, "loss", lambda c: j.todo_of(c.get("site", "")) == LABELS["loss"],
                "collective from TODO 6's lines (the losses are not averaged)")
    if traced.size["cp"] > 1:
        judge_cp_inputs(e, run, traced)
    if not ref.finished():
        e.unreached("loss", f"the solution's reference run failed: {ref.failure()}")
        return e
    judge_numbers(e, run, traced, ref, j)
    if run.failure() and name == "cp2" and e.state.get("cp", ("unreached",))[0] != "fail":
        # Stopped outside the TODOs: what a cp 2 run adds to the others is TODO 7's.
        todo, why = j.stop(run)
        wrong = [c for c in ("sampler", "mlp", "attention", "ddp", "loss")
                 if e.state.get(c, ("",))[0] == "fail"]
        # The model's refusal of whole sequences names kit::cp_shard: TODO 7's own evidence.
        if todo is None and (not wrong or "cp_shard" in why):
            e.state.pop("cp", None)
            e.fail("cp", f"stopped: {why}")
    return e


def judge_checkpoint(check, runs, tp2, j):
    """TODO 8: the stopped run left every rank's shard, and the second run resumes from it to tp
    1's losses. Judged where the tp 2 run is right up to its losses."""
    e = Evidence("tp2")
    stopped = runs["stop"]
    if stopped.startup:
        e.fail("checkpoint", stopped.failure())
        return e
    if stopped.failure():
        todo, why = j.stop(stopped)
        if todo and todo != LABELS["checkpoint"]:
            e.unreached("checkpoint", f"the run to stop after {STOP_AFTER} steps stopped in TODO "
                        f"{todo} first")
        else:
            e.fail("checkpoint", f"the run stopped after {STOP_AFTER} steps failed: {why}")
        return e
    saved = os.path.join(stopped.out_dir, "checkpoints")
    steps = sorted((d for d in (os.listdir(saved) if os.path.isdir(saved) else [])
                    if re.fullmatch(r"step-\d+", d)), key=lambda s: int(s[5:]))
    shards = [f"shard-{r}-of-2.pt" for r in range(2)]
    if not steps or not all(os.path.isfile(os.path.join(saved, steps[-1], "zero", s))
                            for s in shards):
        e.fail("checkpoint", f"stopped after {STOP_AFTER} steps, left no checkpoint with every "
               f"rank's shard ({', '.join(shards)} in checkpoints/step-*/zero): rank 0 alone "
               "saved what it holds")
        return e
    # Resumed, its losses are tp 1's only where the tp 2 run's are.
    first = needs(tp2, ("sampler", "mlp", "attention", "ddp", "loss"))
    if first:
        e.unreached("checkpoint", f"every rank saved its shard; the resume needs TODO "
                    f"{LABELS[first]} first")
        return e
    again = resume(check, stopped)
    if again.failure():
        todo, why = j.stop(again)
        e.fail("checkpoint", f"stopped after {STOP_AFTER} steps and run again: the second run "
               f"stopped: {why}")
        return e
    if not re.search(r"^resuming from ", again.logs.get(0, ""), re.M):
        e.fail("checkpoint", f"stopped after {STOP_AFTER} steps and run again: the second run "
               "did not say \"resuming from ...\": it started afresh")
        return e
    why = losses_wrong(again, runs["ref1"])
    if why:
        e.fail("checkpoint", f"stopped after {STOP_AFTER} steps and resumed: {why} (it went on "
               "from other weights than the stopped run's)")
        return e
    e.ok("checkpoint")
    return e


REQUIRED = {"cp": ("cp2",), "checkpoint": ("stop",)}
WHAT = {"mesh": "every rank builds the mesh of --tp, --cp and --order and prints where it sits",
        "sampler": "each rank's samplers split the data over the dp replicas only",
        "mlp": "the MLP is split column -> row over the tp group: each rank its slices, their "
               "gradients tp 1's, two all-reduces a step",
        "attention": "attention's heads are split over the tp group: each rank its heads' q, k, "
                     "v rows and output columns, their gradients tp 1's, two all-reduces a step",
        "ddp": "DDP averages over the ranks that hold the same weights, mesh.dp_cp()",
        "loss": "the losses are averaged (the evaluation's sums added up) over mesh.dp_cp(), "
                "not over the tp copies, to tp 1's losses",
        "cp": "at cp 2 each rank trains on its part of every sequence, to tp 1's losses step by "
              "step",
        "checkpoint": "every rank saves its own shard and a stopped run resumes from it to tp "
                      "1's losses"}


def judge(check):
    v, j = check.verdicts, Judge(check)
    runs = launch_all(check)
    found = {name: evidence_of(name, runs[name], runs["ref2" if name == "mesh4" else "ref1"], j)
             for name in MESHES}
    found["stop"] = judge_checkpoint(check, runs, found["tp2"], j)
    # Each TODO needs the runs that show it: the tensor-parallel ones (tp 2, dp 2 x tp 2), cp 2
    # for TODO 7, the stopped one for TODO 8. The cp 2 run adds to the others where it gets that
    # far; stopped there first by TODO 7's mistake, it takes nothing away.
    verdicts(v, found, WHAT, lambda c: REQUIRED.get(c, ("tp2", "mesh4")), describe_run)
    judges.check_destroy(v, check.many, check.ranks)
    compare.judge_run(check, f"your run on {check.ranks} ranks (tp 1) follows the solution's")
