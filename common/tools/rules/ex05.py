"""Exercise 05 (exercise 01's finished trainer on the model cut into chunks, then pipeline
parallelism on a dp x pp mesh): which runs, which TODO is which, and what each must show.

The engine runs the build as exercise 01's check does, with RUN_FLAGS (pp 1: every rank a
data-parallel replica that holds every chunk): alone, on 2 ranks, and the device check. The
exercise as shipped is such a trainer, so those runs pass it; what the TODOs change shows in the
runs of this file, each on the student's build (MESHES, all at once):

  pp2    2 ranks, --pp 2: 1F1B, 4 micro-batches, a stage of 2 blocks on each rank
  int2   2 ranks, --pp 2 --schedule interleaved --chunks 2: 4 chunks of one block, 2 per rank
  pp4    4 ranks, --pp 4: a block per stage, a middle stage that receives and sends both ways
  mesh4  4 ranks, --pp 2 --schedule gpipe: pp 2 x dp 2, each stage's copies averaged

and the rest of every schedule at every shape (pp 2, pp 4, pp 2 x dp 2; GPipe, 1F1B,
interleaved), judged the same way: gpipe2, gpipe4, int4 (8 blocks: 8 chunks of one), mesh4-1f1b
and mesh4-int. Those four first (CORE) judge each TODO once; `--core-runs` (the tests of the
stages and of the mistakes table, for CI's time) runs only them. And the solution's runs: alone
(pp 1: the losses every pipelined run must reach; with 8 blocks for int4), on 2 ranks (dp 2: the
pp 2 x dp 2 runs'), and each of MESHES with the same flags (the order each rank must follow),
made once per solution binary and flags (--reference-dir).

A TODO passes when, in each run where it matters:
  1  every rank's mesh is the flags' (pp slowest: rank = dp + dp_size x stage) and every rank
     prints its line "rank R of W: tp 0 of 1, cp 0 of 1, dp d of D, pp s of P (order O)";
  2  each rank holds the chunks of its stage ("rank R holds chunks 1,3: N parameters"): chunk c
     on stage c % pp;
  3  in the first training step each rank receives (from TODO 3's lines) one activation per
     forward of a chunk that is not the first, from the previous chunk's rank, and sends one
     per forward of a chunk that is not the last, to the next one's; the first step's loss is
     pp 1's;
  4  rank 0 (and every rank of a pipeline) reports the last stage's losses, pp 1's, printed;
     the loss's collectives are on the rank's pipeline;
  5  the same as 3 for the backward's gradients (TODO 5's lines), the other way; every later
     step's loss is pp 1's;
  6  the averaging's collective (average_gradients', called from TODO 6's line) is on the rank's
     dp group, and at pp 2 x dp 2 the losses are dp 2's;
  7  the first step runs --micro-batches micro-batches through each chunk;
  8  each rank's forwards and backwards of the first step come in the schedule's order (the
     solution's run of the same flags), and in the second step no rank holds more tensor bytes
     at once than the solution's run does (within ACTIVATIONS_TOL: the counting allocator; in
     the runs without a dp group);
  9  the process group is closed at the end (exercise 01's judge, on the engine's run).
Numbers are judged only where the structure they rest on is right; otherwise "not reached", so
that a mistake is named once. A run that stops in a line of a TODO (a kit error ends with the
trainer's line) is that TODO's \u2718."""
import contextlib
import os
import re
from concurrent.futures import ThreadPoolExecutor

from checklib import collectives, compare, engine, job_judge, judges
from checklib.evidence import Evidence as SharedEvidence, Placer, needs, verdicts
from checklib.runs import Locked, kv
from rules import ex01

# Exercise 01's flags with 4 blocks (a stage each at pp 4, a chunk each at pp 2 x 2 chunks) and 4
# heads; batch 8 in 4 micro-batches of 2 (the trainer's default --micro-batches). 5 steps an epoch.
RUN_FLAGS = list(ex01.RUN_FLAGS)
RUN_FLAGS[RUN_FLAGS.index("--heads") + 1] = "4"
RUN_FLAGS[RUN_FLAGS.index("--layers") + 1] = "4"
RUN_FLAGS += ["--max-steps", "5"]
MICRO = 4
NODES_FLAGS = None  # where each rank puts its model is exercise 01's lesson, already passed
EPOCHS = ex01.EPOCHS
# Short runs: a rank that waits 12 s for a message or a collective waits for one that never comes.
# KIT_MEMORY_COUNT: the counting allocator's live bytes around each forward and backward, in the
# trace (judge_activations).
RUN_ENV = {"KIT_TIMEOUT": "12", "KIT_MEMORY_COUNT": "1"}
# The activations held at once, judged in the second step (the first also allocates AdamW's
# moments) against the solution's run of the same flags: at most 10% more, and 16 KiB (a few
# small buffers a rewrite may keep longer). Measured (2026-11-28, torch 2.13 CPU, the check's
# runs): the student's build equal to the solution's to the byte in every run and rank; at pp 2
# rank 0 holds 374 KiB above the step's start under 1F1B and 475 KiB under GPipe, rank 1 (the
# last stage, with the logits) 374 and 791 KiB.
STEP_MEASURED = 1
ACTIVATIONS_TOL = (1.10, 16 * 1024)
MESHES = {"pp2": (2, ["--pp", "2"]),
          "int2": (2, ["--pp", "2", "--schedule", "interleaved", "--chunks", "2"]),
          "pp4": (4, ["--pp", "4"]),
          "mesh4": (4, ["--pp", "2", "--schedule", "gpipe"]),
          "gpipe2": (2, ["--pp", "2", "--schedule", "gpipe"]),
          "gpipe4": (4, ["--pp", "4", "--schedule", "gpipe"]),
          "int4": (4, ["--pp", "4", "--schedule", "interleaved", "--chunks", "2", "--layers", "8"]),
          "mesh4-1f1b": (4, ["--pp", "2"]),
          "mesh4-int": (4, ["--pp", "2", "--schedule", "interleaved", "--chunks", "2"])}
CORE = ("pp2", "int2", "pp4", "mesh4")
# Runs at once: 9 runs of 2 to 4 ranks together would leave a 2-core machine's ranks waiting
# longer than RUN_ENV's timeout for each other.
AT_ONCE = 4
# Printed losses: 5 decimals. Per-step losses (the trace's, 8 digits): the pipelined step adds
# the micro-batches' gradients where pp 1 adds them too (the same micro-batches): measured
# (2026-11-27, the solution, torch 2.13 CPU) equal digit for digit at pp 2, pp 4, interleaved and
# pp 2 x dp 2 against dp 2. The tolerance is for another machine's summation order.
LOSS_TOL = 2e-5
STEP_TOL = 1e-5
RESULT_LINES = ex01.RESULT_LINES
LABELS = {"mesh": "1", "chunks": "2", "forward": "3", "loss": "4", "backward": "5", "dp": "6",
          "micro": "7", "order": "8", "destroy": "9"}
COLLECTIVE_FILES = {}
PLACES = {"init": ("kit::pp::whole_model(", "the line that creates the model"),
          "forward": ("kit::pp::whole_model(", "the model's options (dropout, sizes)"),
          "update": ("torch::optim::AdamW optimizer(", "the line that creates the optimizer"),
          "checkpoint": ("checkpoints.save_sharded(", "the checkpoints' save"),
          "final": ("evaluate(pipe, test_loader", "the final evaluation")}
# "rank R of W: tp 0 of 1, cp 0 of 1, dp d of D, pp s of P (order O)" (the job's check reads it too)
MESH_LINE = job_judge.PP_MESH_LINE
HELD = re.compile(r"^rank (\d+) holds chunks ([0-9,]+): (\d+) parameters\s*$", re.M)
# What the trainer throws when the schedule asks for a micro-batch the batch was not cut into
# (TODO 7's pieces against TODO 8's order).
PIECES = "the batch is cut into"
# Torch's errors where a part of the pipeline is missing, by the TODO that adds it, in TODO order:
# a chunk that is not the first run on the tokens (no receive), a loss taken of an activation (on
# a stage that is not the last: its "classes" are d_model features), a backward of an activation
# started without its gradient (no receive).
SYMPTOMS = [("forward", ("cannot be converted to type int64_t", "expected scalar type Float but found Long")),
            ("loss", ("is out of bounds",)),
            ("backward", ("grad can be implicitly created only for scalar outputs",))]
SYMPTOMS_SAY = {"forward": "a chunk that is not the first ran on the tokens: it received no input",
                "loss": "a stage that is not the last took the loss of its activations",
                "backward": "a backward started without the gradient of its output: it received none"}
# A rank's error for a send, receive or collective that waited in vain, with its line.
TIMED_OUT = re.compile(r"\((\w+\.cpp):(\d+)\) timed out after")
# The collective of average_gradients (outside the TODOs; TODO 6 chooses its group).
AVERAGE_CALL = "kit::all_reduce(flat, kit::ReduceOp::AVG, group);"


def data_key():
    return ex01.data_key()


def prepare_data(check, directory):
    return ex01.prepare_data(check, directory)


# --- the mesh, computed here -------------------------------------------------------------------
class Layout:
    """Where each rank sits for --pp (tp = cp = 1, pp the slowest direction): rank = dp + D s."""

    def __init__(self, world, pp=1, v=1, schedule="1f1b"):
        self.world, self.pp, self.v, self.schedule = world, pp, v, schedule
        self.dp = world // pp

    def stage(self, r):
        return r // self.dp

    def dp_rank(self, r):
        return r % self.dp

    def chunks(self, r):
        return [c for c in range(self.pp * self.v) if c % self.pp == self.stage(r)]

    def rank_of(self, r, chunk):
        """The world rank that runs `chunk` in rank r's pipeline."""
        return self.dp_rank(r) + self.dp * (chunk % self.pp)

    def pipeline(self, r):
        return [self.dp_rank(r) + self.dp * s for s in range(self.pp)]

    def dp_group(self, r):
        return [self.dp * self.stage(r) + d for d in range(self.dp)]

    def last_chunk(self):
        return self.pp * self.v - 1


def layout_of(name):
    ranks, flags = MESHES[name]
    get = lambda f, d: flags[flags.index(f) + 1] if f in flags else d  # noqa: E731
    return Layout(ranks, int(get("--pp", 1)), int(get("--chunks", 1)), get("--schedule", "1f1b"))


def describe_run(name):
    ranks, flags = MESHES[name]
    return f"the {' '.join(flags)} run on {ranks} ranks"


def show(ranks):
    return "{" + ", ".join(str(r) for r in ranks) + "}"


# --- the runs ----------------------------------------------------------------------------------
def active(check):
    """The names of MESHES this check runs: CORE with --core-runs, else all."""
    return list(CORE) if getattr(check.args, "core_runs", False) else list(MESHES)


MODEL_FLAGS = ("--layers",)  # flags of a run that change the model: its pp 1 run has them too


def with_flags(base, extra):
    """`base` with each flag of `extra` set: replaced where `base` has it, else added."""
    out = list(base)
    for k in range(0, len(extra), 2):
        if extra[k] in out:
            out[out.index(extra[k]) + 1] = extra[k + 1]
        else:
            out += extra[k:k + 2]
    return out


def flags_of(name):
    return with_flags(RUN_FLAGS, MESHES[name][1])


def model_flags(name):
    """The flags of MODEL_FLAGS a run of MESHES sets: [] for RUN_FLAGS' model."""
    flags = MESHES[name][1]
    return [x for k in range(0, len(flags), 2) if flags[k] in MODEL_FLAGS for x in flags[k:k + 2]]


def numbers_ref(name):
    """The name of the reference whose losses a run must reach: pp 1's (of its own model), or
    dp 2's at pp 2 x dp 2."""
    if model_flags(name):
        return "ref1-" + name
    return "ref2" if layout_of(name).dp > 1 else "ref1"


def reference(check, name, ranks, flags=None):
    base = check.args.reference_dir or check.workdir
    return engine.reference_run(check, base, check.data, name, flags or RUN_FLAGS, ranks=ranks)


def launch_all(check):
    """The student's runs (active()) and the solution's references, AT_ONCE at a time:
    {name: run}."""
    a, names = check.args, active(check)
    with ThreadPoolExecutor(min(AT_ONCE, len(names))) as pool:
        mine = {name: pool.submit(check.launch, a.binary, name, MESHES[name][0], "node",
                                  check.data, flags_of(name))
                for name in names}
        # One solution run at a time per flag set, shared between checks (--reference-dir).
        with Locked(a.reference_dir) if a.reference_dir else contextlib.nullcontext():
            refs = {"ref1": reference(check, "pp1", 1), "ref2": reference(check, "dp2", 2)}
            for name in names:
                if model_flags(name):
                    refs["ref1-" + name] = reference(check, "pp1-" + name, 1,
                                                     with_flags(RUN_FLAGS, model_flags(name)))
                refs["order-" + name] = reference(check, "order-" + name, MESHES[name][0],
                                                  flags_of(name))
        out = {name: f.result() for name, f in mine.items()}
    out.update(refs)
    return out


# --- reading them ------------------------------------------------------------------------------
def step_losses(run, rank):
    return [float(kv(f)["loss"]) for f in run.events(rank, "step") if "loss" in kv(f)]


def first_step(run, rank, j, partial=False):
    """Rank `rank`'s trace up to its first training step's end: [(kind, fields)]. A run that
    stopped in the first step's average (TODO 6's group: the stages' gradients differ in
    number) ran all of its forwards and backwards: up to that collective. None when it never got
    there."""
    out = []
    for k, fields in run.traces.get(rank, []):
        if k == "step" or (k == "coll" and kv(fields).get("site") == j.average_site()):
            return out
        out.append((k, fields))
    if not partial:
        return None
    # Stopped in the step: what completed. A receive is traced when it is posted, before the
    # action that needs it; an action when it ends, and its sends after it. Up to the last
    # action and the sends that follow it.
    end = max((i for i, (k, _) in enumerate(out) if k == "pp"), default=-1) + 1
    while end < len(out) and out[end][0] == "p2p" and kv(out[end][1]).get("kind") == "send":
        end += 1
    return out[:end]


def actions(events):
    """The forwards and backwards in `events`, as "1F0" (chunk, kind, micro-batch)."""
    out = []
    for k, fields in events:
        if k == "pp":
            f = kv(fields)
            out.append(f"{f.get('stage')}{f.get('kind')}{f.get('mb')}")
    return out


def p2p(events, kind, todo, j):
    """The sends or receives (`kind`) of `events` made from TODO `todo`'s lines: [fields]."""
    return [kv(fields) for k, fields in events
            if k == "p2p" and kv(fields).get("kind") == kind and j.todo_of(kv(fields).get("site", "")) == todo]


class Judge(Placer):
    """The places of the student's lines and of failed runs (checklib/evidence.py), with this
    exercise's own: average_gradients' all-reduce, and torch's errors by their symptom."""

    def __init__(self, check):
        super().__init__(check, COLLECTIVE_FILES)

    def concept_of(self, site):
        """The concept of a call site: its TODO's, or TODO 6's for average_gradients' all-reduce
        (outside the TODOs, called from TODO 6's line)."""
        if site == self.average_site():
            return "dp"
        todo = self.todo_of(site)
        return next((c for c, label in LABELS.items() if label == todo), None)

    def average_site(self):
        """"train.cpp:N" of the all-reduce in average_gradients, found by its text."""
        if not hasattr(self, "_average"):
            self._average = None
            try:
                with open(self.check.source) as f:
                    for n, line in enumerate(f, 1):
                        if AVERAGE_CALL in line:
                            self._average = f"{os.path.basename(self.check.source)}:{n}"
                            break
            except OSError:
                pass
        return self._average

    def waits_in_vain(self, run):
        """((steps, actions), TODO) of each rank whose own wait timed out, with how far it got:
        its training steps and its forwards and backwards since. The ranks of a cycle of waits
        time out at about the same time, and which one gives up first is chance (a loaded
        machine). The rank furthest behind waits for what a rank ahead of it passed by (a send
        the stage after it never posted before it went on to the loss's broadcast; a collective
        a rank left behind for its next step): its line is where the ranks parted. Among ranks
        equally far, the earliest TODO (a forward's send missing: the next stage waits in TODO
        3's receive, the stage before in TODO 5's, and neither did any action)."""
        out = []
        for r in range(run.ranks):
            events = run.traces.get(r, [])
            steps = [i for i, (k, _) in enumerate(events) if k == "step"]
            since = events[steps[-1] + 1:] if steps else events
            progress = (len(steps), sum(1 for k, _ in since if k == "pp"))
            # Its log, else the launcher's lines of it (a layout whose logs are elsewhere).
            said = run.logs.get(r) or "".join(
                l for l in run.stderr.splitlines(True) if l.startswith(f"rank {r}: "))
            for m in TIMED_OUT.finditer(said):
                todo = self.todo_of(f"{m.group(1)}:{m.group(2)}")
                if todo and todo.isdigit():
                    out.append((progress, int(todo)))
        return out

    def explain(self, run, s=None):
        s = s or self.placed(run)
        named, text = super().explain(run, s)
        site = s.site
        # The trainer's own refusal: the schedule asked for a micro-batch the batch was not cut
        # into. The pieces are TODO 7's.
        if PIECES in text:
            named = LABELS["micro"]
        # Ranks that each waited in vain (a message or a collective that never came).
        waited = self.waits_in_vain(run)
        if waited:
            named = str(min(waited)[1])
        # An undefined gradient to send back: the received input had no requires_grad_ (TODO 3).
        if named == LABELS["backward"] and re.search(r"undefined|not defined|was given no tensor",
                                                     run.stderr, re.I):
            named = LABELS["forward"]
            text += " (the input received in the forward has no gradient: it needs requires_grad_)"
        # Stopped in average_gradients' all-reduce: the group TODO 6 gave it (the stages of a
        # pipeline hold different numbers of gradients).
        if site and site == self.average_site():
            named = LABELS["dp"]
        # Torch's own errors where a pipeline's part is missing (no kit line to place them by):
        # the earliest TODO whose symptom any rank shows.
        for concept, symptoms in SYMPTOMS:
            if any(sym in run.stderr for sym in symptoms):
                named = LABELS[concept]
                text += f" ({SYMPTOMS_SAY[concept]})"
                break
        # A chunk the schedule runs that this rank does not hold: TODO 2's split.
        if "is not on this rank" in text:
            named = LABELS["chunks"]
        return named, text


def Evidence(name):
    """What one run shows of each TODO (checklib/evidence.py), described as describe_run does."""
    return SharedEvidence(name, describe_run)


# --- the judgments -----------------------------------------------------------------------------
def judge_mesh(e, run, lay):
    """TODO 1: each rank's mesh (the trace's "mesh ... dp=d/D pp=s/P") and its printed line."""
    traced = {r: kv(run.events(r, "mesh")[-1]) for r in range(run.ranks) if run.events(r, "mesh")}
    if not traced:
        e.unreached("mesh", f"{describe_run(e.name)} stopped before its ranks made their mesh")
        return
    printed = 0
    for r in range(run.ranks):
        if r not in traced:
            if run.finished():
                e.fail("mesh", f"rank {r} made no kit::Mesh")
                return
            continue
        got = traced[r]
        if "pp" not in got:
            e.fail("mesh", f"rank {r} built a mesh without pp (tp {got.get('tp')}, cp "
                   f"{got.get('cp')}, dp {got.get('dp')}): --pp {lay.pp} asks for {lay.pp} stages")
            return
        want = f"{lay.stage(r)}/{lay.pp}", f"{lay.dp_rank(r)}/{lay.dp}"
        if (got.get("pp"), got.get("dp")) != want or got.get("tp") != "0/1" or got.get("cp") != "0/1":
            e.fail("mesh", f"rank {r} sits at pp {got.get('pp')}, dp {got.get('dp')}, tp "
                   f"{got.get('tp')}; --pp {lay.pp} on {run.ranks} ranks puts it at pp {want[0]}, "
                   f"dp {want[1]} (pp the slowest direction)")
            return
        said = [m for m in MESH_LINE.finditer(run.logs.get(r, "")) if m.group(1) == str(r)]
        if not said:
            if run.finished():
                others = r and MESH_LINE.search(run.logs.get(0, ""))
                e.fail("mesh", f"rank {r} printed no line \"rank R of W: tp 0 of 1, cp 0 of 1, dp "
                       "d of D, pp s of P (order O)\"" +
                       (" (rank 0's is there: every rank prints its own, with std::printf)"
                        if others else ""))
                return
            continue
        printed += 1
    if not printed:
        e.unreached("mesh", f"{describe_run(e.name)} stopped before its ranks printed their line")
        return
    e.ok("mesh")


def judge_chunks(e, run, lay):
    """TODO 2: each rank holds the chunks of its stage."""
    held = {int(m.group(1)): [int(c) for c in m.group(2).split(",")]
            for r in range(run.ranks) for m in HELD.finditer(run.logs.get(r, ""))}
    if not held:
        e.unreached("chunks", f"{describe_run(e.name)} stopped before its ranks took their chunks")
        return
    for r in range(run.ranks):
        if r not in held:
            if run.finished():
                e.fail("chunks", f"rank {r} printed no line \"rank R holds chunks ...\"")
                return
            continue
        if held[r] != lay.chunks(r):
            e.fail("chunks", f"rank {r} holds chunk(s) {show(held[r])}; stage {lay.stage(r)} of "
                   f"{lay.pp} with {lay.v} chunk(s) per rank holds {show(lay.chunks(r))} (chunk "
                   f"c on stage c % pp: kit::pp::take_chunks with mesh.pp_size(), the --chunks "
                   "value and mesh.pp_rank())")
            return
    e.ok("chunks")


def judge_messages(e, run, lay, j, concept, todo, partial=False):
    """TODO 3 (the forward's activations) or 5 (the backward's gradients), without numbers: in
    the first training step, each rank's receives and sends from the TODO's lines, with peers."""
    backward = concept == "backward"
    reached = False
    shown = False  # a message was due: an action that needs one ran
    for r in range(run.ranks):
        first = first_step(run, r, j, partial)
        if first is None:
            continue
        reached = True
        # Forward: a receive per forward of a chunk that is not the first, from the previous
        # chunk's rank; a send per forward of a chunk that is not the last, to the next one's.
        # Backward: the other way. As many as the step's actions (TODO 7 decides how many).
        last = lay.last_chunk()
        ran = [re.fullmatch(r"(\d+)([FB])(\d+)", a) for a in actions(first)]
        ran = [(int(m.group(1)), m.group(2)) for m in ran if m]
        kind = "B" if backward else "F"
        towards = (lambda c: c + 1) if backward else (lambda c: c - 1)  # where it comes from
        away = (lambda c: c - 1) if backward else (lambda c: c + 1)
        want_recv = sorted(lay.rank_of(r, towards(c)) for c, k in ran
                           if k == kind and 0 <= towards(c) <= last)
        want_send = sorted(lay.rank_of(r, away(c)) for c, k in ran
                           if k == kind and 0 <= away(c) <= last)
        mine = lay.chunks(r)
        shown = shown or bool(want_recv or want_send)
        got_recv = sorted(int(f.get("peer", -1)) for f in p2p(first, "recv", todo, j))
        got_send = sorted(int(f.get("peer", -1)) for f in p2p(first, "send", todo, j))
        what = "gradient" if backward else "activation"
        for direction, got, want in (("received", got_recv, want_recv), ("sent", got_send, want_send)):
            if got != want:
                e.fail(concept, f"rank {r} {direction} {len(got)} {what}(s) from TODO {todo}'s lines "
                       f"in the first training step (peers {show(got) if got else 'none'}); the "
                       f"{'backwards' if backward else 'forwards'} of its chunks {show(mine)} in "
                       f"that step need {len(want)} (peers {show(sorted(set(want))) if want else 'none'})")
                return
    if not reached or (partial and not shown):
        e.unreached(concept, f"{describe_run(e.name)} stopped before its first training step ended")
        return
    e.ok(concept)


def judge_micro(e, run, lay, j):
    """TODO 7: the first step runs MICRO micro-batches through each of the rank's chunks."""
    for r in range(run.ranks):
        first = first_step(run, r, j)
        if first is None:
            continue
        seen = {}
        for a in actions(first):
            m = re.fullmatch(r"(\d+)F(\d+)", a)
            if m:
                seen.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
        for c in lay.chunks(r):
            if len(seen.get(c, ())) != MICRO:
                e.fail("micro", f"rank {r} ran {len(seen.get(c, ()))} micro-batch(es) forward "
                       f"through chunk {c} in the first training step; --micro-batches {MICRO}")
                return
        e.ok("micro")
        return
    e.unreached("micro", f"{describe_run(e.name)} stopped before its first training step ended")


def waiting_in(run, rank, j):
    """The action a rank that stopped was waiting to start: from its last receive, posted and
    never followed by an action (the trainer's tags: (chunk x micro-batches + micro-batch) x 2,
    + 1 for a gradient, of the chunk that sends). [] when it waits for nothing."""
    events = run.traces.get(rank, [])
    last_action = max((i for i, (k, _) in enumerate(events) if k == "pp"), default=-1)
    recvs = [kv(f) for k, f in events[last_action + 1:] if k == "p2p" and kv(f).get("kind") == "recv"]
    if not recvs or not recvs[-1].get("tag", "").isdigit():
        return []
    tag = int(recvs[-1]["tag"])
    sender, micro = divmod(tag // 2, MICRO)
    return [f"{sender - 1}B{micro}"] if tag % 2 else [f"{sender + 1}F{micro}"]


def waits_for_nothing(run, lay, j):
    """A rank of a stopped run whose last receive asks for a message that feeds none of its
    chunks (a wrong tag: it never comes), as (concept, sentence), or None."""
    for r in range(run.ranks):
        action = waiting_in(run, r, j)
        if not action:
            continue
        chunk = int(re.match(r"-?\d+", action[0]).group(0))
        if chunk not in lay.chunks(r):
            events = run.traces.get(r, [])
            recv = [kv(f) for k, f in events if k == "p2p" and kv(f).get("kind") == "recv"][-1]
            concept = j.concept_of(recv.get("site", "")) or "forward"
            return concept, (f"rank {r} waits in a receive with tag {recv.get('tag')} "
                             f"({recv.get('site')}), which no message to its chunks "
                             f"{show(lay.chunks(r))} carries: the tag names the chunk that sends, "
                             "p.tag(kind, the sender's chunk, micro-batch)")
    return None


def order_broken(run, ref, lay, j):
    """For a run that stopped: the first rank whose actions so far are not the start of the
    schedule's list (a list that leaves out chunks waits forever), as a sentence, or ""."""
    for r in range(run.ranks):
        got = actions(first_step(run, r, j, partial=True) or []) + waiting_in(run, r, j)
        want = actions(first_step(ref, r, j) or [])
        if got and got != want[:len(got)]:
            k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
            return (f"rank {r}'s first step runs {' '.join(got[:k + 1])} where the {lay.schedule} "
                    f"schedule runs {' '.join(want[:k + 1])} (action {k + 1} differs; the list is "
                    "p.schedule, kit::pp::actions)")
    return ""


def judge_order(e, run, ref, lay, j):
    """TODO 8: each rank's forwards and backwards of the first step in the order of the
    solution's run of the same flags (the schedule's list, kit::pp::actions)."""
    if not ref.finished():
        e.unreached("order", f"the solution's run of the same flags failed: {ref.failure()}")
        return
    compared = 0
    for r in range(run.ranks):
        first = first_step(run, r, j)
        if first is None:
            continue
        got, want = actions(first), actions(first_step(ref, r, j) or [])
        if got != want:
            k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            e.fail("order", f"rank {r}'s first step runs {' '.join(got[:k + 3])}{' ...' if len(got) > k + 3 else ''}"
                   f" where the {lay.schedule} schedule runs {' '.join(want[:k + 3])}"
                   f"{' ...' if len(want) > k + 3 else ''} (action {k + 1} differs; the list is "
                   "p.schedule, kit::pp::actions)")
            return
        compared += 1
    if not compared:
        e.unreached("order", f"{describe_run(e.name)} stopped before its first training step ended")
        return
    e.ok("order")


def step_actions(run, rank, k):
    """Rank `rank`'s forwards and backwards of training step k (0: the first), as the trace's
    fields, or [] when the run did not get there."""
    steps, cur = [], []
    for kind, fields in run.traces.get(rank, []):
        if kind == "step":
            steps.append(cur)
            cur = []
        elif kind == "pp":
            cur.append(kv(fields))
    return steps[k] if k < len(steps) else []


def activations_peak(acts):
    """The most live tensor bytes above the step's start, after any of its actions (`acts`, with
    the counting allocator's live0/live: KIT_MEMORY_COUNT), and one forward's growth (the step's
    first): (peak, forward) in bytes, or None when the trace has no live bytes."""
    if not acts or "live" not in acts[0] or "live0" not in acts[0]:
        return None
    base = int(acts[0]["live0"])
    return max(int(a["live"]) for a in acts) - base, int(acts[0]["live"]) - base


def judge_activations(e, run, ref, lay):
    """TODO 8, measured: in the second training step (the first allocates the optimizer's state)
    each rank holds at most ACTIVATIONS_TOL more live tensor bytes above the step's start than the
    solution's run of the same flags does: 1F1B keeps about pp micro-batches' activations alive,
    GPipe all of them. The bytes come from the counting allocator (RUN_ENV's KIT_MEMORY_COUNT),
    recorded around each forward and backward (kit/check/observe.h). It counts CPU tensors: in a
    check on GPUs (a Slurm allocation) the activations are on the devices, the counted host bytes
    hardly move, and this judges nothing there. Nor at pp x dp: the dp group's gradient
    all-reduces run in Gloo's threads beside the step's actions, and how many of their buffers are
    alive when an action ends depends on the machine's load (a CI run of 2026-11-28 measured the
    solution's own build 447 KiB against its reference's 282 at pp 2 x dp 2, interleaved); the
    pipelines without dp (pp 2 and pp 4, every schedule) show what each schedule keeps."""
    if lay.dp > 1:
        return
    for r in range(run.ranks):
        got = activations_peak(step_actions(run, r, STEP_MEASURED))
        want = activations_peak(step_actions(ref, r, STEP_MEASURED))
        if got is None or want is None:
            continue  # a run without the count (KIT_MEMORY_COUNT unset), or a short one
        ratio, slack = ACTIVATIONS_TOL
        if got[0] > want[0] * ratio + slack:
            e.fail("order", f"rank {r} held {got[0] / 1024:.0f} KiB of tensors above step "
                   f"{STEP_MEASURED + 1}'s start at its fullest, where the solution's "
                   f"{lay.schedule} run of the same flags holds {want[0] / 1024:.0f} KiB (one "
                   f"forward keeps about {max(want[1], 1) / 1024:.0f} KiB): activations stay alive "
                   "longer than the schedule keeps them (a backward late, or a reference kept to "
                   "a micro-batch's tensors after its backward)")
            return


def judge_group(e, run, j, concept, want_of, need):
    """The collectives from the TODO's lines (for TODO 6: the all-reduce of average_gradients,
    which its line calls) are on the group want_of(rank) gives."""
    made = False
    for r in range(run.ranks):
        want = want_of(r)
        for c in collectives.calls(run, r):
            if j.concept_of(c.get("site", "")) != concept:
                continue
            on = collectives.group_members(c.get("group"), run.ranks)
            made = made or r == 0
            if on != want:
                e.fail(concept, f"rank {r}'s {c.get('kind')} #{c.get('seq')} ({c.get('site')}) "
                       f"is on the group {show(on)}; {need} is {show(want)}")
                return
    if not made and len(want_of(0)) > 1:
        if run.finished():
            e.fail(concept, f"rank 0 made no collective from TODO {LABELS[concept]}'s lines")
        else:
            e.unreached(concept, f"{describe_run(e.name)} stopped before it")
        return
    e.ok(concept)


def judge_numbers(e, run, lay, ref):
    """The losses, where the structure they rest on is right: the last stage's first step
    (TODO 3's forward), its later steps (TODO 5's backward, or TODO 6's average at dp 2), every
    rank's (TODO 4) and rank 0's printed losses (TODO 4)."""
    later = "dp" if lay.dp > 1 else "backward"
    for before, judged in ((("mesh", "chunks", "micro", "forward"), ("forward", later, "loss")),
                           (("backward", later), (later, "loss"))):
        first = needs(e, before)
        if first:
            for c in judged:
                if c != first:
                    e.unreached(c, f"its losses need TODO {LABELS[first]} first")
            return
        step = 0 if judged[0] == "forward" else 1
        for d in range(lay.dp):
            last = lay.rank_of(d, lay.last_chunk())
            got, want = step_losses(run, last), step_losses(ref, d if ref.ranks > 1 else 0)
            for k in range(step, 1 if step == 0 else len(want)):
                if k >= len(got) or abs(got[k] - want[k]) > STEP_TOL:
                    who = "dp 2" if lay.dp > 1 else "pp 1"
                    why = ("the forward does not compute what the unsplit model does" if k == 0
                           else "the first step's is right: the gradients are not " +
                           ("averaged over the copies of the stage" if judged[0] == "dp"
                            else "those of the unsplit model"))
                    e.fail(judged[0], f"step {k + 1}'s loss on the last stage (rank {last}) is "
                           f"{got[k] if k < len(got) else 'missing'} where {who}'s is "
                           f"{want[k]:.7f}: {why}", numbers=True)
                    return
        e.ok(judged[0])
    # TODO 4: every rank of a pipeline reports its last stage's losses; rank 0 prints them.
    for r in range(run.ranks):
        last = lay.rank_of(r, lay.last_chunk())
        mine, theirs = step_losses(run, r), step_losses(run, last)
        if mine != theirs:
            k = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), 0)
            e.fail("loss", f"rank {r} reports step {k + 1}'s loss as "
                   f"{mine[k] if k < len(mine) else 'nothing'}, its last stage (rank {last}) "
                   f"{theirs[k] if k < len(theirs) else 'nothing'}: only the last stage computes "
                   "the loss; the other stages of its pipeline get it from there", numbers=True)
            return
    theirs, mine = ex01.losses(ref), ex01.losses(run)
    if len(mine) != len(theirs) or any(abs(a - b) > LOSS_TOL for a, b in zip(mine, theirs)):
        e.fail("loss", f"rank 0 printed the losses {mine} where "
               f"{'dp 2' if lay.dp > 1 else 'pp 1'} prints {theirs}", numbers=True)
        return
    e.ok("loss")


def evidence_of(name, run, refs, j):
    """Everything `run` (one of MESHES) shows, TODO by TODO."""
    e, lay = Evidence(name), layout_of(name)
    failed = bool(run.failure())
    # Each TODO's structure is judged on the mesh and chunks the flags ask for, whatever the
    # student's mesh is (TODO 1's judgment): a missing TODO fails on its own evidence. A run that
    # stopped shows its messages up to the stop.
    judge_mesh(e, run, lay)
    judge_chunks(e, run, lay)
    judge_micro(e, run, lay, j)
    judge_messages(e, run, lay, j, "forward", LABELS["forward"], partial=failed)
    judge_messages(e, run, lay, j, "backward", LABELS["backward"], partial=failed)
    lost = waits_for_nothing(run, lay, j) if failed else None
    if lost:
        e.fail(*lost)
    broken = order_broken(run, refs["order-" + name], lay, j) if failed and not lost else ""
    if broken:  # the order the ranks followed left them waiting for each other
        e.fail("order", broken)
    judge_order(e, run, refs["order-" + name], lay, j)
    if not failed and e.state.get("order", ("",))[0] == "ok":
        judge_activations(e, run, refs["order-" + name], lay)
    judge_group(e, run, j, "loss", lay.pipeline, "the rank's pipeline (the ranks of its stages)")
    if lay.dp > 1:
        judge_group(e, run, j, "dp", lay.dp_group, "the copies of the rank's stage, its dp group")
    if failed:
        # Where it stopped: the TODO whose line (or symptom) the error names. A message that never
        # came is explained by a wrong list or a message not sent, if the trace shows one.
        todo, why = j.stop(run)
        concept = next((c for c, label in LABELS.items() if label == todo), None)
        fails = lambda c: e.state.get(c, ("",))[0] == "fail"  # noqa: E731
        explained = fails("order") or fails("forward") or fails("backward")
        if concept in ("forward", "backward") and "timed out" in why and explained:
            concept = None
        if concept:
            e.fail(concept, f"stopped: {why}")
        # After the first TODO that failed, nothing this run shows is sure: its evidence stops
        # early (the micro-batches and the order of a first step that ran to its end stand).
        first = min((int(LABELS[c]) for c in LABELS if c != "destroy" and fails(c)), default=None)
        complete = all(first_step(run, r, j) is not None for r in range(run.ranks))
        for c in ("chunks", "forward", "loss", "backward", "dp", "micro", "order"):
            label = int(LABELS[c])
            if first is not None and label > first and not (complete and c in ("micro", "order")):
                e.state[c] = ("unreached", f"{describe_run(name)} stopped: {why}")
            elif (first is None or label < first) and c in ("forward", "loss", "backward", "dp") \
                    and e.state.get(c, ("",))[0] != "fail":
                e.state[c] = ("ok", "")  # its numbers are not there; the stop is a later TODO's
        return e
    ref = refs[numbers_ref(name)]
    if not ref.finished():
        e.unreached("loss", f"the solution's reference run failed: {ref.failure()}")
        return e
    judge_numbers(e, run, lay, ref)
    return e


# A concept's losses rest on these: where one of them failed, its own failure is not reported.
AFTER = {"loss": ("forward", "backward"), "dp": ("forward", "backward")}


def required(names):
    """concept -> the runs that must show it ok: the dp average those of pp 2 x dp 2, the order
    every run, the rest the runs without dp."""
    def needed(concept):
        if concept == "dp":
            return [n for n in names if layout_of(n).dp > 1]
        if concept == "order":
            return names
        return [n for n in names if layout_of(n).dp == 1]
    return needed

WHAT = {"mesh": "every rank builds the dp x pp mesh of --pp and prints where it sits",
        "chunks": "each rank keeps the chunks of its stage (chunk c on stage c % pp)",
        "forward": "each stage receives its input from the previous one and sends its output on; "
                   "the first step's loss is pp 1's",
        "loss": "the last stage's loss reaches every rank of its pipeline; rank 0 prints pp 1's "
                "losses",
        "backward": "each stage receives its output's gradient and sends its input's back; every "
                    "step's loss is pp 1's",
        "dp": "the gradients are averaged over the copies of each stage, mesh.dp(): pp 2 x dp 2 "
              "reaches dp 2's losses",
        "micro": "each batch goes through in --micro-batches micro-batches",
        "order": "each rank's forwards and backwards come in the schedule's order (1F1B, GPipe, "
                 "interleaved)"}
# Stages 2 to 4 stop in their first pipelined step: a pipeline runs only once the forward's
# messages (TODO 3), the loss on the last stage alone (4) and the backward's messages (5) are all
# there. Each stage's stop names its next TODO; the TODOs after that one show nothing until the
# pipeline runs, and are "not reached" (tests/student/expect_stage.py accepts exactly these).
# Stage 5 runs its first step's forwards and backwards, and stops in the average (TODO 6, the
# world's all-reduce of the different stages' gradients): its actions are judged.
NOT_REACHED_AT_STAGE = {k: [str(t) for t in range(k + 2, 9)] for k in (2, 3, 4)}


def judge(check):
    v, j = check.verdicts, Judge(check)
    runs, names = launch_all(check), active(check)
    found = {name: evidence_of(name, runs[name], runs, j) for name in names}
    # Numbers that follow a TODO already failed by its structure are that mistake seen again (a
    # wrong backward also changes pp 2 x dp 2's losses): AFTER.
    verdicts(v, found, WHAT, required(names), describe_run, AFTER)
    judges.check_destroy(v, check.many, check.ranks)
    compare.judge_run(check, f"your run on {check.ranks} ranks (pp 1) follows the solution's")
