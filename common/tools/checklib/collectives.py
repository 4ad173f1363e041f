"""Where the ranks' collectives part ways: the most common distributed bug of all.

Every rank must call every collective, in the same order, with tensors of the same shape and
dtype: the ranks meet by position in that order, not by name. A collective that only some ranks
call (one inside `if (rank == 0)`) leaves the others waiting until the timeout, and every judgment
after it sees a run that stopped half way. The run trace records each collective a rank entered
("coll seq=N kind=... shape=... dtype=... site=train.cpp:74 group=world", common/kit/check/observe.cpp); this
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


def group_members(name, ranks):
    """The world ranks of a group as the trace names it: "world", or its ranks ("0,2")."""
    if name in (None, "", "world"):
        return list(range(ranks))
    return [int(r) for r in name.split(",") if r.isdigit()]


def first_divergence(run, ranks, reference=None):
    """(position, text, site) of the first collective the ranks do not agree on, or None.
    site ("train.cpp:74") is the call to blame: the one the solution's run also makes there.
    A rank whose calls simply stop counts only when the run hung on a collective: a rank that
    crashed stops calling too, and that is not a collective's fault.

    Ranks meet by position within a group: where a run uses subgroups (a tp group, a dp group:
    the trace's group=), each group's members are compared on that group's collectives only, since
    the ranks of other groups rightly make other calls there (first_divergence_per_group)."""
    if any(c.get("group", "world") != "world" for r in range(ranks) for c in calls(run, r)):
        return first_divergence_per_group(run, ranks, reference)
    return first_divergence_in(run, [calls(run, r) for r in range(ranks)], ranks, reference)


def first_divergence_per_group(run, ranks, reference):
    """first_divergence for a run with subgroups: every group the trace names, its members'
    calls on it; of the groups that part, the one whose parting call comes first among the first
    member's collectives. The text names the group."""
    names = {c.get("group", "world") for r in range(ranks) for c in calls(run, r)}
    found = []
    for name in sorted(names):
        members = [r for r in group_members(name, ranks) if r < ranks]
        on = {r: [c for c in calls(run, r) if c.get("group", "world") == name] for r in members}
        ref = None
        if reference is not None and reference.ranks and members and members[0] < reference.ranks:
            ref = [c for c in calls(reference, members[0]) if c.get("group", "world") == name]
        d = first_divergence_in(run, [on[r] for r in members], len(members), None, ref,
                                labels=members)
        if d is not None:
            mine = calls(run, members[0])
            at = [k for k, c in enumerate(mine) if c.get("group", "world") == name]
            when = at[d[0] - 1] if d[0] - 1 < len(at) else len(mine)
            found.append((when, (d[0], f"{d[1]} (on group {name})", d[2])))
    return min(found, key=lambda f: f[0])[1] if found else None


def first_divergence_in(run, seqs, ranks, reference=None, ref=None, labels=None):
    """The comparison of first_divergence over `seqs`, one list of calls per rank (labels: the
    ranks' world numbers, when the lists are a group's members')."""
    labels = labels or list(range(ranks))
    hung = "timed out" in (run.failure() or "")
    if ref is None:
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
                parts.append(f"rank {labels[r]} never did")
            elif key(c) != key(blame):
                parts.append(f"rank {labels[r]} entered {describe(c)} instead")
        who = ", ".join(str(labels[r]) for r, c in made if key(c) == key(blame))
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


def judge_tensors(v, run, reference, ranks, place, place_theirs):
    """Each collective's tensor against the solution's run: the k-th collective a TODO's lines
    make must have the shape and dtype of the k-th the solution's lines of that TODO make (a
    Double where the solution has a Float doubles the bytes on the wire; another shape is another
    result). Matched by TODO, not by position in the run, so that right code in another order is
    not compared with the wrong call; a TODO that makes another number of collectives (values
    packed otherwise) is left to the other judgments. place(site) / place_theirs(site) -> the TODO
    label of a call site of the student's / the solution's run, or None."""
    if reference is None or reference.ranks != ranks:
        return
    for r in range(ranks):
        mine, theirs = {}, {}
        for c in calls(run, r):
            todo = place(c.get("site", ""))
            if todo:
                mine.setdefault(todo, []).append(c)
        for c in calls(reference, r):
            todo = place_theirs(c.get("site", ""))
            if todo:
                theirs.setdefault(todo, []).append(c)
        for todo, made in mine.items():
            want = theirs.get(todo, [])
            if len(made) != len(want) and run.finished():
                continue
            for m, t in zip(made, want):
                if (m.get("shape"), m.get("dtype")) == (t.get("shape"), t.get("dtype")):
                    continue
                v.add(todo, False, "each collective's tensor has the solution's shape and dtype",
                      f"rank {r}'s {m.get('kind')} #{m.get('seq')} ({m.get('site')}) has a "
                      f"{m.get('shape')} {m.get('dtype')} tensor where the solution's "
                      f"{t.get('kind')} of this TODO has a {t.get('shape')} {t.get('dtype')} one")
                return
