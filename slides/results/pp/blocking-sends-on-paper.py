#!/usr/bin/env python3
"""Deck 10's "Why the sends must not wait", on paper: each rank's list of kit/pipeline/schedule.cpp
(ported below) run with receives that wait and sends that either wait for their receive (the
kit's send(): kit/runtime/process_group.h) or return at once (isend, waited at the end of the
step, as the trainer does). A forward receives from the previous chunk's rank, computes, sends
to the next; a backward the other way. Prints, per schedule, the shapes that deadlock.
Output of record: blocking-sends-on-paper.txt (python3 blocking-sends-on-paper.py)."""


def actions(s, p, v, m, r):  # kit::pp::actions
    if s == "gpipe":
        return [("F", r, i) for i in range(m)] + [("B", r, i) for i in range(m)]
    if s == "1f1b":
        out, f, b = [], 0, 0
        while f < min(m, p - r):
            out.append(("F", r, f)); f += 1
        while True:
            out.append(("B", r, b)); b += 1
            if f == m:
                break
            out.append(("F", r, f)); f += 1
        return out + [("B", r, i) for i in range(b, m)]
    per = m // max(1, m // p)
    w = min((v - 1) * per + 2 * (p - 1 - r), m * v)
    out, nf, nb = [], {}, {}
    for op in range(m * v + w):
        if op < m * v:
            c = ((op // per) % v) * p + r
            out.append(("F", c, nf.get(c, 0))); nf[c] = nf.get(c, 0) + 1
        if op >= w:
            c = (v - 1 - ((op - w) // per) % v) * p + r
            out.append(("B", c, nb.get(c, 0))); nb[c] = nb.get(c, 0) + 1
    return out


def steps(s, p, v, m, r, waits):
    """The rank's receives, computes and sends; waits(kind) says whether a send of that kind waits."""
    last, out = p * v - 1, []
    for k, c, i in actions(s, p, v, m, r):
        src, dst = (c - 1, c + 1) if k == "F" else (c + 1, c - 1)
        if 0 <= src <= last:
            out.append(("recv", (k, src, i)))
        out.append(("compute",))
        if 0 <= dst <= last:
            out.append(("send" if waits(k) else "isend", (k, c, i), dst % p))
    return out


def deadlocks(s, p, v, m, waits):
    lists = [steps(s, p, v, m, r, waits) for r in range(p)]
    at, posted = [0] * p, set()
    head = lambda r: lists[r][at[r]] if at[r] < len(lists[r]) else None  # noqa: E731
    moved = True
    while moved:
        moved = False
        for r in range(p):
            while (op := head(r)) is not None:
                if op[0] == "isend":
                    posted.add(op[1])
                elif op[0] == "compute":
                    pass
                elif op[0] == "send" and head(op[2]) == ("recv", op[1]):
                    at[op[2]] += 1  # the pair meets: both go on
                elif op[0] == "recv" and op[1] in posted:
                    pass
                elif op[0] == "recv" and any(head(q) == ("send", op[1], r) for q in range(p)):
                    q = next(q for q in range(p) if head(q) == ("send", op[1], r))
                    at[q] += 1
                else:
                    break
                at[r] += 1
                moved = True
    return any(head(r) is not None for r in range(p))


for name, waits in (("every send waits", lambda k: True),
                    ("only the forward's sends wait", lambda k: k == "F"),
                    ("no send waits (isend)", lambda k: False)):
    print(f"{name}: shapes that deadlock, of pp 2-8, v 1-4 (interleaved), m 1..4 pp")
    for s in ("gpipe", "1f1b", "interleaved"):
        for v in ((1,) if s != "interleaved" else (1, 2, 3, 4)):
            shapes = [(p, m) for p in range(2, 9) for m in range(1, 4 * p + 1)
                      if s != "interleaved" or m % max(1, m // p) == 0]
            stuck = [(p, m) for p, m in shapes if deadlocks(s, p, v, m, waits)]
            runs = [(p, m) for p, m in shapes if (p, m) not in stuck]
            rule = ("none" if not stuck else "all" if not runs else
                    "all with m >= 2" if all(m == 1 for _, m in runs) else
                    "all with m >= pp" if all(m < p for p, m in runs) and
                    all(m >= p for p, m in stuck) else f"{len(stuck)}")
            print(f"  {s:11s} v {v}: {len(stuck):3d} of {len(shapes):3d} ({rule})")
