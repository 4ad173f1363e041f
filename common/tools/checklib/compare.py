"""Where the student's run leaves the solution's: both runs' traces, compared event by event.

The check runs the solution with the same flags, data and ranks (checklib/engine.py). When every
TODO passes and the final loss still differs, a verdict that says "look at the first ✘ above"
leaves the student nowhere to go. So this module walks both runs' traces (common/kit/check/trace.h) and
names the first event where they part: setup()'s seed, a sampler's seed, the epoch a sampler was
told, the samples a batch read, the weights a step starts from, a step's loss, a collective, the
value an all_reduce got, a printed line, a saved file. Then it places that event: in a TODO (by
its concept, or by the TODO block its line falls in) or on a line of the trainer outside the
TODOs, which the exercise's rules name by a piece of its text (PLACES), never by its number.

Compared is what changes the run; not compared is what may differ between two correct programs:
timings, pids, devices, the call sites' line numbers, the reduction op (SUM and then dividing
equals AVG), the seed of a sampler that does not shuffle. Numbers agree within a relative 1e-5,
and a printed number within one unit of its last printed digit. Events of one kind form a
channel and are compared in order within it; how channels interleave may differ (a sampler made
before or after another) without harm. The first difference is the earliest one by the training
step it happened in, then by its place in the trace.
"""
import difflib
import math
import os
import re
from collections import namedtuple

from . import collectives
from .build_errors import annotated_parts, norm, todo_at
from .runs import kv, read

REL_TOL = 1e-5
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
SPLITS = {"train": "training", "valid": "validation", "test": "test"}
# How alike (difflib's ratio) a student's line must be to a TODO block's line to count as an
# edit of it: kit::barrier() beside kit::destroy_process_group() is 0.55, a new line.
LIKE = 0.6

# One comparable event: its channel (events compared with each other, in order), the values that
# must agree, when it happened ((training steps begun, index in the trace)), and where it was
# called from when the trace says so ("train.cpp:74").
Event = namedtuple("Event", "channel fields at site text")
# The first difference: rank, the channel, the position in it, and the two events (None: absent).
Difference = namedtuple("Difference", "rank channel index mine theirs at")


def printed(text):
    """A printed line: its words, and its numbers, each with one unit of its last printed digit
    (rounding moves a value by less); whole numbers (an epoch, a count) must be equal."""
    numbers = []
    for n in NUMBER.findall(text):
        mantissa, _, exponent = n.lower().partition("e")
        decimals = len(mantissa.partition(".")[2])
        unit = 10.0 ** (int(exponent or 0) - decimals) if "." in mantissa or exponent else 0.0
        numbers.append((float(n), unit))
    return {"words": NUMBER.sub("#", text), "numbers": tuple(numbers)}


def events(run, rank, result_lines=()):
    """The comparable events of one rank's trace, in order. What rank 0 printed with print0 is
    in the trace (the other ranks' print0 prints nothing). result_lines: patterns of the lines
    that report results, the only printed lines compared; where a rank printed none with print0,
    its output lines that match them are what it printed (std::printf on every rank, or on
    rank 0 only)."""
    out, step, site = [], 0, ""
    trace = run.traces[rank]
    shuffling = {kv(t).get("size") for k, t in trace if k == "sampler" and kv(t).get("shuffle") == "1"}
    for i, (kind, text) in enumerate(trace):
        f = kv(text)
        fields, channel = None, (kind,)
        if kind == "forward":
            step = int(f.get("step", step + 1))
            fields = {"weights": float(f.get("params", "nan"))}
        elif kind == "step":
            fields = {"loss": float(f.get("loss", "nan"))}
        elif kind == "batch":
            split, _, idx = text.partition(" ")
            channel, fields = (kind, split), {"samples": tuple(int(x) for x in idx.split(",") if x)}
        elif kind == "sampler":
            channel = (kind, f.get("size"))
            fields = {k: f.get(k) for k in ("shuffle", "replicas", "rank")}
            if f.get("shuffle") == "1":  # the seed of an ordered sampler changes nothing
                fields["seed"] = f.get("seed")
        elif kind == "set_epoch" and f.get("size") in shuffling:
            channel, fields = (kind, f.get("size")), {"epoch": text.split()[0]}
        elif kind == "setup":
            fields = {k: f.get(k) for k in ("rank", "world_size", "seed")}
        elif kind == "coll":
            site = f.get("site", "")
            fields = {k: f.get(k) for k in ("kind", "shape", "dtype")}
        elif kind == "all_reduce":
            # One value (a loss), or a few (an evaluation's [loss sum, count]).
            values = [float(x) for x in f.get("in", "nan").split(",")]
            fields = {"value": values[0]}
            fields.update({f"value {k + 1}": x for k, x in enumerate(values[1:], 1)})
        elif kind == "print0" and rank == 0 and (
                not result_lines or any(p.search(text) for p in result_lines)):
            # Results only: a line of the student's own (a debugging print) changes no result.
            channel, fields = ("printed",), printed(text)
        elif kind in ("save0", "checkpoint"):
            fields = {"file": os.path.basename(text.split()[0]) if text.strip() else ""}
        elif kind == "ddp":
            fields = {"parameters": f.get("params")}
        elif kind == "destroy":
            fields = {}
        if fields is not None:
            out.append(Event(channel, fields, (step, i), site if kind in ("coll", "all_reduce")
                             else "", text))
    if result_lines and not any(e.channel == ("printed",) for e in out):
        lines = [l for l in run.logs.get(rank, "").splitlines()
                 if any(p.search(l) for p in result_lines)]
        out += [Event(("printed",), printed(l), (math.inf, k), "", l) for k, l in enumerate(lines)]
    return out


def agree(a, b):
    if a.keys() != b.keys():
        return False
    for k, x in a.items():
        y = b[k]
        if k == "numbers":
            if len(x) != len(y) or any(not math.isclose(p, q, rel_tol=REL_TOL, abs_tol=max(u, w))
                                       for (p, u), (q, w) in zip(x, y)):
                return False
        elif isinstance(x, float):
            if not (math.isclose(x, y, rel_tol=REL_TOL, abs_tol=1e-6) or x != x and y != y):
                return False  # (x != x: NaN, which both runs may have reached)
        elif x != y:
            return False
    return True


def first_difference(mine, theirs, ranks, result_lines=()):
    """The earliest event, over all ranks and channels, where the run `mine` is not the run
    `theirs`; None when they agree throughout."""
    found = []
    for r in range(ranks):
        channels = {}
        for side, run in ((0, mine), (1, theirs)):
            for e in events(run, r, result_lines):
                channels.setdefault(e.channel, ([], []))[side].append(e)
        for channel, (a, b) in channels.items():
            for j in range(max(len(a), len(b))):
                x, y = (a[j] if j < len(a) else None), (b[j] if j < len(b) else None)
                if x is None or y is None or not agree(x.fields, y.fields):
                    at = min(e.at for e in (x, y) if e is not None)
                    found.append(Difference(r, channel, j, x, y, at))
                    break
    return min(found, key=lambda d: (d.at, d.rank)) if found else None


class Places:
    """Where in the student's file an event belongs: a TODO, or a line outside the TODOs."""

    def __init__(self, verdicts, exercise, source, places, labels_by_file=None):
        self.v, self.source, self.places = verdicts, source, places or {}
        self.by_file = labels_by_file or {}
        self.lines = read(source).splitlines() if source else []
        self.exercise, self._parts = exercise, None

    def parts(self):
        if self._parts is None:
            try:
                self._parts = annotated_parts(self.exercise, self.source) if self.source else []
            except Exception:  # noqa: BLE001 (without the annotated source: the line alone)
                self._parts = []
        return self._parts

    def todo(self, concept):
        label = self.v.todo(concept) if concept else None
        return f"TODO {label}" if label and label != concept else None

    def owner(self, lineno):
        """The TODO label of the student's line, or None for a line outside the TODOs. The
        student's file has its own numbering and the line may be edited or new: it is placed
        between the annotated source's common lines (build_errors.todo_at), and a TODO block
        there owns it only if it looks like one of that block's lines (an edited one, not a new
        line that merely sits beside it) and more than like any common line (a learning rate
        edited beside TODO 8 is still the optimizer's line)."""
        block = todo_at(self.parts(), self.lines, lineno)
        if block is None:
            return None
        text = norm(self.lines[lineno - 1])

        def likeness(candidates):
            return max((difflib.SequenceMatcher(None, text, norm(c)).ratio()
                        for c in candidates if c.strip()), default=0.0)
        common = likeness(item for kind, item in self.parts() if kind == "line")
        own = likeness(block["solution"] + block["exercise"])
        return block["label"] if own >= max(common, LIKE) else None

    def line(self, lineno):
        name = os.path.basename(self.source)
        label = self.owner(lineno) if self.parts() else None
        if label is not None:
            return f"TODO {label}, {name}:{lineno}"
        code = " ".join(self.lines[lineno - 1].split())
        return f"a line outside the TODOs: {name}:{lineno} `{code[:70]}`"

    def find(self, piece):
        """The first line of the student's file that holds `piece` (1-based), or None."""
        return next((n for n, l in enumerate(self.lines, 1) if piece in l), None)

    def at(self, concept=None, site="", anchor=None, text=None):
        todo = self.todo(concept)
        if todo:
            return todo
        file, _, n = site.partition(":")
        if self.source and file == os.path.basename(self.source) and n.isdigit() \
                and 0 < int(n) <= len(self.lines):
            return self.line(int(n))
        if site:  # a collective the kit makes for a TODO's object (DDP's), else the kit's own
            return self.todo(self.by_file.get(file)) or f"the kit's {file}"
        if text:  # a printed line: the source line whose string holds its longest literal part
            piece = max((p.strip() for p in NUMBER.split(text)), key=len, default="")
            n = next((n for n, l in enumerate(self.lines, 1) if '"' in l and piece in l), None) \
                if len(piece) > 3 else None
            if n:
                return self.line(n)
        if anchor in self.places:
            piece, what = self.places[anchor]
            n = self.find(piece)
            return self.line(n) if n else f"outside the TODOs: {what}"
        return "no TODO owns it"


def describe(d, split_names, seed):
    """(what happened, the concept or anchor it belongs to, site, text) for a difference."""
    kind, m, t = d.channel[0], d.mine, d.theirs
    rank = f"rank {d.rank}"
    step = d.at[0]
    after = f" after step {step}" if 0 < step < math.inf else ""
    if m is None or t is None:
        e = m or t
        said = collectives.describe(kv(e.text)) if kind == "coll" else short(e.text)
        what = f"{'collective' if kind == 'coll' else kind} #{d.index + 1} on {rank}{after}: {said}"
        what = f"your run has an extra {what}, which the solution's does not" if m else \
            f"the solution's run has {what}, yours has none"
        return what, concept_of(d), e.site, e.text if kind == "printed" else None
    mf, tf = m.fields, t.fields
    if kind == "setup":
        return (f"kit::setup() was given seed {mf['seed']}, the solution's {tf['seed']}"
                + flag(tf.get("seed"), seed), "setup", "", None)
    if kind == "sampler":
        split = split_names.get(d.channel[1], f"{d.channel[1]}-sample")
        diff = [k for k in mf if mf[k] != tf.get(k)] or list(tf)
        k = diff[0]
        what = f"your {split} sampler was created with {k} {mf.get(k)}, the solution's with {k} " \
               f"{tf.get(k)}" + (flag(tf.get(k), seed) if k == "seed" else "")
        if k in ("seed", "shuffle"):
            what += f": from step 1 on, the {split} order differs" if split == "training" else \
                f": the {split} samples are read in another order"
        return what, "sampler", "", None
    if kind == "set_epoch":
        return (f"{rank} called set_epoch({mf['epoch']}) where the solution calls "
                f"set_epoch({tf['epoch']})", "set_epoch", "", None)
    if kind == "batch":
        split = d.channel[1]
        when = f"the batch of step {step + 1}" if split == "train" else \
            f"{SPLITS.get(split, split)} batch {d.index + 1}"
        return (f"{when} on {rank} read samples {head(mf['samples'])}, the solution's "
                f"{head(tf['samples'])}", f"loader-{split}", "", None)
    if kind == "forward":
        if d.index == 0:
            return (f"the weights that step 1 starts from differ from the solution's (fingerprint "
                    f"{mf['weights']:.6f} vs {tf['weights']:.6f} on {rank}): the model is "
                    "initialised differently (another seed before it is made, or other options)",
                    "init", "", None)
        return (f"step {step} starts from other weights than the solution's (fingerprint "
                f"{mf['weights']:.6f} vs {tf['weights']:.6f} on {rank}), though step {step - 1} "
                "started from the same weights, read the same batch and had the same loss: the "
                "update differs (the optimizer, its learning rate)", "update", "", None)
    if kind == "step":
        return (f"step {step}: the training loss on {rank} is {mf['loss']:.6f}, the solution's "
                f"{tf['loss']:.6f}, from the same weights and the same batch: the forward pass "
                "computes something else (dropout, the model's options, the loss)", "forward", "",
                None)
    if kind == "all_reduce":
        return (f"{rank} handed all_reduce #{d.index + 1}{after} the value {mf['value']:.6f}, "
                f"the solution's {tf['value']:.6f}", None, m.site, None)
    if kind == "coll":
        return (f"collective #{d.index + 1} on {rank}{after} is "
                f"{collectives.describe(kv(m.text))}, the solution's "
                f"{collectives.describe(kv(t.text))}", None, m.site, None)
    if kind == "printed":
        return (f"{rank} printed \"{m.text.strip()}\" where the solution prints "
                f"\"{t.text.strip()}\"", None, "", m.text)
    if kind in ("save0", "checkpoint"):
        return (f"{kind} #{d.index + 1}{after} wrote {mf['file']}, the solution's {tf['file']}",
                kind if kind == "save0" else "checkpoint", "", None)
    if kind == "ddp":
        return (f"DistributedDataParallel wraps {mf['parameters']} parameter tensors, the "
                f"solution's {tf['parameters']}", "init", "", None)
    return f"{kind}: {short(m.text)} vs the solution's {short(t.text)}", kind, "", None


def concept_of(d):
    kind = d.channel[0]
    if kind == "batch":
        return f"loader-{d.channel[1]}"
    return {"forward": "init", "step": "forward"}.get(kind, kind)


def flag(value, seed):
    return " (the value of --seed)" if seed is not None and value == seed else ""


def head(samples, n=4):
    return "[" + ", ".join(map(str, samples[:n])) + (", ...]" if len(samples) > n else "]")


def short(text, n=60):
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + "..."


def split_sizes(run):
    """{sampler size: split name} from the samples the run's ranks read on their first pass."""
    names = {}
    for split in sorted({t.partition(" ")[0] for r in range(run.ranks)
                         for k, t in run.traces[r] if k == "batch"}):
        seen = set()
        for r in range(run.ranks):
            for k, t in run.traces[r]:
                if k == "batch" and t.partition(" ")[0] == split:
                    seen.update(int(x) for x in t.partition(" ")[2].split(",") if x)
        names[str(len(seen))] = SPLITS.get(split, split)
    return names


def first_place(check):
    """One sentence: where the student's run first leaves the solution's, and which TODO or
    line of the trainer that is; None when the runs agree."""
    rules, args = check.rules, check.args
    d = first_difference(check.many, check.reference, check.ranks,
                         getattr(rules, "RESULT_LINES", ()))
    if d is None:
        return None
    flags = list(getattr(rules, "RUN_FLAGS", []))
    seed = flags[flags.index("--seed") + 1] if "--seed" in flags[:-1] else None
    what, concept, site, text = describe(d, split_sizes(check.reference), seed)
    places = Places(check.verdicts, args.exercise, check.source, getattr(rules, "PLACES", {}),
                    getattr(rules, "COLLECTIVE_FILES", {}))
    anchor = concept if concept in places.places else None
    where = places.at(None if anchor else concept, site, anchor, text)
    return f"{what} ({where})"


def judge_run(check, what, differs=""):
    """The closing verdict ("all"): the run is the solution's, event by event, and ends with its
    results. differs: the exercise's own words for how the end result differs from the
    solution's ("" when it does not: a final loss, the printed results). When the run is not the
    solution's, the verdict names a place, never a \u2718 that is not there: the first failing
    TODO, else where the run first left the solution's."""
    v = check.verdicts
    if not check.many.finished():
        v.add("all", False, what, "the run did not finish (see above)")
        return
    lead = f"{differs}; " if differs else ""
    first = v.first_to_fix()
    if first:  # what fails explains the rest: no need to trace it
        v.add("all", False, what, f"{lead}fix TODO {first} first (its \u2718 is above)")
        return
    place = first_place(check)
    if place:
        v.add("all", False, what, f"{lead}your run first leaves the solution's here: {place}")
    elif differs:
        where = Places(v, check.args.exercise, check.source, getattr(check.rules, "PLACES", {}))
        v.add("all", False, what, f"{lead}every traced event agrees with the solution's run, so "
              f"the difference comes after the last of them ({where.at(anchor='final')})")
    else:
        v.add("all", True, what)
