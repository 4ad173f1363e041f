#!/usr/bin/env python3
"""common/tools/pp_timeline.py on real runs: exercise 05's solution at pp 2, m 4 (ddprun, with
KIT_TRACE_DIR) under gpipe, 1f1b and interleaved (v 2), 3 training steps and an evaluation each.
For each run the tool must
  * print the measured idle fraction and the formula's 1/(v 4 + 1) for the run's p, v, m;
  * write an SVG that parses as XML, with a row of boxes per rank whose actions, read left to
    right (each box's <title>), are the schedule's list for that rank (kit::pp::actions, printed
    by build/bin/pp_orders);
  * write a Chrome/Perfetto JSON that parses, whose forwards and backwards per rank, in time
    order, are that list once per training step;
  * print each rank's activations alive at once, measured with the counting allocator
    (KIT_MEMORY_COUNT=1), beside the schedule's most forwards in flight, which must be the list's
    (1F1B p - r, GPipe m), the measured bytes within 0.95-1.5 of what those forwards added (the
    rest: the step's sent tensors, kept to its end), and 1F1B's rank 0 at most 0.7 of GPipe's.
A trace folder without traces is refused with one line and a non-zero exit.

usage: pp_timeline_run.py --trainer EX05 --ddprun DDPRUN --make-corpus MAKE_CORPUS
                          --pp-orders PP_ORDERS --work DIR
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
from verdict import expect, finish  # noqa: E402

TOOL = os.path.join(HERE, "..", "..", "common", "tools", "pp_timeline.py")
FLAGS = ["--epochs", "1", "--max-steps", "3", "--batch-size", "8", "--eval-batch-size", "8",
         "--seq-len", "16", "--d-model", "32", "--heads", "2", "--layers", "4", "--feedforward",
         "64", "--dropout", "0", "--seed", "7"]
CORPUS = ["--train-tokens", "4000", "--valid-tokens", "300", "--test-tokens", "300", "--seed", "3"]
RUNS = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)]
SVG = "{http://www.w3.org/2000/svg}"


def lists(probe, schedule, p, v, m):
    out = subprocess.run([probe, schedule, str(p), str(v), str(m)], capture_output=True,
                         text=True, check=True).stdout
    return {int(line.split(":")[0].split()[1]): line.split(":")[1].split()
            for line in out.splitlines() if line.startswith("rank")}


def svg_rows(path):
    """{rank: [action, ...]} from the boxes' titles, in x order."""
    rows = {}
    for rect in ET.parse(path).getroot().iter(SVG + "rect"):
        title = rect.find(SVG + "title")
        if title is not None and title.text.startswith("rank "):
            rank, action = title.text[5:].split(": ")
            rows.setdefault(int(rank), []).append((float(rect.get("x")), action))
    return {r: [a for _, a in sorted(boxes)] for r, boxes in rows.items()}


MEMORY = re.compile(r"rank (\d+): (\d+) KiB at most; the schedule has at most (\d+) forwards in "
                    r"flight, which added (\d+) KiB \(measured/schedule ([0-9.]+)\)")


def in_flight(actions):
    """The most forwards run whose backward has not, in a rank's list ("0F1", "1B0", ...)."""
    now = most = 0
    for a in actions:
        now += 1 if "F" in a else -1
        most = max(most, now)
    return most


def main():
    ap = argparse.ArgumentParser()
    for flag in ("--trainer", "--ddprun", "--make-corpus", "--pp-orders", "--work"):
        ap.add_argument(flag, required=True)
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    data = os.path.join(args.work, "data")
    subprocess.run([args.make_corpus, "--out", data] + CORPUS, check=True, capture_output=True)
    p, m = 2, 4
    alive0 = {}  # schedule -> rank 0's activations at most, KiB
    for schedule, v in RUNS:
        run = os.path.join(args.work, schedule)
        trace = os.path.join(run, "trace")
        os.makedirs(trace)
        env = dict(os.environ, KIT_TRACE_DIR=trace, OMP_NUM_THREADS="1", KIT_TIMEOUT="120",
                   KIT_MEMORY_COUNT="1")
        done = subprocess.run([args.ddprun, "--nproc-per-node", str(p), "--", args.trainer,
                               "--data-dir", data, "--out-dir", os.path.join(run, "out"),
                               "--pp", str(p), "--schedule", schedule, "--chunks", str(v),
                               "--micro-batches", str(m)] + FLAGS,
                              env=env, capture_output=True, text=True)
        if not expect(done.returncode == 0, f"{schedule}: the pp {p} run succeeds",
                      done.stdout[-3000:] + done.stderr[-3000:]):
            continue
        svg, js = os.path.join(run, "timeline.svg"), os.path.join(run, "timeline.json")
        tool = subprocess.run([sys.executable, TOOL, "draw", trace, "--svg", svg, "--json", js,
                               "--label", schedule], capture_output=True, text=True)
        f = (p - 1) / (v * m + p - 1)
        expect(tool.returncode == 0 and f"= {f:.3f}" in tool.stdout and
               "idle fraction measured" in tool.stdout,
               f"{schedule}: the tool prints the measured idle fraction and the formula {f:.3f}",
               tool.stdout + tool.stderr)
        want = lists(args.pp_orders, schedule, p, v, m)
        try:
            rows = svg_rows(svg)
        except (ET.ParseError, OSError) as e:
            rows = f"not well-formed: {e}"
        expect(rows == want, f"{schedule}: the SVG is well-formed XML and each rank's boxes, left "
               "to right, are the schedule's list", f"drawn {rows}\nschedule {want}")
        memory = {int(g[0]): g for g in MEMORY.findall(tool.stdout)}
        flight = {r: in_flight(a) for r, a in want.items()}
        expect(sorted(memory) == sorted(want) and
               all(int(memory[r][2]) == flight[r] and 0.95 <= float(memory[r][4]) <= 1.5
                   for r in want),
               f"{schedule}: each rank's activations alive at once, measured, beside the "
               f"schedule's forwards in flight {flight} and within 0.95-1.5 of what they added",
               tool.stdout)
        if 0 in memory:
            alive0[schedule] = int(memory[0][1])
        try:
            with open(js) as fh:
                events = json.load(fh)["traceEvents"]
        except (ValueError, OSError, KeyError) as e:
            events = []
            expect(False, f"{schedule}: the JSON parses", str(e))
        steps = [e for e in events if e.get("cat") == "step" and e["pid"] == 0]
        boxes = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("forward", "backward")]
        ok, detail = len(steps) == 3, f"{len(steps)} steps"
        for r, actions in want.items():
            for s in steps:
                got = [e["name"] for e in sorted(boxes, key=lambda e: e["ts"])
                       if e["pid"] == r and e["tid"] == 0 and
                       s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"]]
                if got != actions:
                    ok, detail = False, f"rank {r} {s['name']}: {got}, schedule {actions}"
        expect(ok, f"{schedule}: the JSON has 3 training steps, each rank's forwards and "
               "backwards in each the schedule's list", detail)
    if "gpipe" in alive0 and "1f1b" in alive0:
        expect(alive0["1f1b"] <= 0.7 * alive0["gpipe"],
               f"1F1B keeps fewer activations alive on rank 0 than GPipe: {alive0['1f1b']} KiB "
               f"against {alive0['gpipe']} KiB (2 micro-batches in flight against {m})", str(alive0))
    empty = os.path.join(args.work, "empty")
    os.makedirs(empty)
    bad = subprocess.run([sys.executable, TOOL, "draw", empty], capture_output=True, text=True)
    expect(bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "rank" in bad.stderr,
           "a folder without traces: one line, non-zero exit", bad.stdout + bad.stderr)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
