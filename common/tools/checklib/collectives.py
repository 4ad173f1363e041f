"""Where the ranks' collectives part ways: the most common distributed bug of all.

Every rank must call every collective, in the same order, with tensors of the same shape and
dtype: the ranks meet by position in that order, not by name. A collective that only some ranks
call (one inside `if (rank == 0)`) leaves the others waiting until the timeout, and every judgment
after it sees a run that stopped half way. The run trace records each collective a rank entered
("coll seq=N kind=... shape=... dtype=... site=train.cpp:74", common/kit/process_group.cpp); this
module compares the ranks' sequences, finds the first position where they differ, and names the
call, its line and the TODO it belongs to."""
import os
import re

from .runs import kv

RULE = ("every rank must call every collective, in the same order, with tensors of the same "
        "shape and dtype (a collective inside `if (rank == 0)` leaves the other ranks waiting)")


def calls(run, rank):
    return [kv(f) for f in run.events(rank, "coll")]


def describe(call):
    """'all_reduce #34 (train.cpp:74) of a [] Float tensor'."""
    tensor = f" of a {call.get('shape')} {call.get('dtype')} tensor" if call.get("shape", "-") != "-" else ""
    return f"{call.get('kind')} #{call.get('seq')} ({call.get('site')}){tensor}"


def first_divergence(run, ranks, reference=None):
    """(position, text, site) of the first collective the ranks do not agree on, or None.
    site ("train.cpp:74") is the call to blame: the one the solution's run also makes there.
    A rank whose calls simply stop counts only when the run hung on a collective: a rank that
    crashed stops calling too, and that is not a collective's fault."""
    seqs = [calls(run, r) for r in range(ranks)]
    hung = "timed out" in (run.failure() or "")
    ref = calls(reference, 0) if reference is not None and reference.ranks else []
    longest = max((len(s) for s in seqs), default=0)
    for i in range(longest):
        here = [s[i] if i < len(s) else None for s in seqs]
        made = [(r, c) for r, c in enumerate(here) if c is not None]
        key = lambda c: (c.get("kind"), c.get("shape"), c.get("dtype"), c.get("site"))  # noqa: E731
        if len(made) == ranks and len({key(c) for _, c in made}) == 1:
            continue
        if len({key(c) for _, c in made}) == 1 and not hung:
            return None  # some ranks stopped here (a crash, reported elsewhere), none disagreed
        # The call the solution makes at this position is the one some ranks skipped (or made
        # with another shape); without a match, the first rank's call.
        want = ref[i] if i < len(ref) else None
        blame = next((c for _, c in made if want and c.get("kind") == want.get("kind")
                      and c.get("shape") == want.get("shape")), made[0][1])
        parts = []
        for r, c in enumerate(here):
            if c is None:
                parts.append(f"rank {r} never did")
            elif key(c) != key(blame):
                parts.append(f"rank {r} entered {describe(c)} instead")
        who = ", ".join(str(r) for r, c in made if key(c) == key(blame))
        text = f"rank{'s' if ',' in who else ''} {who} entered {describe(blame)}; " + "; ".join(parts)
        return i + 1, text, blame.get("site", "")
    return None


def todo_of_line(source, line, todos):
    """The TODO whose solution code is on `line` of the student's file (by the line's text, not
    its number: the student's file has its own numbering), or None."""
    try:
        with open(source) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    if not 1 <= line <= len(lines):
        return None
    text = norm(lines[line - 1])
    if not text:
        return None
    for t in todos:
        if any(text == norm(c) or (len(norm(c)) > 8 and norm(c) in text)
               for c in t.get("code", "").splitlines()):
            return t["todo"]
    return None


def norm(line):
    return re.sub(r"\s+", " ", re.sub(r"//.*$", "", line)).strip()


def judge(v, run, ranks, reference, source, todos, labels_by_file=None, exercise=None):
    """Adds a ✘ row for the TODO of the first divergence (if any); returns the line to print
    before the TODO rows, or None. todos: a function giving the exercise's TODO blocks (asked
    only when there is a divergence to place). labels_by_file: kit files whose collectives belong to a
    concept (e.g. {"ddp.cpp": "ddp"}: DDP's all-reduces go with the DDP TODO)."""
    found = first_divergence(run, ranks, reference)
    if found is None:
        return None
    position, text, site = found
    file, _, line = site.partition(":")
    todo = None
    if source and file == os.path.basename(source) and line.isdigit():
        # The line's place in the annotated source first (a TODO's line the student rewrote is
        # still that TODO's), then its text.
        if exercise:
            from .stops import todo_of_line as placed
            todo = placed(exercise, source, int(line))
        if not todo:
            todo = todo_of_line(source, int(line), todos())
        where = f"TODO {todo}" if todo else "a line outside the TODOs"
    else:
        concept = (labels_by_file or {}).get(file)
        todo = v.todo(concept) if concept else None
        where = f"TODO {todo}" if todo else f"the kit's {file}"
    what = "every rank calls every collective in the same order"
    why = f"the ranks parted at collective #{position}: {text}"
    if todo:  # first among its TODO's rows: what follows in the run is a consequence of it
        v.add(todo, False, what, why, first=True)
    return f"{why} ({where}): {RULE}"


def judge_tensors(v, run, reference, ranks, place):
    """Each collective's tensor against the solution's run: the same kind at the same position
    must have the same shape and dtype (a Double where the solution has a Float doubles the
    bytes on the wire; another shape is another result). Compared only where both runs made the
    same kinds of collective in the same order, so that a correct program that packs its values
    otherwise is not judged by position. place(site) -> (TODO label, where)."""
    if reference is None or not reference.ranks:
        return
    theirs = calls(reference, 0)
    for r in range(ranks):
        mine = calls(run, r)
        if [c.get("kind") for c in mine] != [c.get("kind") for c in theirs[:len(mine)]] or \
                (run.finished() and len(mine) != len(theirs)):
            return
        for m, t in zip(mine, theirs):
            if (m.get("shape"), m.get("dtype")) == (t.get("shape"), t.get("dtype")):
                continue
            todo, where = place(m.get("site", ""))
            if not todo:
                return  # outside the TODOs: the closing comparison names it
            v.add(todo, False, "each collective's tensor has the solution's shape and dtype",
                  f"rank {r}'s {m.get('kind')} #{m.get('seq')} ({where}) has a {m.get('shape')} "
                  f"{m.get('dtype')} tensor where the solution's run has a {t.get('shape')} "
                  f"{t.get('dtype')} one")
            return
