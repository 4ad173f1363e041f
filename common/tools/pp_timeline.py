#!/usr/bin/env python3
"""The pipeline's bubble, measured and drawn: a run's trace as a per-rank timeline, and its idle
fraction next to the formula (p - 1) / (v m + p - 1).

  pp_timeline.py draw TRACE_DIR [--svg OUT.svg] [--json OUT.json] [--skip 1] [--draw-step K]
                 [--label "1F1B, d 256"]
  pp_timeline.py sweep --trainer ex05-solution --ddprun ddprun --make-corpus make_corpus
                 --work DIR [--configs 1f1b:2:1:8,gpipe:4:1:16,...] [--repeats 3] [--steps 5]
                 [--skip 1] [-- TRAINER FLAGS]

TRACE_DIR is a run's KIT_TRACE_DIR: one rank<N>.trace per rank (common/kit/check/trace.h). What
this tool reads from it:
  pp        kind=F|B stage=<chunk> mb=<micro-batch> t0= t1=   each forward and backward
            (kit::pp::Chunk, kit/pipeline/stage.h), steady-clock microseconds: one clock for the
            processes of a machine, so that ranks of one node line up (not across nodes);
  p2p_wait  kind=send|recv peer= t0= t1=                      each wait on a send or receive
            (kit/runtime/process_group.h): drawn under the row, counted as idle;
  pp ... live0= live=   with KIT_MEMORY_COUNT=1 (kit/train/memory.h): the rank's live tensor
            bytes when each action began and ended, for the activations alive at once (below).
The shape comes from the trace: p * v = the number of chunks, v = the chunks of rank 0, m = the
micro-batches. A training step of a rank is its 2 v m forwards and backwards in a row (the
evaluation's forwards have no backward and are left out). Step k's frame runs from the first
rank's first action to the last rank's last action; a rank is idle in it whenever it runs no
forward and no backward: receives, sends, the glue between actions, and waiting for its peers
(the bubble). The first --skip steps (default 1) are the warm-up (allocations, first-touch
pages) and are not measured. The measured idle fraction is the sum of idle rank-time over
(ranks x frame), the same definition as kit::pp::simulate's on paper, whose exact value for whole
rounds is the formula. Beside it, the replay: the same actions with their measured durations,
each started as soon as its rank is free and its input exists, messages free (simulate's rule):
the idle that the schedule and the actions' measured times (unequal stages, actions stretched
by other processes) explain; what the measured idle has beyond it is
messages, the glue between actions, and other processes on the machine.

`draw` prints, per measured step, each rank's idle fraction and the whole step's, and their mean,
next to the formula; where the trace has the live bytes, each rank's activations alive at once
(activations()): the most bytes above the step's start, less the gradients (which the first
backward of each chunk allocates), beside the schedule's most forwards in flight (run, their
backward not yet: 1F1B p - r on rank r, GPipe m) and what those forwards had added. It writes
the SVG (one step, --draw-step, default the first measured one: the deck's timeline) and the
Chrome/Perfetto JSON (every event of the run: open it in https://ui.perfetto.dev or
chrome://tracing). `sweep` runs the trainer for each configuration
SCHEDULE:PP:V:M (ddprun, one process per rank, OMP_NUM_THREADS=1) --repeats times on a small
generated corpus and prints measured against formula, median and spread over the repeats.
Python standard library only.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "images"))
from style import COLORS, FONT, GRID, INK, LIGHT, MUTED, Svg  # noqa: E402  (images/style.py)

RECV, SEND = "#394b59", "#9aa5b1"  # the wait bars under a row


def formula(p, v, m):
    """kit::pp::bubble_formula (kit/pipeline/schedule.h)."""
    return (p - 1) / (v * m + p - 1)


# --- reading a run ----------------------------------------------------------------------------

def kv(fields):
    return dict(part.split("=", 1) for part in fields.split() if "=" in part)


def read_traces(trace_dir):
    """{rank: {"pp": [(kind, chunk, micro, t0, t1)], "wait": [(kind, peer, t0, t1)]}}, in the
    order each rank recorded them."""
    if not os.path.isdir(trace_dir):
        raise SystemExit(f"pp_timeline: {trace_dir} is not a folder (give the run's KIT_TRACE_DIR)")
    ranks = {}
    for name in os.listdir(trace_dir):
        m = re.fullmatch(r"rank(\d+)\.trace", name)
        if not m:
            continue
        pp, waits, live = [], [], []
        with open(os.path.join(trace_dir, name), errors="replace") as f:
            for line in f:
                event, _, fields = line.rstrip("\n").partition(" ")
                if event == "pp":
                    d = kv(fields)
                    pp.append((d["kind"], int(d["stage"]), int(d["mb"]), int(d["t0"]), int(d["t1"])))
                    live.append((int(d["live0"]), int(d["live"])) if "live" in d else None)
                elif event == "p2p_wait" and "t0" in fields:
                    d = kv(fields)
                    waits.append((d["kind"], int(d["peer"]), int(d["t0"]), int(d["t1"])))
        ranks[int(m.group(1))] = {"pp": pp, "wait": waits, "live": live}
    if not ranks:
        raise SystemExit(f"pp_timeline: no rank<N>.trace in {trace_dir} (run with KIT_TRACE_DIR set)")
    if not any(r["pp"] for r in ranks.values()):
        raise SystemExit(f"pp_timeline: the traces in {trace_dir} have no 'pp' events: not a "
                         "pipelined run (exercise 05's trainer records them)")
    return ranks


def shape_of(ranks):
    """(p, v, m) from the chunks and micro-batches the trace names."""
    chunks = {c for r in ranks.values() for (_, c, _, _, _) in r["pp"]}
    v = len({c for (_, c, _, _, _) in ranks[min(ranks)]["pp"]})
    m = 1 + max(mb for r in ranks.values() for (_, _, mb, _, _) in r["pp"])
    if len(chunks) % v:
        raise SystemExit(f"pp_timeline: {len(chunks)} chunks in the trace, {v} on rank {min(ranks)}: "
                         "not an even split")
    return len(chunks) // v, v, m


def training_windows(pp, v, m):
    """Where a rank's training steps are in its actions: [(first, end)], each 2 v m actions in a
    row with v m backwards. Evaluation's forwards (no backward) fall between them and are
    skipped: a window that starts on one has too few backwards, since every training step ends
    with a backward."""
    n, windows, i = 2 * v * m, [], 0
    while i + n <= len(pp):
        window = pp[i:i + n]
        if sum(1 for a in window if a[0] == "B") == v * m and window[0][0] == "F":
            windows.append((i, i + n))
            i += n
        else:
            i += 1
    return windows


def activations(acts, live):
    """One rank's step: its actions and their (live0, live) bytes. Returns (alive, kept,
    in_flight): the most bytes of activations alive after any action, measured (live bytes above
    the step's start, less each chunk's gradients from its first backward on: that backward's
    growth plus what its forward had added); the most that the forwards in flight (run, their
    backward not yet) had added, by the schedule's order and each forward's own growth; and the
    most forwards in flight. None without live bytes."""
    if not acts or any(x is None for x in live):
        return None
    base, grads, added, flight, backed = live[0][0], 0, {}, set(), set()
    alive = kept = most = 0
    for (kind, c, mb, _, _), (before, after) in zip(acts, live):
        if kind == "F":
            added[(c, mb)] = after - before
            flight.add((c, mb))
        else:
            if c not in backed:  # this chunk's first backward: its gradients are made here
                backed.add(c)
                grads += (after - before) + added.get((c, mb), 0)
            flight.discard((c, mb))
        alive = max(alive, after - base - grads)
        kept = max(kept, sum(added[k] for k in flight))
        most = max(most, len(flight))
    return alive, kept, most


def busy_union(intervals, lo, hi):
    """Total length of the union of [t0, t1) intervals, clipped to [lo, hi)."""
    total, end = 0, lo
    for t0, t1 in sorted((max(a, lo), min(b, hi)) for a, b in intervals):
        if t1 <= end:
            continue
        total += t1 - max(t0, end)
        end = t1
    return total


def replay(actions, chunks):
    """The idle fraction of the same actions with their measured durations, each started as soon
    as its rank is free and its input exists, messages free: kit::pp::simulate with real costs.
    What the schedule and the stages' unequal times cost; the rest of the measured idle is the
    messages, the glue between actions and the machine. None for pp x dp runs (a chunk on
    several ranks)."""
    owners = {}
    for r, acts in actions.items():
        for a in acts:
            owners.setdefault(a[1], set()).add(r)
    if any(len(o) > 1 for o in owners.values()):
        return None
    end, free, at = {}, {r: 0 for r in actions}, {r: 0 for r in actions}
    busy, left = 0, sum(len(a) for a in actions.values())
    while left:
        moved = False
        for r, acts in actions.items():
            if at[r] == len(acts):
                continue
            kind, c, mb, t0, t1 = acts[at[r]]
            need = (None if c == 0 else ("F", c - 1, mb)) if kind == "F" else \
                (("F", c, mb) if c == chunks - 1 else ("B", c + 1, mb))
            if need is not None and need not in end:
                continue
            start = max(free[r], end[need] if need else 0)
            free[r] = end[(kind, c, mb)] = start + (t1 - t0)
            busy += t1 - t0
            at[r] += 1
            left -= 1
            moved = True
        if not moved:
            return None
    return 1 - busy / (len(actions) * max(max(free.values()), 1))


def measure(ranks, skip=1):
    """The run's steps and idle fractions. Returns a dict: p, v, m, formula, steps (each: frame
    (t0, t1), per-rank idle fraction, overall idle fraction, per-rank actions), measured (the
    indices of the steps measured: all but the first `skip`), idle (mean overall over them),
    idle_per_rank (mean per rank over them)."""
    p, v, m = shape_of(ranks)
    windows = {r: training_windows(d["pp"], v, m) for r, d in ranks.items()}
    per_rank = {r: [ranks[r]["pp"][i:j] for i, j in w] for r, w in windows.items()}
    count = min(len(s) for s in per_rank.values())
    if count != max(len(s) for s in per_rank.values()):  # a rank's trace cut short (a crash)
        print("note: training steps per rank " + ", ".join(
            f"r{r} {len(s)}" for r, s in sorted(per_rank.items())) + f": the first {count} used")
    if count == 0:
        raise SystemExit("pp_timeline: some rank has no complete training step (2 v m forwards "
                         "and backwards) in its trace")
    steps = []
    for k in range(count):
        actions = {r: per_rank[r][k] for r in ranks}
        memory = {r: activations(actions[r], ranks[r]["live"][slice(*windows[r][k])])
                  for r in ranks}
        lo = min(a[3] for acts in actions.values() for a in acts)
        hi = max(a[4] for acts in actions.values() for a in acts)
        length = max(hi - lo, 1)
        idle = {r: 1 - busy_union([(a[3], a[4]) for a in acts], lo, hi) / length
                for r, acts in actions.items()}
        steps.append({"frame": (lo, hi), "idle": idle, "overall": sum(idle.values()) / len(idle),
                      "actions": actions, "replay": replay(actions, p * v), "memory": memory})
    measured = list(range(min(skip, count - 1), count))
    return {
        "p": p, "v": v, "m": m, "formula": formula(p, v, m), "steps": steps, "measured": measured,
        "idle": statistics.mean(steps[k]["overall"] for k in measured),
        "idle_per_rank": {r: statistics.mean(steps[k]["idle"][r] for k in measured) for r in ranks},
        "replay": None if any(steps[k]["replay"] is None for k in measured)
        else statistics.mean(steps[k]["replay"] for k in measured),
    }


def report(result, out=sys.stdout):
    p, v, m, f = result["p"], result["v"], result["m"], result["formula"]
    steps, measured = result["steps"], result["measured"]
    print(f"pipeline p {p}, v {v}, m {m}: {len(steps)} training steps in the trace; step 1 is "
          f"warm-up, measured: steps {measured[0] + 1}-{measured[-1] + 1}" if measured[0] > 0 else
          f"pipeline p {p}, v {v}, m {m}: {len(steps)} training step(s), all measured "
          "(no warm-up step to skip)", file=out)
    for k in measured:
        s = steps[k]
        per = " ".join(f"r{r} {s['idle'][r]:.3f}" for r in sorted(s["idle"]))
        rep = f", replayed {s['replay']:.3f}" if s["replay"] is not None else ""
        print(f"  step {k + 1}: {(s['frame'][1] - s['frame'][0]) / 1000:.1f} ms, idle {per} | "
              f"all {s['overall']:.3f}{rep}", file=out)
    per = " ".join(f"r{r} {x:.3f}" for r, x in sorted(result["idle_per_rank"].items()))
    print(f"mean idle per rank: {per}", file=out)
    # Unequal stages (the last has the output layer and the loss) and a busy machine (an action
    # stretched by other processes) both grow the bubble beyond the formula's equal stages.
    for r in sorted(result["idle_per_rank"]):
        acts = [a for k in measured for a in steps[k]["actions"][r]]
        ms = {kind: [(a[4] - a[3]) / 1000 for a in acts if a[0] == kind] for kind in "FB"}
        print(f"  rank {r}: forward {statistics.median(ms['F']):.1f} ms "
              f"({min(ms['F']):.1f}-{max(ms['F']):.1f}), backward {statistics.median(ms['B']):.1f} ms "
              f"({min(ms['B']):.1f}-{max(ms['B']):.1f}) (median, min-max)", file=out)
    print(f"idle fraction measured {result['idle']:.3f}, formula (p-1)/(v m+p-1) = "
          f"{p - 1}/{v * m + p - 1} = {f:.3f} (measured/formula {result['idle'] / f:.2f})"
          if f > 0 else f"idle fraction measured {result['idle']:.3f}, formula 0 (p = 1)", file=out)
    if result["replay"] is not None:
        print(f"the same actions replayed with their measured durations, messages free: idle "
              f"{result['replay']:.3f} (the schedule and the stages' unequal times; the rest of "
              "the measured idle is messages, glue and the machine)", file=out)
    memory = steps[measured[0]]["memory"]
    if all(x is not None for x in memory.values()):
        print(f"activations alive at once, step {measured[0] + 1} (KIT_MEMORY_COUNT's live bytes, "
              "the gradients left out), against the schedule's micro-batches in flight:", file=out)
        for r in sorted(memory):
            alive, kept, most = memory[r]
            print(f"  rank {r}: {alive / 1024:.0f} KiB at most; the schedule has at most {most} "
                  f"forwards in flight, which added {kept / 1024:.0f} KiB "
                  f"(measured/schedule {alive / max(kept, 1):.2f})", file=out)


# --- drawing -----------------------------------------------------------------------------------

def draw_svg(result, k, ranks, label=""):
    """Step k of the run as a timeline, a row per rank, in images/style.py's style."""
    p, v, m = result["p"], result["v"], result["m"]
    step = result["steps"][k]
    lo, hi = step["frame"]
    rows = sorted(step["actions"])
    x0, width, row_h, gap, top = 120, 900, 40, 16, 70
    width_total = 1180
    scale = width / max(hi - lo, 1)
    height = top + len(rows) * (row_h + gap) + 116
    title = (f"{label + ': ' if label else ''}measured timeline of training step {k + 1}, "
             f"p = {p}, v = {v}, m = {m}")
    svg = Svg(width_total, height, title)
    svg.text(20, 34, title, size=19, anchor="start", weight="bold")
    for i, r in enumerate(rows):
        y = top + i * (row_h + gap)
        svg.text(x0 - 12, y + 26, f"rank {r}", size=15, anchor="end", fill=COLORS[r % len(COLORS)])
        svg.rect(x0, y, width, row_h, fill="url(#idle)", stroke=GRID, sw=1, rx=3)
        for kind, chunk, mb, t0, t1 in step["actions"][r]:
            x, w = x0 + (t0 - lo) * scale, max((t1 - t0) * scale, 1)
            c = chunk % len(COLORS)
            fwd = kind == "F"
            # A box with its action as a tooltip ("0F3"), which the test reads back in x order.
            svg.add(f'<rect x="{x:.2f}" y="{y:g}" width="{w:.2f}" height="{row_h:g}" rx="2" '
                    f'fill="{LIGHT[c] if fwd else COLORS[c]}" stroke="{COLORS[c]}" stroke-width="1">'
                    f'<title>rank {r}: {chunk}{kind}{mb}</title></rect>')
            if w >= 9 * len(str(mb)) + 4:
                svg.text(x + w / 2, y + 26, str(mb), size=14, fill=INK if fwd else "white",
                         weight="bold")
        for kind, _peer, t0, t1 in ranks[r]["wait"]:
            a, b = max(t0, lo), min(t1, hi)
            if b > a:
                svg.rect(x0 + (a - lo) * scale, y + row_h + 2, max((b - a) * scale, 1), 6,
                         fill=RECV if kind == "recv" else SEND, stroke="none", sw=0, rx=1)
        svg.text(x0 + width + 12, y + 26, f"idle {100 * step['idle'][r]:.0f}%", size=15,
                 anchor="start", fill=MUTED)
    y = top + len(rows) * (row_h + gap) + 4
    ms = (hi - lo) / 1000
    tick = next(t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 1e9)
                if ms / t <= 8)
    t = 0
    while t <= ms + 1e-9:
        x = x0 + t * 1000 * scale
        svg.line(x, y, x, y + 6, stroke=MUTED, sw=1)
        svg.text(x, y + 24, f"{t:g}", size=14, fill=MUTED)
        t += tick
    svg.text(x0 + width + 12, y + 24, "ms", size=14, anchor="start", fill=MUTED)
    # Legend: forward, backward, the waits, idle.
    ly = y + 44
    c0 = 0
    svg.rect(x0, ly, 34, 22, fill=LIGHT[c0], stroke=COLORS[c0], sw=1, rx=2)
    svg.text(x0 + 42, ly + 17, "forward", size=15, anchor="start")
    svg.rect(x0 + 130, ly, 34, 22, fill=COLORS[c0], stroke=COLORS[c0], sw=1, rx=2)
    svg.text(x0 + 172, ly + 17, "backward", size=15, anchor="start")
    svg.rect(x0 + 270, ly + 8, 34, 6, fill=RECV, stroke="none", sw=0, rx=1)
    svg.text(x0 + 312, ly + 17, "receive (wait)", size=15, anchor="start")
    svg.rect(x0 + 440, ly + 8, 34, 6, fill=SEND, stroke="none", sw=0, rx=1)
    svg.text(x0 + 482, ly + 17, "send (wait)", size=15, anchor="start")
    svg.rect(x0 + 590, ly, 34, 22, fill="url(#idle)", stroke=GRID, sw=1, rx=2)
    svg.text(x0 + 632, ly + 17, "idle", size=15, anchor="start")
    svg.text(x0 + 690, ly + 17, "in a box: micro-batch; colour: chunk", size=15, anchor="start",
             fill=MUTED)
    f = result["formula"]
    svg.text(20, ly + 56, f"idle (no forward or backward running) in this step "
             f"{100 * step['overall']:.1f}%, over steps {result['measured'][0] + 1}-"
             f"{result['measured'][-1] + 1} {100 * result['idle']:.1f}%; formula "
             f"(p−1)/(v m+p−1) = {p - 1}/{v * m + p - 1} = {100 * f:.1f}%.", size=15,
             anchor="start", fill=MUTED)
    return svg.render()


def chrome_trace(result, ranks):
    """Chrome trace event format (JSON object form): a process per rank, with a thread for its
    forwards and backwards, one for its waits, and one for the training steps' frames. Times in
    microseconds from the first event."""
    t_min = min(a[3] for d in ranks.values() for a in d["pp"])
    ev = []
    for r, d in sorted(ranks.items()):
        ev.append({"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"rank {r}"}})
        for tid, name in ((0, "forward/backward"), (1, "send/recv waits"), (2, "training steps")):
            ev.append({"name": "thread_name", "ph": "M", "pid": r, "tid": tid, "args": {"name": name}})
        for kind, chunk, mb, t0, t1 in d["pp"]:
            ev.append({"name": f"{chunk}{kind}{mb}", "cat": "forward" if kind == "F" else "backward",
                       "ph": "X", "ts": t0 - t_min, "dur": t1 - t0, "pid": r, "tid": 0,
                       "args": {"chunk": chunk, "micro_batch": mb}})
        for kind, peer, t0, t1 in d["wait"]:
            ev.append({"name": f"{kind} {'to' if kind == 'send' else 'from'} {peer}", "cat": kind,
                       "ph": "X", "ts": t0 - t_min, "dur": t1 - t0, "pid": r, "tid": 1,
                       "args": {"peer": peer}})
    for k, s in enumerate(result["steps"]):
        lo, hi = s["frame"]
        for r in sorted(ranks):
            ev.append({"name": f"step {k + 1}", "cat": "step", "ph": "X", "ts": lo - t_min,
                       "dur": hi - lo, "pid": r, "tid": 2,
                       "args": {"idle_fraction": round(s["idle"][r], 4),
                                "measured": k in result["measured"]}})
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"p": result["p"], "v": result["v"], "m": result["m"],
                          "idle_measured": round(result["idle"], 4),
                          "idle_formula": round(result["formula"], 4)}}


def draw(args):
    ranks = read_traces(args.trace_dir)
    result = measure(ranks, args.skip)
    report(result)
    k = (args.draw_step - 1) if args.draw_step else result["measured"][0]
    if not 0 <= k < len(result["steps"]):
        raise SystemExit(f"pp_timeline: --draw-step {args.draw_step}: the trace has "
                         f"{len(result['steps'])} training steps")
    if not any(d["wait"] for d in ranks.values()):
        print("note: no p2p_wait events with t0/t1 in the trace: waits are not drawn "
              "(idle time is still measured)")
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(draw_svg(result, k, ranks, args.label))
        print(f"wrote {args.svg} (step {k + 1})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(chrome_trace(result, ranks), f)
        print(f"wrote {args.json}")
    return 0


# --- the sweep ---------------------------------------------------------------------------------

CORPUS = ["--train-tokens", "60000", "--valid-tokens", "600", "--test-tokens", "600", "--seed", "3"]


def sweep(args, trainer_flags):
    os.makedirs(args.work, exist_ok=True)
    data = os.path.join(args.work, "data")
    if not os.path.isdir(data):
        subprocess.run([args.make_corpus, "--out", data] + CORPUS, check=True, capture_output=True)
    rows = []
    for spec in args.configs.split(","):
        schedule, p, v, m = spec.split(":")
        p, v, m = int(p), int(v), int(m)
        values, replays = [], []
        for rep in range(args.repeats):
            run = os.path.join(args.work, f"{schedule}-p{p}-v{v}-m{m}-{rep}")
            shutil.rmtree(run, ignore_errors=True)
            trace = os.path.join(run, "trace")
            os.makedirs(trace)
            env = dict(os.environ, KIT_TRACE_DIR=trace, OMP_NUM_THREADS="1", KIT_TIMEOUT="300")
            cmd = [args.ddprun, "--nproc-per-node", str(p), "--", args.trainer, "--data-dir", data,
                   "--out-dir", os.path.join(run, "out"), "--pp", str(p), "--schedule", schedule,
                   "--chunks", str(v), "--micro-batches", str(m), "--epochs", "1",
                   "--max-steps", str(args.steps)] + trainer_flags
            load = os.getloadavg()[0]  # what else ran on the machine: part of the conditions
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{spec} repeat {rep}: exit {done.returncode}\n{done.stdout[-2000:]}"
                      f"{done.stderr[-2000:]}", file=sys.stderr)
                return 1
            result = measure(read_traces(trace), args.skip)
            values.append(result["idle"])
            replays.append(result["replay"])
            step_ms = statistics.median((s["frame"][1] - s["frame"][0]) / 1000
                                        for s in (result["steps"][k] for k in result["measured"]))
            print(f"{spec} repeat {rep}: idle {result['idle']:.3f}, step {step_ms:.0f} ms, "
                  f"load average {load:.1f} before", flush=True)
        f = formula(p, v, m)
        med = statistics.median(values)
        rows.append((schedule, p, v, m, f, med, min(values), max(values),
                     statistics.median(replays) if None not in replays else float("nan")))
    print(f"\n{'schedule':<12} {'p':>2} {'v':>2} {'m':>3}  {'formula':>7}  {'measured':>8}  "
          f"{'min':>5}-{'max':<5}  {'meas/formula':>12}  within 10%  {'replayed':>8}")
    for schedule, p, v, m, f, med, lo, hi, rep in rows:
        ok = "yes" if abs(med - f) <= 0.1 * f else "no"
        print(f"{schedule:<12} {p:>2} {v:>2} {m:>3}  {f:>7.3f}  {med:>8.3f}  {lo:.3f}-{hi:.3f}  "
              f"{med / f:>12.2f}  {ok:<10}  {rep:>8.3f}")
    print("replayed: the same actions with their measured durations, messages free (median)")
    print(f"measured: median (min-max) over {args.repeats} runs of each run's mean idle fraction "
          f"over steps {args.skip + 1}-{args.steps} (the first {args.skip}: warm-up, left out); "
          f"OMP_NUM_THREADS=1; trainer flags: {' '.join(trainer_flags)}")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    trainer_flags = []
    if "--" in argv:
        i = argv.index("--")
        argv, trainer_flags = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("draw", help="a run's timeline and idle fraction")
    d.add_argument("trace_dir")
    d.add_argument("--svg")
    d.add_argument("--json")
    d.add_argument("--skip", type=int, default=1, help="warm-up steps left out (default 1)")
    d.add_argument("--draw-step", type=int, help="the step to draw, from 1 (default: the first measured)")
    d.add_argument("--label", default="", help="what the title says first, e.g. the schedule")
    s = sub.add_parser("sweep", help="measured against the formula over configurations")
    s.add_argument("--trainer", required=True)
    s.add_argument("--ddprun", required=True)
    s.add_argument("--make-corpus", required=True)
    s.add_argument("--work", required=True)
    s.add_argument("--configs", default="1f1b:2:1:4,1f1b:2:1:8,1f1b:2:1:16,gpipe:2:1:8,"
                   "interleaved:2:2:8,1f1b:4:1:4,1f1b:4:1:16,interleaved:4:2:16",
                   help="SCHEDULE:PP:V:M,... (default: pp 2 and pp 4, m from p to 8p)")
    s.add_argument("--repeats", type=int, default=3)
    s.add_argument("--steps", type=int, default=5, help="training steps per run (default 5)")
    s.add_argument("--skip", type=int, default=1)
    args = ap.parse_args(argv)
    if args.command == "draw":
        return draw(args)
    return sweep(args, trainer_flags)


if __name__ == "__main__":
    sys.exit(main())
