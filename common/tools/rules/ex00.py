"""Exercise 00 (ranks and collectives): which run, which TODO is which, and the closed form of
every result.

Rank r of N starts from mine = (r + 1) x [1..n] and prints one line per result,
"rank R: NAME v1 v2 ...". Each result has a closed form, so the check needs no reference numbers:

  broadcast       [1..n]                          (rank 0's tensor)
  all_reduce SUM  N(N+1)/2 x [1..n]
  all_reduce AVG  (N+1)/2 x [1..n]
  all_gather      1x[1..n], 2x[1..n], ..., Nx[1..n]
  reduce_scatter  (r + 1) x N(N+1)/2 x [1..n]     (chunk c of every rank is (c + 1) x mine)

and after the barrier every rank has seen the marks of all N ranks. A right number is not
enough: the rank's run trace must also show the collective (common/kit/runtime/process_group_checks.cpp traces
each one it enters), so a result computed by hand does not pass."""
import math
import re

from checklib import compare
from checklib.runs import kv, read

ELEMENTS = 3
RUN_FLAGS = ["--elements", str(ELEMENTS)]
# The run with every rank on a node of its own (local rank 0): shows which number is printed
# as the local rank.
NODES_FLAGS = list(RUN_FLAGS)
# The program takes milliseconds; a rank that waits this long waits for a rank that never
# comes (a collective only some ranks call). Short, so that the check of such a hang is quick.
RUN_ENV = {"KIT_TIMEOUT": "8"}
LABELS = {"include": "1", "setup": "2", "whoami": "3", "broadcast": "4", "all_reduce": "5",
          "all_gather": "6", "reduce_scatter": "7", "barrier": "8"}
WHOAMI = re.compile(r"^rank (\d+) of (\d+): local rank (\d+), device (\S+)\s*$", re.M)
RESULT = re.compile(r"^rank \d+: (mine|broadcast|all_reduce SUM|all_reduce AVG|all_gather|"
                    r"reduce_scatter) ?([-+0-9.e ]*)$", re.M)
BARRIER = re.compile(r"^rank \d+: after the barrier (\d+) of (\d+) ranks had arrived", re.M)
# The lines the run is compared by with the solution's, on every rank (checklib/compare.py).
RESULT_LINES = (RESULT, BARRIER)


def data_key():
    return RUN_FLAGS


def prepare_data(check, directory):
    return None  # no data: every number comes from the rank


def expected(rank, n_ranks, n=ELEMENTS):
    """{result name: its values} for `rank` of `n_ranks`."""
    base = [float(i) for i in range(1, n + 1)]
    times = lambda k: [k * x for x in base]  # noqa: E731
    tri = n_ranks * (n_ranks + 1) / 2
    return {"broadcast": base, "all_reduce SUM": times(tri),
            "all_reduce AVG": times((n_ranks + 1) / 2),
            "all_gather": [x for q in range(n_ranks) for x in times(q + 1)],
            "reduce_scatter": times((rank + 1) * tri)}


def results(log):
    """{name: values} of the result lines in one rank's output."""
    return {m.group(1): [float(x) for x in m.group(2).split()] for m in RESULT.finditer(log)}


def same(a, b):
    return a is not None and len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-6)
                                                     for x, y in zip(a, b))


def text(values):
    return " ".join(f"{v:g}" for v in values) if values else "nothing"


def collective_kinds(run, rank):
    return [kv(f).get("kind") for f in run.events(rank, "coll")]


def stopped(run):
    """Why a result line is missing: the run ended early."""
    return " (the run stopped before it: see above)" if run.failure() else ""


def check_include(v, run, source, ranks):
    included = source is not None and re.search(r'#\s*include\s+"kit/runtime/distributed\.h"',
                                                 read(source))
    joined = all(run.events(r, "setup") for r in range(ranks))
    v.add("include", bool(included or joined), "kit/runtime/distributed.h is included",
          "" if included or joined else "without it there is no kit::setup() to call")


def check_setup(v, run, ranks):
    """TODO 2: every rank joins as itself, and leaves at the end with destroy_process_group()."""
    what = "every rank joins the job with kit::setup() and leaves it at the end"
    bad = []
    for r in range(ranks):
        s = kv(run.events(r, "setup")[0]) if run.events(r, "setup") else None
        if s is None:
            v.add("setup", False, what, f"setup() never ran: each of the {ranks} processes ran "
                  "alone, as rank 0 of a world of 1")
            return False
        if s.get("rank") != str(r) or s.get("world_size") != str(ranks):
            bad.append(f"rank {r} joined as rank {s.get('rank')} of {s.get('world_size')}")
    for r in range(ranks):
        late = run.events(r, "after_destroy")
        if late:
            bad.append(f"rank {r} called {late[0].split(' site=')[0]} after "
                       "destroy_process_group(): leave the job last, after the barrier")
        elif run.finished() and not run.events(r, "destroy"):
            bad.append(f"rank {r} never called kit::destroy_process_group() at the end")
    v.add("setup", not bad, what, "; ".join(bad))
    if not any(kv(run.events(r, "setup")[0]).get("device", "").startswith("cuda")
               for r in range(ranks)):
        # Said, not passed in silence: a CPU run cannot show the GPU side of the same code.
        v.note("setup", "needs a GPU: that each rank's tensors live on cuda:<local rank> and the "
               "collectives run on NCCL; run ./kit check 00 on a GPU node for that")
    return True


def check_whoami(v, run, nodes, ranks):
    """TODO 3: each rank prints its own rank, world size, local rank and device."""
    what = "every rank prints its rank, world size, local rank and device"
    for layout, r_run in (("on one node", run), ("with one rank per node", nodes)):
        if r_run is None:
            continue
        for r in range(ranks):
            lines = WHOAMI.findall(r_run.logs.get(r, ""))
            s = kv(r_run.events(r, "setup")[0]) if r_run.events(r, "setup") else {}
            if not lines:
                v.add("whoami", False, what, f"rank {r} printed no line 'rank {r} of {ranks}: "
                      "local rank L, device D' (every rank prints it: std::printf, not print0)")
                return
            got = lines[0]
            want = (str(r), str(ranks), s.get("local_rank", "?"), s.get("device", "?"))
            if got != want:
                v.add("whoami", False, what,
                      f"rank {r} ({layout}) printed 'rank {got[0]} of {got[1]}: local rank "
                      f"{got[2]}, device {got[3]}', but it is rank {want[0]} of {want[1]} with "
                      f"local rank {want[2]} on {want[3]}: print the values setup() returned, "
                      "each in its place")
                return
    v.add("whoami", True, what)


def check_results(v, run, ranks):
    """TODOs 4-7: every rank's result against its closed form, and the collective in its trace."""
    for concept, names, kind in (("broadcast", ["broadcast"], "broadcast"),
                                 ("all_reduce", ["all_reduce SUM", "all_reduce AVG"], "all_reduce"),
                                 ("all_gather", ["all_gather"], "all_gather"),
                                 ("reduce_scatter", ["reduce_scatter"], "reduce_scatter")):
        what = f"every rank's {kind} result is right"
        wrong = [wrong_value(run, r, ranks, name) for r in range(ranks) for name in names]
        printed = [bool(results(run.logs.get(r, "")).get(name)) for r in range(ranks)
                   for name in names]
        if not run.finished() and not all(printed) and not any(
                w for w, p in zip(wrong, printed) if p):
            # No result to judge: the run stopped before it (the first ✘ says where).
            v.unreached(concept, what, "the run stopped before it")
            continue
        # Wrong numbers first (rank 0's broadcast is right even without one); then the trace.
        # A wrong number a rank printed says more than one a stopped rank did not print.
        why = next((w for w, p in zip(wrong, printed) if w and p), "") or \
            next((w for w in wrong if w), "") or next(
            (f"rank {r} has the right numbers, but never called kit::{kind}"
             for r in range(ranks) if kind not in collective_kinds(run, r)), "")
        v.add(concept, not why, what, why)


def wrong_value(run, rank, ranks, name):
    """What is wrong with `rank`'s result `name`, or ""."""
    got, want = results(run.logs.get(rank, "")), expected(rank, ranks)[name]
    if name not in got:
        return f"rank {rank} printed no {name} result{stopped(run)}"
    if not same(got[name], want):
        return (f"rank {rank} has {name} = {text(got[name])}, expected {text(want)}"
                f"{hint(name, rank, ranks)}")
    return ""


def hint(name, rank, ranks):
    """What a wrong value usually means."""
    if name == "broadcast":
        return " (rank 0's tensor, on every rank)"
    if name == "all_reduce AVG":
        return " (the sum divided by the world size: ReduceOp::AVG)"
    if name == "all_gather":
        return f" (all {ranks} ranks' tensors, in rank order)"
    if name == "reduce_scatter":
        return f" (chunk {rank} of every rank, summed over the ranks)"
    return ""


def check_barrier(v, run, ranks):
    """TODO 8: every rank enters the barrier, and nobody leaves it before all have arrived."""
    what = "every rank waits at the barrier until all have arrived"
    entered = [r for r in range(ranks) if "barrier" in collective_kinds(run, r)]
    seen = {r: BARRIER.findall(run.logs.get(r, "")) for r in range(ranks)}
    if not run.finished() and not entered and not any(seen.values()):
        v.unreached("barrier", what, "the run stopped before it")
        return
    why = ""
    for r in (r for r in range(ranks) if r not in entered):
        why = f"rank {r} never entered kit::barrier()"
        if seen[r] and int(seen[r][0][0]) < ranks:
            why += f": it went on when {seen[r][0][0]} of {ranks} ranks had arrived"
        if entered:
            why += (f"; rank {entered[0]} did, and waited for it: every rank must call every "
                    "collective, in the same order")
        break
    for r in range(ranks) if not why else []:
        if not seen[r]:
            why = f"rank {r} printed nothing after the barrier{stopped(run)}"
        elif int(seen[r][0][0]) != ranks:
            why = f"rank {r} left the barrier when {seen[r][0][0]} of {ranks} ranks had arrived"
        if why:
            break
    v.add("barrier", not why, what, why)


def judge(check):
    v, many, ranks = check.verdicts, check.many, check.ranks
    check_include(v, many, check.source, ranks)
    if check_setup(v, many, ranks):
        check_whoami(v, many, check.nodes, ranks)
        check_results(v, many, ranks)
        check_barrier(v, many, ranks)
    else:
        for concept in ("whoami", "broadcast", "all_reduce", "all_gather", "reduce_scatter",
                        "barrier"):
            v.add(concept, False, "needs setup()", "without it every process is rank 0 of 1, and "
                  "every collective is trivial", cause="setup")
    # Everything together, against the solution's run on the same ranks.
    mine = [results(many.logs.get(r, "")) for r in range(ranks)]
    theirs = [results(check.reference.logs.get(r, "")) for r in range(ranks)]
    alike = mine == theirs and all(mine)
    compare.judge_run(check, f"every rank's results and collectives on {ranks} ranks match the "
                      "solution's run", "" if alike else "the results differ from the solution's")
