"""A run that stopped before its end: how it stopped (a crash by a signal, an error the program
reported, a hang) and where, placed in the student's file and in its TODO.

The place is taken from evidence the run left, never guessed: the call site the kit's own error
names ("broadcast #1 (collectives.cpp:48)", common/kit/runtime/process_group_checks.cpp), else
the last collective the rank entered (the run trace's "coll ... site=file:line"). A kit error
that ends with its caller's line ("... (train.cpp:251)": Checkpoints::save_sharded, ZeroOptions)
is placed at that line of the student's file, not in the kit. A site in a kit file
that the rules map to a concept (ddp.cpp: DDP's TODO) names that TODO. The line of the
student's file is placed in its TODO through the annotated source (every line of the exercise
has a place between the common lines: build_errors.todo_at), then by its text.
"""
import os
import re
import signal
from collections import namedtuple

from . import collectives
from .runs import kv, same_device

# What each signal a trainer dies of usually means, in a student's words.
MEANING = {
    "SIGSEGV": "a segmentation fault: the program touched memory that is not its own (a "
               "reference or pointer to something already destroyed, an index out of range)",
    "SIGBUS": "a bus error: a bad memory access (often a file mapped and then truncated)",
    "SIGABRT": "an abort: std::terminate after an exception nothing caught, or a failed assertion",
    "SIGFPE": "an arithmetic error (an integer divided by zero)",
    "SIGKILL": "killed from outside (the out-of-memory killer, or a time limit)",
    "SIGILL": "an illegal instruction",
}
SITE = re.compile(r"\(([A-Za-z0-9_.+-]+\.(?:cpp|h|cc|hpp)):(\d+)\)")
# The kit's refusal of a tensor on another device than the rank's (process_group_checks.cpp).
WRONG_DEVICE = re.compile(r"was given a tensor on (\S+), but NCCL moves only tensors on the "
                          r"rank's device \(([^)]+)\)")
# A dataset asked for an example it does not have (kit/data/wikitext.cpp, cifar10.cpp).
PAST_THE_END = (re.compile(r"\b(\w+): example (\d+) does not exist \(the dataset has (\d+)\)"),
                re.compile(r"Cifar10Dataset\((\w+)\): index (\d+) >= size (\d+)"))
# A rank's error that is another's consequence: a collective's "another rank left the job", a send
# or receive's "rank 3 left the job" (kit/runtime/process_group.cpp words both).
LEFT = re.compile(r"(another rank|rank \d+) left the job")
ERROR = re.compile(r"error|what\(\)|terminate|abort|timed out|exception|refused|invalid", re.I)

# rank: the rank that stopped first (None: unknown); how: one sentence; site: "file.cpp:N" or
# ""; todo: the TODO label of the site, or None; where: "TODO 4" / "line 12 of collectives.cpp,
# outside the TODOs" / "" (nothing to place it by).
Stop = namedtuple("Stop", "rank how site todo where")


def killed_by(run):
    """(rank, signal name) of a rank a signal killed, or None. A process run alone reports a
    negative status; ddprun says "rank R (pid P) died: killed by signal N (SIGSEGV)" and exits
    128+N; the one-rank-per-node launcher reports the rank's negative status."""
    text = run.stderr + run.stdout
    m = re.search(r"rank (\d+) \(pid \d+\) died: killed by signal (\d+)", text)
    if m:
        return int(m.group(1)), name_of(int(m.group(2)))
    m = re.search(r"rank (\d+) exited with status -(\d+)", text)
    if m:
        return int(m.group(1)), name_of(int(m.group(2)))
    if run.code is not None and run.code < 0 and run.code != -1:  # -1: the check's own timeout
        return (0 if run.ranks == 1 else None), name_of(-run.code)
    return None


def name_of(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def error_line(run, rank):
    """The rank's last line that reports an error, or ""."""
    lines = [l.strip() for l in run.logs.get(rank, "").splitlines() if l.strip()]
    return next((l for l in reversed(lines) if ERROR.search(l)), "")


def last_site(run, rank):
    calls = [kv(f) for f in run.events(rank, "coll")]
    return calls[-1].get("site", "") if calls else ""


def place(site, source, exercise, labels, verdicts):
    """(todo, where) of a call site."""
    file, _, line = site.partition(":")
    if not site or not line.isdigit():
        return None, ""
    if source and file == os.path.basename(source):
        todo = todo_of_line(exercise, source, int(line))
        return todo, (f"TODO {todo}, line {line} of {file}" if todo
                      else f"line {line} of {file}, outside the TODOs")
    concept = labels.get(file)
    if concept:
        todo = verdicts.todo(concept)
        return todo, f"TODO {todo} (the kit's {file}, called on its behalf)"
    return None, f"inside the kit ({file}:{line})"


PLACED = {}  # (exercise, source, its size and time, line) -> TODO label: a run has many calls


def todo_of_line(exercise, source, line):
    """The TODO of the student's line: its place among the annotated source's common lines,
    else the TODO whose solution code the line's text is."""
    try:
        st = os.stat(source)
    except OSError:
        return None
    key = (exercise, source, st.st_size, st.st_mtime_ns, line)
    if key not in PLACED:
        PLACED[key] = placed_line(exercise, source, line)
    return PLACED[key]


def placed_line(exercise, source, line):
    from .build_errors import annotated_parts, stages_json, todo_at
    try:
        with open(source, errors="replace") as f:
            lines = f.read().splitlines()
        block = todo_at(annotated_parts(exercise, source), lines, line)
        if block is not None:
            return block["label"]
        return collectives.todo_of_line(source, line, stages_json("todos", exercise, "--json"))
    except (OSError, RuntimeError, ValueError):
        return None


def explain(run, source, exercise, labels, verdicts):
    """How and where `run` stopped, or None when it did not fail."""
    if run.code == 0:
        return None
    if getattr(run, "startup", ""):  # it did not start as asked: nothing of the trainer's to place
        return Stop(None, run.failure(), "", None, "")
    crash = killed_by(run)
    ranks = range(run.ranks)
    # A rank whose collective failed because another rank left is a consequence: the rank that
    # left says why (kit/runtime/process_group.cpp words it "another rank left the job").
    own = [r for r in ranks if error_line(run, r) and not LEFT.search(error_line(run, r))]
    rank = crash[0] if crash else next(iter(own), next((r for r in ranks if error_line(run, r)), None))
    line = error_line(run, rank) if rank is not None else ""
    if crash:
        sig = crash[1]
        who = f"rank {rank}" if rank is not None and run.ranks > 1 else "the program"
        how = f"{who} crashed with {sig}, {MEANING.get(sig, 'a signal')}"
    elif "timed out" in run.stderr and not line:
        how = "the run timed out"
    else:
        how = f"rank {rank}: {line}" if rank is not None and run.ranks > 1 and line and \
            not line.startswith(f"rank {rank}") else (line or run.failure() or "it failed")
    # The site: the one the error names, else the last collective the rank entered (a crash
    # names none; the kit cannot see the faulting instruction, so that is said as what it is).
    # A kit error may name several: its own line, then the trainer's line that called it (the
    # kit appends its caller's, CallSite): the student's file is the one to place.
    sites = SITE.findall(line) if line else []
    mine = [s for s in sites if source and s[0] == os.path.basename(source)]
    m = (mine or sites or [None])[0]
    site, evidence = (f"{m[0]}:{m[1]}", "named") if m else ("", "")
    if not site and rank is not None:
        site, evidence = last_site(run, rank), "last"
    # A rank that timed out in the kit's own collective may be waiting for a rank that waits in
    # a collective of the student's line (a save made inside `if (rank == 0)` waits in its
    # barrier, the other ranks train on): that line is where the ranks parted.
    if not crash and evidence == "named" and source and "timed out" in line and \
            not site.startswith(os.path.basename(source) + ":"):
        theirs = [(r, last_site(run, r)) for r in ranks if r != rank]
        theirs = [(r, s) for r, s in theirs if s.startswith(os.path.basename(source) + ":")]
        if theirs:
            other, site = theirs[0]
            how += f"; rank {other} waits in a collective of your line"
            evidence = "last"
    todo, where = place(site, source, exercise, labels, verdicts)
    # Where the call that stopped is not the mistake, but the evidence names the one that is.
    root = root_cause(run, rank, line, verdicts) if rank is not None and line else None
    if root:
        todo, why, what = root
        return Stop(rank, how + "; " + why, site, todo, f"TODO {todo}, {what}")
    if any(run.events(r, "after_destroy") for r in ranks):
        # The refused call is where the run stopped, not the mistake: destroy_process_group()
        # came too early, and the judges name its TODO.
        label = verdicts.todo("destroy")
        return Stop(rank, how + "; a kit call after destroy_process_group()", site, None,
                    f"see TODO {label}" if label != "destroy" else "")
    if where and evidence == "last" and crash:
        how += f"; its last kit call was the collective at {where}"
        where = ""  # not the crash's own line: no TODO is blamed on it alone
        todo = None
    elif where and evidence == "last":
        where = f"its last collective: {where}"
    return Stop(rank, how, site, todo, where)


def root_cause(run, rank, line, verdicts):
    """(todo, why, what) of the mistake behind a stop whose own call is innocent, where the run's
    evidence names it; else None.
      * a tensor on another device than setup()'s reached a collective: when this rank's model
        went to that device (the trace's model_to), the device was chosen wrong, in the TODO that
        chooses it (setup's), not in the TODO of the collective that found it;
      * a dataset asked for an example past its end: its loader was given another split's
        sampler (a sampler of its size exists: the loader's TODO), or its sampler was made on
        another split (none does: the samplers' TODO). The split is the one the error names.
    The rules' LABELS must have the concept ("setup", "loader-<split>", "sampler")."""
    def label(concept):
        todo = verdicts.todo(concept)
        return todo if todo != concept else None

    m = WRONG_DEVICE.search(line)
    if m and label("setup"):
        setups = run.events(rank, "setup")
        given = kv(setups[0]).get("device", m.group(2)) if setups else m.group(2)
        moved = [kv(f).get("device", "") for f in run.events(rank, "model_to")]
        wrong = next((d for d in moved if d and not same_device(d, given)), None)
        if wrong:
            return (label("setup"), f"the model went to {wrong} (model->to), not to the device "
                    f"setup() gave rank {rank} ({given}), so its tensors reach the collective "
                    "there: use the device setup() returns", "where the device is chosen")
    for pattern in PAST_THE_END:
        m = pattern.search(line)
        if not m:
            continue
        split, index, size = m.group(1), m.group(2), int(m.group(3))
        sizes = {int(kv(f).get("size", -1)) for f in run.events(rank, "sampler")}
        if size in sizes and label(f"loader-{split}"):
            return (label(f"loader-{split}"), f"the {split} split has {size} examples, but its "
                    f"loader asked for example {index}: it was given the sampler of a bigger "
                    "split; give each loader the sampler made for its own split",
                    f"the {split} loader")
        if size not in sizes and label("sampler"):
            return (label("sampler"), f"the {split} split has {size} examples, but no sampler "
                    f"was made for {size} (example {index} was asked for): a sampler was made on "
                    "another split's dataset", "the samplers")
    return None
