#!/usr/bin/env python3
"""Check a trainer build of an exercise by what it DOES, TODO by TODO.

Runs the trainer once alone, once on several ranks of one node (ddprun; Gloo on CPU here, the
GPUs on a cluster node) and once with every rank on a node of its own (rank != local rank), with
the run trace switched on (KIT_TRACE_DIR, see common/kit/trace.h), and runs the solution on the
same data and seed. Then it judges every TODO from the traces and the ranks' output, prints one
line per TODO (✔ or ✘ with the reason) and exits 1 if any fails.

This is the one implementation of "student code reaches the same loss and uses every GPU": the
test suite (tests/student, tests/mutations) and `./kit check` all call it.

usage: check.py --exercise NAME --binary PROG --solution PROG --ddprun PROG --make-corpus PROG
                [--source FILE] [--ranks N] [--workdir DIR] [--reference-dir DIR] [--record FILE]
                [--keep]
       check.py --exercise NAME --explain-build LOG --source FILE
                (the build of FILE failed: show the compiler's first error, name the TODO near it)
"""
import argparse
import difflib
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

TOOLS = os.path.dirname(os.path.abspath(__file__))
STAGES_PY = os.path.join(TOOLS, "stages.py")

# Small and quick: the checks look at behaviour, not at model quality.
RUN_FLAGS = ["--epochs", "2", "--batch-size", "8", "--eval-batch-size", "16", "--seq-len", "16",
             "--d-model", "32", "--heads", "2", "--layers", "1", "--feedforward", "64",
             "--dropout", "0", "--seed", "7"]
EPOCHS = 2
# The run with one rank per node only has to show where each rank puts its model.
NODES_FLAGS = [f for f in RUN_FLAGS] + ["--max-steps", "2"]
NODES_FLAGS[NODES_FLAGS.index("--epochs") + 1] = "1"
CORPUS_FLAGS = ["--train-tokens", "4000", "--valid-tokens", "1200", "--test-tokens", "1200",
                "--seed", "3"]
LOSS_LINE = re.compile(r"train loss ([0-9.]+), validation loss ([0-9.]+)")
TEST_LINE = re.compile(r"test loss ([0-9.]+)")
RUN_TIMEOUT = 300
# Collectives of these tiny runs take milliseconds; a rank that waits this long waits for a rank
# that will never come (e.g. save0 called on rank 0 only). Long enough for slow process starts.
COLLECTIVE_TIMEOUT = "30"
CHECK = "\u2714"
CROSS = "\u2718"
# Losses are printed with 5 decimals and traced with 6.
LOSS_TOL = 2e-5


# --- running a trainer ----------------------------------------------------------------------------
class Run:
    """One launch of a trainer: its exit code, per-rank logs and per-rank traces.

    layout: "alone" (one process, no launcher), "node" (ddprun: all ranks on this node) or
    "nodes" (every rank alone on a simulated node of its own: RANK=r, LOCAL_RANK=0)."""

    def __init__(self, directory, ranks):
        self.dir, self.ranks = directory, ranks
        self.code, self.stdout, self.stderr = None, "", ""

    def paths(self):
        return (os.path.join(self.dir, d) for d in ("trace", "log", "out"))

    def launch(self, binary, layout, data, ddprun, flags=RUN_FLAGS):
        shutil.rmtree(self.dir, ignore_errors=True)
        trace_dir, log_dir, out_dir = self.paths()
        for d in (trace_dir, log_dir, out_dir):
            os.makedirs(d)
        env = dict(os.environ, KIT_TRACE_DIR=trace_dir, KIT_TIMEOUT=COLLECTIVE_TIMEOUT,
                   OMP_NUM_THREADS="1")
        for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                    "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                    "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
            env.pop(var, None)
        cmd = [binary, "--data-dir", data, "--out-dir", out_dir] + flags
        if layout == "nodes":
            self.code, self.stdout, self.stderr = run_nodes(cmd, env, self.ranks, log_dir, self.dir)
        else:
            if layout == "node":
                cmd = [ddprun, "--nproc-per-node", str(self.ranks), "--log-dir", log_dir, "--"] + cmd
            try:
                p = subprocess.run(cmd, env=env, cwd=self.dir, capture_output=True, text=True,
                                   timeout=RUN_TIMEOUT)
                self.code, self.stdout, self.stderr = p.returncode, p.stdout, p.stderr
            except subprocess.TimeoutExpired:
                self.code, self.stdout, self.stderr = -1, "", f"timed out after {RUN_TIMEOUT} s"
            if layout == "alone":
                with open(os.path.join(log_dir, "rank0.log"), "w") as f:
                    f.write(self.stdout + self.stderr)
                for p in os.listdir(trace_dir):  # no launcher, no RANK: named after the pid
                    os.rename(os.path.join(trace_dir, p), os.path.join(trace_dir, "rank0.trace"))
        with open(os.path.join(self.dir, "result.json"), "w") as f:
            json.dump({"code": self.code, "stdout": self.stdout, "stderr": self.stderr}, f)
        return self.load()

    def load(self):
        trace_dir, log_dir, self.out_dir = self.paths()
        with open(os.path.join(self.dir, "result.json")) as f:
            r = json.load(f)
        self.code, self.stdout, self.stderr = r["code"], r["stdout"], r["stderr"]
        self.logs = {r: read(os.path.join(log_dir, f"rank{r}.log")) for r in range(self.ranks)}
        self.traces = {r: parse_trace(os.path.join(trace_dir, f"rank{r}.trace"))
                       for r in range(self.ranks)}
        return self

    def events(self, rank, kind):
        return [fields for k, fields in self.traces[rank] if k == kind]

    def failure(self):
        """One line about a crash, or None."""
        if self.code == 0:
            return None
        why = last_line(self.stderr + self.stdout)
        for r in range(self.ranks):  # the rank's own last words say more than the launcher's
            line = last_line(self.logs.get(r, ""))
            if line and re.search(r"error|what\(\)|terminate|abort|timed out|exception", line, re.I):
                why = line if line.startswith(f"rank {r}") else f"rank {r}: {line}"
                break
        return f"exit code {self.code}: {why or 'no output'}"

    def reported(self, rank):
        """The loss lines this rank printed or would have printed (print0 records them all)."""
        out = []
        for pattern, parse in ((LOSS_LINE, lambda m: tuple(map(float, m.groups()))),
                               (TEST_LINE, lambda m: float(m.group(1)))):
            for lines in (self.events(rank, "print0"), self.logs[rank].splitlines()):
                found = [parse(m) for m in map(pattern.search, lines) if m]
                if found:  # print0's record first; a std::printf line only shows in the log
                    break
            out.append(found)
        return tuple(out)

    def finished(self):
        return self.code == 0


def run_nodes(cmd, env, ranks, log_dir, cwd):
    """Starts `ranks` processes as a job of `ranks` nodes with one rank each (what ddprun cannot
    do): rank r has local rank 0. Stops them all when one fails. Returns (code, stdout, stderr)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(ranks):
        e = dict(env, RANK=str(r), LOCAL_RANK="0", WORLD_SIZE=str(ranks), LOCAL_WORLD_SIZE="1",
                 GROUP_RANK=str(r), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        log = open(os.path.join(log_dir, f"rank{r}.log"), "w")
        procs.append((subprocess.Popen(cmd, env=e, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True), log))
    deadline, code, why = time.time() + RUN_TIMEOUT, 0, ""
    while any(p.poll() is None for p, _ in procs):
        failed = [(r, p.returncode) for r, (p, _) in enumerate(procs) if p.returncode not in (None, 0)]
        if failed or time.time() > deadline:
            code = failed[0][1] if failed else -1
            why = f"rank {failed[0][0]} exited with status {code}" if failed else \
                f"timed out after {RUN_TIMEOUT} s"
            break
        time.sleep(0.1)
    for p, log in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        log.close()
    if not code:
        bad = [(r, p.returncode) for r, (p, _) in enumerate(procs) if p.returncode != 0]
        if bad:
            code, why = bad[0][1], f"rank {bad[0][0]} exited with status {bad[0][1]}"
    return code, "", why


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def last_line(text):
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    return lines[-1] if lines else ""


def parse_trace(path):
    events = []
    for line in read(path).splitlines():
        kind, _, fields = line.partition(" ")
        events.append((kind, fields))
    return events


def kv(fields):
    return dict(part.split("=", 1) for part in fields.split() if "=" in part)


def epochs_of(run, rank, split):
    """The indices of `split` that `rank` read, one list per pass over the split (a pass is a
    run of consecutive batches of that split: training and evaluation alternate)."""
    passes, current = [], None
    for kind, fields in run.traces[rank]:
        if kind != "batch":
            continue
        name, _, idx = fields.partition(" ")
        if name != split:
            current = None
            continue
        if current is None:
            current = []
            passes.append(current)
        current.extend(int(i) for i in idx.split(",") if i)
    return passes


def first_pass(run, rank, split):
    passes = epochs_of(run, rank, split)
    return passes[0] if passes else []


def same_device(a, b):
    norm = lambda d: "cpu" if d in ("cpu", "cpu:0") else d  # noqa: E731 (cpu:0 is the cpu)
    return norm(a) == norm(b)


# --- the verdicts ---------------------------------------------------------------------------------
class Verdicts:
    def __init__(self):
        self.rows = []

    def add(self, todo, ok, what, why=""):
        self.rows.append((todo, ok, what, why))

    def print(self, out=sys.stdout):
        for todo, ok, what, why in self.rows:
            mark = CHECK if ok else CROSS
            out.write(f"  {mark} TODO {todo:<5} {what}" + (f": {why}" if why else "") + "\n")


def check_setup(v, run, nodes, source, ranks):
    setups = {r: run.events(r, "setup") for r in range(ranks)}
    included = source is not None and re.search(r'#\s*include\s+"kit/distributed\.h"',
                                                 read(source))
    called = all(setups[r] for r in range(ranks))
    if included or called:
        v.add("1", True, "the kit's distributed headers are included")
    else:
        v.add("1", False, "the kit's distributed headers are included",
              "kit/distributed.h is not included, so setup() cannot be called")
    what = "every rank joins the job with kit::setup() and drives its own device"
    if not called:
        v.add("2-3", False, "every rank joins the job with kit::setup()",
              f"setup() never ran: each of the {ranks} processes trained alone, as a world of 1")
        return False
    bad = []
    for r in range(ranks):
        s = kv(setups[r][0])
        want_device = s.get("device", "")
        if s.get("world_size") != str(ranks) or s.get("rank") != str(r):
            bad.append(f"rank {r} reports rank {s.get('rank')} of {s.get('world_size')}")
        elif want_device.startswith("cuda") and want_device != f"cuda:{s.get('local_rank')}":
            bad.append(f"rank {r} runs on {want_device}, not cuda:{s.get('local_rank')}")
    devices = [kv(setups[r][0]).get("device") for r in range(ranks)]
    if any(d.startswith("cuda") for d in devices) and len(set(devices)) < ranks:
        bad.append(f"ranks share GPUs: {devices}")
    # Where the model really went. On one node rank == local rank, so a GPU numbered by the global
    # rank only shows in the run with one rank per node.
    if nodes is not None and nodes.failure():
        bad.append(f"with every rank on a node of its own (rank != local rank) the trainer "
                   f"fails: {nodes.failure()}")
    else:
        found = (nodes and device_mismatch(nodes, ranks, "with one rank per node")) or \
            device_mismatch(run, ranks, "on one node")
        if found:
            bad.append(found)
    v.add("2-3", not bad, what, "; ".join(bad))
    return True


def device_mismatch(run, ranks, layout):
    for r in range(ranks):
        setup = kv(run.events(r, "setup")[0]) if run.events(r, "setup") else {}
        want, local = setup.get("device", ""), setup.get("local_rank", "?")
        asked = [kv(f).get("device", "") for f in run.events(r, "model_to")]
        used = [kv(f).get("device", "") for f in run.events(r, "forward")]
        for d in asked + used:
            if d and want and not same_device(d, want):
                index = d.partition(":")[2]
                why = f"rank {r} (local rank {local}, {layout}) put the model on {d}, but setup() " \
                      f"gave it {want}"
                if index == str(r) and str(r) != local:
                    why += ": that device is numbered by the global rank, but devices are " \
                           "numbered per node (cuda:local_rank); use the device setup() returns"
                else:
                    why += ": use the device setup() returns"
                return why
    return None


def check_samplers(v, run, ranks, reference):
    """TODOs 4-7. Returns {split: the loader reads through a sampler}, {split: its size}, and
    whether the training sampler shuffles."""
    n_samplers = len(run.events(0, "sampler"))
    sampler_problems, rows, uses, sizes = [], [], {}, {}
    train_shuffles = True
    for todo, split, name in (("5", "train", "training"), ("6", "valid", "validation"),
                              ("7", "test", "test")):
        per_rank = [first_pass(run, r, split) for r in range(ranks)]
        full = set().union(*(first_pass(reference, r, split) for r in range(reference.ranks)))
        sizes[split] = len(full)
        sets = [set(p) for p in per_rank]
        union = set().union(*sets)
        shared = set.intersection(*sets) if ranks > 1 else set()
        total = sum(len(p) for p in per_rank)
        what = f"each rank reads its own part of the {name} split"
        uses[split] = False
        if not union:
            rows.append((todo, False, what, f"no {name} batches were read"))
            continue
        if ranks > 1 and len(shared) == len(union):
            rows.append((todo, False, what, f"all {ranks} ranks read all {len(union)} {name} "
                         "samples: the loader has no sampler"))
            continue
        uses[split] = True
        overlap = total - len(union)
        own = True  # the loader reads through this split's own sampler
        if overlap > ranks - 1:  # a DistributedSampler pads by at most ranks-1
            # Every rank read a sampler-sized share, but the shares overlap: the samplers of the
            # ranks disagree on the order (TODO 4), the loader itself is fine.
            never = len(full - union)
            sampler_problems.append(
                f"the ranks' {name} slices overlap ({overlap} samples read by more than one rank, "
                f"{never} by none): every rank must shuffle the same list the same way, so give "
                "all ranks the same seed (args.seed, not a per-rank value)")
            rows.append((todo, True, what, ""))
        elif full and union != full:
            own = False
            rows.append((todo, False, what, f"together the ranks read {len(union & full)} of the "
                         f"{len(full)} {name} samples: hand this loader the {name} split's sampler"))
        else:
            rows.append((todo, True, what, ""))
        mine = per_rank[0]
        ordered = mine == sorted(mine)
        if not own:
            pass  # whose sampler it reads through is TODO 5-7's problem, not the shuffle's
        elif split == "train" and ordered and len(mine) > 2:
            train_shuffles = False
            sampler_problems.append("the training sampler does not shuffle (shuffle=true for the "
                                    "training set)")
        elif split != "train" and not ordered:
            sampler_problems.append(f"the {name} sampler shuffles: evaluation reads its split in "
                                    "order (shuffle=false; a DistributedSampler shuffles by default)")
    what4 = "a DistributedSampler for each split"
    if n_samplers < 3:
        v.add("4", False, what4, f"{n_samplers} sampler(s) created on rank 0, expected 3 "
              "(train, validation, test)")
    else:
        v.add("4", not sampler_problems, what4, "; ".join(sampler_problems))
    for row in rows:
        v.add(*row)
    return uses, sizes, train_shuffles


def check_ddp(v, run, ranks):
    what = "the model copies stay identical (DistributedDataParallel)"
    fps = [{kv(f)["step"]: kv(f)["params"] for f in run.events(r, "forward")} for r in range(ranks)]
    steps = sorted(set.intersection(*(set(f) for f in fps)), key=int) if fps else []
    if not steps:
        v.add("8", False, what, "no training step was traced")
        return
    differ = [s for s in steps if len({f[s] for f in fps}) > 1]
    reduced = all(run.events(r, "ddp_step") for r in range(ranks))
    if differ and differ[0] == steps[0]:
        v.add("8", False, what, f"the ranks start step {differ[0]} with different weights "
              "(rank 0 vs rank 1 fingerprint differs): wrap the model in DistributedDataParallel")
    elif differ:
        why = f"the ranks start step {steps[0]} with the same weights but step {differ[0]} with " \
              "different ones: the gradients were not averaged"
        if not reduced:
            why += "; the DistributedDataParallel object did not live through the training (a " \
                   "temporary?): give it a name, so it lives until the end of main()"
        v.add("8", False, what, why)
    elif not reduced:
        v.add("8", False, what, "the weights agree, but gradients were never averaged")
    else:
        v.add("8", True, what, "")


def check_set_epoch(v, run, ranks, sampled, train_size):
    what = "a new shuffle in every epoch (set_epoch)"
    if not sampled:
        v.add("9", False, what, "needs the training sampler first (TODOs 4 and 5)")
        return
    passes = max((epochs_of(run, r, "train") for r in range(ranks)), key=len)
    if len(passes) < 2:
        v.add("9", False, what, "the run stopped before epoch 2 (see above)")
        return
    n = min(len(passes[0]), len(passes[1]))
    if passes[0][:n] != passes[1][:n]:
        v.add("9", True, what)
        return
    # The order did not change. Was the training sampler told each epoch before its batches?
    events = run.traces[0]
    starts, previous = [], None  # event index of each training pass's first batch
    for i, (k, f) in enumerate(events):
        if k == "batch":
            split = f.partition(" ")[0]
            if split == "train" and previous != "train":
                starts.append(i)
            previous = split
    calls = [(i, f.split()[0], kv(f).get("size")) for i, (k, f) in enumerate(events)
             if k == "set_epoch"]
    train_calls = [(i, e) for i, e, size in calls if size in (None, str(train_size))]
    on_time = all(any(e == str(p) and i < starts[p] and (p == 0 or i > starts[p - 1])
                      for i, e in train_calls) for p in range(min(len(starts), EPOCHS)))
    if calls and not train_calls:
        v.add("9", False, what, "set_epoch() was called, but on another sampler (one of "
              f"{calls[0][2]} samples, the training set has {train_size}): call train_sampler.set_epoch")
    elif train_calls and on_time:
        # Told in time, yet the same order: the sampler does not shuffle or the loader reads
        # through another one; TODOs 4-5 say which.
        v.add("9", True, what, "")
    elif train_calls and starts and train_calls[0][0] > starts[0]:
        v.add("9", False, what, "set_epoch() is called after the epoch's batches were drawn, "
              "so epoch 2 repeats the order of epoch 1: call it at the start of every epoch")
    elif train_calls and len({e for _, e in train_calls}) == 1:
        v.add("9", False, what, f"set_epoch() gets {train_calls[0][1]} in every epoch: pass the "
              "epoch number")
    else:
        v.add("9", False, what, "epoch 2 read the training samples in exactly the order of "
              "epoch 1: the sampler was not told the epoch")


def check_all_reduce(v, run, ranks):
    what = "reported losses are averaged over all ranks"
    reports = [run.reported(r) for r in range(ranks)]
    if not reports[0][0] or not reports[0][1]:
        v.add("10", False, what, "rank 0 reported no loss lines")
        return
    for r in range(1, ranks):
        rep = reports[r]
        if not rep[0] and not rep[1]:
            continue  # this rank never reached a print (print0 on rank 0 only): nothing to compare
        if rep != reports[0]:
            mine, theirs = reports[0], rep
            a, b = (mine[1][0], theirs[1][0]) if mine[1] and theirs[1] else (mine[0][0][1], theirs[0][0][1])
            v.add("10", False, what, f"rank 0 and rank {r} report different losses ({a:.5f} vs "
                  f"{b:.5f}): each reported only its own share")
            return
    # What every rank put in and what rank 0 reported: the reported numbers must be the means.
    calls = [[kv(f) for f in run.events(r, "all_reduce")] for r in range(ranks)]
    n = min(len(c) for c in calls)
    ins = [[float(calls[r][k]["in"]) for r in range(ranks)] for k in range(n)]
    means = [sum(x) / ranks for x in ins]
    sums = [sum(x) for x in ins]
    own = [x[0] for x in ins]
    epochs, tests = reports[0]
    values = [(f"epoch {e + 1} training", t) for e, (t, _) in enumerate(epochs)] + \
             [(f"epoch {e + 1} validation", val) for e, (_, val) in enumerate(epochs)] + \
             [("test", t) for t in tests]
    close = lambda x, ys: any(math.isclose(x, y, rel_tol=1e-6, abs_tol=LOSS_TOL) for y in ys)  # noqa
    for label, x in values:
        if close(x, means):
            continue
        if close(x, sums):
            why = f"the {label} loss {x:.5f} is the sum over the {ranks} ranks, not their mean: " \
                  "ReduceOp::SUM without dividing by the world size; use kit::ReduceOp::AVG"
        elif close(x, own):
            why = f"the {label} loss {x:.5f} is rank 0's own value, not the mean over the ranks"
        elif n == 0:
            why = "no all_reduce was called"
        else:
            why = f"the {label} loss {x:.5f} is not the mean over the ranks of any all-reduced value"
        v.add("10", False, what, why)
        return
    expected = 2 * EPOCHS + 1  # train and validation per epoch, then test
    if n < expected and run.finished():
        v.add("10", False, what, f"only {n} of the {expected} losses were all-reduced")
        return
    v.add("10", True, what)


def check_print0(v, run, ranks):
    what = "only rank 0 prints the losses (print0)"
    noisy = [r for r in range(1, ranks)
             if LOSS_LINE.search(run.logs[r]) or TEST_LINE.search(run.logs[r])]
    if noisy:
        v.add("11", False, what, f"rank {noisy[0]} printed loss lines too, so the job output "
              f"has every line {ranks} times")
    elif not LOSS_LINE.search(run.logs[0]) or not TEST_LINE.search(run.logs[0]):
        v.add("11", False, what, "rank 0 printed no loss lines")
    else:
        v.add("11", True, what)


def split_at_destroy(run, rank):
    """(events before destroy_process_group, events after it) of one rank."""
    events = run.traces[rank]
    at = next((i for i, (k, _) in enumerate(events) if k == "destroy"), len(events))
    return events[:at], events[at + 1:]


def check_save0(v, run, ranks):
    what = "only rank 0 writes the checkpoints (save0)"
    names = ("model-best.pt", "model-final.pt")
    calls = {r: [f for k, f in run.traces[r] if k == "save0"] for r in range(ranks)}
    count = {r: {n: sum(1 for f in calls[r] if os.path.basename(f.split()[0]) == n) for n in names}
             for r in range(ranks)}
    problems, unsaved, missing = [], [], []
    for name in names:
        exists = os.path.isfile(os.path.join(run.out_dir, name))
        short = [r for r in range(1, ranks) if count[r][name] < count[0][name]]
        if short:
            problems.append(f"only rank 0 called save0 for {name} (rank {short[0]} did not): save0 "
                            "ends with a barrier that every rank must reach, so inside "
                            "if (rank == 0) rank 0 waits for ranks that never come (a hang, or a "
                            "crash once they exit); call it on every rank, it writes on rank 0 only")
        elif not any(count[r][name] for r in range(ranks)):
            if exists:
                unsaved.append(name)
            elif run.finished():
                missing.append(name)
    if unsaved:
        problems.append(f"{' and '.join(unsaved)} written without save0: with torch::save every "
                        f"one of the {ranks} ranks writes the same file at once")
    if missing:
        problems.append(f"{' and '.join(missing)} missing")
    writers = sorted({r for r in range(1, ranks)
                      for k, f in split_at_destroy(run, r)[0] if k == "save0" and f.endswith(" wrote")})
    if writers:
        problems.append(f"rank {writers[0]} wrote checkpoints too")
    v.add("12", not problems, what, "; ".join(problems))


def check_destroy(v, run, ranks):
    what = "the process group is closed at the end"
    after = [(r, k, f) for r in range(ranks) for k, f in split_at_destroy(run, r)[1]
             if k in ("save0", "print0", "all_reduce", "ddp_step", "forward")]
    destroyed = [r for r in range(ranks) if any(k == "destroy" for k, _ in run.traces[r])]
    exits = [run.events(r, "exit") for r in range(ranks)]
    if after:
        r, k, f = after[0]
        v.add("13", False, what, f"destroy_process_group() ran before "
              f"{k}({os.path.basename(f.split()[0]) if f else ''})"
              f" on rank {r}: without a group every rank acts as rank 0 of 1; close the group "
              "after the last print0/save0")
    elif run.finished() and any("group_alive=1" in e[-1] for e in exits if e):
        v.add("13", False, what, "the process group was still alive when the program ended")
    elif not run.finished() and not destroyed:
        v.add("13", False, what, "the run stopped before the end (see above)")
    elif not all(exits) and run.finished():
        v.add("13", False, what, "needs setup() first (TODOs 2-3)")
    else:
        v.add("13", True, what)


def final_test_loss(run):
    _, tests = run.reported(0)
    return tests[-1] if tests else None


# --- a build that failed ----------------------------------------------------------------------------
DIAG = re.compile(r"^(?P<path>[^:\s][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)?\s*"
                  r"(?P<kind>fatal error|error|warning|note)?:?\s*(?P<msg>.*)$")
QUOTED = re.compile(r"[\u2018'`]([A-Za-z_][A-Za-z0-9_:]*)[\u2019']")


def stages_json(*args):
    out = subprocess.run([sys.executable, STAGES_PY] + list(args), capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    return json.loads(out.stdout)


def annotated_parts(exercise, source):
    """The annotated source's parts for the file `source` is a version of (matched by name)."""
    sys.path.insert(0, TOOLS)
    import stages  # noqa: E402 (the renderer: one parser of the annotation syntax)
    info = stages_json("info", exercise)
    base = os.path.basename(source)
    for f in info.get("files", []):
        if os.path.basename(f["exercise"]) == base or os.path.basename(f["solution"]) == base:
            return stages.parse(os.path.join(stages.ROOT, f["source"]))
    files = info.get("files", [])
    return stages.parse(os.path.join(stages.ROOT, files[0]["source"])) if files else []


def norm(line):
    return " ".join(line.split())


def todo_at(parts, lines, lineno):
    """The TODO block the student's line `lineno` (1-based) belongs to, or None: the common lines
    of the annotated source are aligned with the student's file, and the line is placed in the
    gap between two of them; several TODO blocks in one gap are told apart by similarity."""
    units = []  # ("line", text) / ("block", block) in order
    for kind, item in parts:
        units.append((kind, norm(item) if kind == "line" else item))
    common = [(i, t) for i, (k, t) in enumerate(units) if k == "line" and t]
    mine = [norm(l) for l in lines]
    sm = difflib.SequenceMatcher(None, [t for _, t in common], mine, autojunk=False)
    placed = {}  # unit index -> student line (1-based)
    for a, b, size in sm.get_matching_blocks():
        for k in range(size):
            placed[common[a + k][0]] = b + k + 1
    before = max((u for u, l in placed.items() if l <= lineno), default=-1)
    if placed.get(before) == lineno:
        return None  # a line outside every TODO block
    after = min((u for u, l in placed.items() if l > lineno), default=len(units))
    blocks = [units[u][1] for u in range(before + 1, after)
              if units[u][0] == "block" and not units[u][1].get("variant")]
    if len(blocks) <= 1:
        return blocks[0] if blocks else None
    text = mine[lineno - 1] if 0 < lineno <= len(mine) else ""
    m = re.search(r"TODO\s+(\d+(?:-\d+)?)\s*:", text)
    if m:
        return next((b for b in blocks if b["label"] == m.group(1)), blocks[0])

    def score(b):
        cands = [norm(l) for l in b["solution"] + b["exercise"] + b["text"] if l.strip()]
        return max((difflib.SequenceMatcher(None, text, c).ratio() for c in cands), default=0)
    return max(blocks, key=score)


def provider(parts, identifier):
    """The first TODO block whose solution brings `identifier` (declares it, includes it)."""
    word = re.compile(r"\b" + re.escape(identifier.split("::")[-1]) + r"\b")
    for kind, item in parts:
        if kind == "block" and not item.get("variant") and any(word.search(l) for l in item["solution"]):
            return item
    return None


def explain_build(exercise, log_path, source):
    log = read(log_path)
    lines = log.splitlines()
    src = os.path.realpath(source)

    def is_mine(path):
        try:
            return os.path.realpath(path) == src or os.path.samefile(path, src)
        except OSError:
            return False
    errors = [i for i, l in enumerate(lines)
              if (m := DIAG.match(l)) and m.group("kind") in ("error", "fatal error")]
    # The first error in the student's file; else the first at all (a template instantiated from
    # their file reports in a header, with a "required from here" line pointing back at them).
    first = next((i for i in errors if is_mine(DIAG.match(lines[i]).group("path"))),
                 errors[0] if errors else None)
    print(f"check {exercise}: {source} does not compile")
    if first is None:
        shown = [l for l in lines if "rror" in l][:15] or lines[-15:]
        print("\n".join("    " + l for l in shown))
        print(f"  {CROSS} the build failed, but not with a compiler error in {source}")
        print("passed: -")
        print("failed: build")
        return 1
    # The first error with its context lines (the code and the caret below it).
    start = first - 1 if first > 0 and ("In function" in lines[first - 1] or
                                        "In member function" in lines[first - 1]) else first
    end = first + 1
    while end < len(lines) and end - first < 12 and lines[end][:1].isspace():
        end += 1
    print("\n".join("    " + l for l in lines[start:end]))
    # Where in the student's file: the error itself, or the "required from here" of its group.
    where, msg = None, DIAG.match(lines[first]).group("msg")
    for l in lines[start:] if is_mine(DIAG.match(lines[first]).group("path")) else \
            lines[max(0, start - 30):first + 30]:
        m = DIAG.match(l)
        if m and is_mine(m.group("path")):
            where = int(m.group("line"))
            break
    try:
        parts = annotated_parts(exercise, source)
    except Exception as e:  # noqa: BLE001 (a missing annotated source must not hide the error)
        parts = []
        sys.stderr.write(f"check: cannot read the annotated source: {e}\n")
    mine = read(source).splitlines()
    block = todo_at(parts, mine, where) if where and parts else None
    why = f"line {where}: {msg}" if where else msg
    named = None
    ident = [i for i in QUOTED.findall(msg) if i not in ("kit", "torch", "std")]
    # GCC's and Clang's words for "this name is unknown here".
    if re.search(r"not declared|not a member|does not name a type|no such file|was not found|"
                 r"undeclared|has no member|no member named|unknown type name|file not found",
                 msg, re.I) and ident:
        giver = provider(parts, ident[0])
        if giver is not None and (block is None or giver["first"] <= block["first"]):
            named = giver
            if block is not None and block is not giver:
                why += f" (in TODO {block['label']}); {ident[0]} comes with TODO {giver['label']}"
            else:
                why += f"; {ident[0]} comes with TODO {giver['label']}"
    if named is None:
        named = block
    if named is not None:
        print(f"  {CROSS} TODO {named['label']:<5} does not compile: {why}")
    elif where is None:
        print(f"  {CROSS} the build failed in {DIAG.match(lines[first]).group('path')}, not in "
              f"{source}: {msg}")
    else:
        print(f"  {CROSS} does not compile: {why} (not inside a TODO block: look at the TODO you "
              "changed last)")
    print("passed: -")
    print(f"failed: {named['label'] if named is not None else 'build'}")
    return 1


# --- the reference run, shared between checks ------------------------------------------------------
def reference_run(solution, ranks, directory, data, ddprun):
    """The solution's run. With --reference-dir it is made once and reused while the solution
    binary and the flags stay the same (a lock keeps parallel checks from racing)."""
    st = os.stat(solution)
    key = json.dumps([solution, st.st_mtime_ns, st.st_size, ranks, RUN_FLAGS, CORPUS_FLAGS])
    stamp = os.path.join(directory, "key.json")
    run = Run(os.path.join(directory, f"solution{ranks}"), ranks)
    if read(stamp) == key and run.dir and os.path.isfile(os.path.join(run.dir, "result.json")):
        return run.load()
    run.launch(solution, "node", data, ddprun)
    if run.code == 0:
        with open(stamp, "w") as f:
            f.write(key)
    return run


def make_corpus(make_corpus_bin, directory):
    data = os.path.join(directory, "corpus")
    if not os.path.isfile(os.path.join(data, "wiki.test.tokens")):
        subprocess.run([make_corpus_bin, "--out", data] + CORPUS_FLAGS, check=True,
                       capture_output=True)
    return data


class Locked:
    def __init__(self, directory):
        os.makedirs(directory, exist_ok=True)
        self.f = open(os.path.join(directory, ".lock"), "w")

    def __enter__(self):
        fcntl.flock(self.f, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def record(path, exercise, source, verdicts):
    """What `kit list` reads: the result of this check, for this exact content of the source."""
    digest = hashlib.sha256(open(source, "rb").read()).hexdigest() if source else ""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"exercise": exercise, "source": os.path.abspath(source) if source else "",
                   "sha256": digest, "time": time.strftime("%Y-%m-%d %H:%M"),
                   "passed": [t for t, ok, _, _ in verdicts.rows if ok],
                   "failed": [t for t, ok, _, _ in verdicts.rows if not ok]}, f)
    os.replace(tmp, path)


def not_judged_note(exercise):
    """A line about the TODOs of the exercise's other files (job scripts), judged elsewhere."""
    try:
        rows = stages_json("todos", exercise, "--json")
    except Exception:  # noqa: BLE001 (only a note)
        return None
    other = sorted({(r["file"], r["first"], r["last"]) for r in rows if r.get("lang", "cpp") != "cpp"},
                   key=lambda t: t[1])
    if not other:
        return None
    files = sorted({f for f, _, _ in other})
    lo, hi = min(a for _, a, _ in other), max(b for _, _, b in other)
    return f"  \u00b7 TODOs {lo}-{hi} ({', '.join(files)}) are not judged here: they run on a cluster"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exercise", required=True)
    ap.add_argument("--explain-build", metavar="LOG",
                    help="the build of --source failed with this log: explain and exit 1")
    ap.add_argument("--binary")
    ap.add_argument("--solution")
    ap.add_argument("--ddprun")
    ap.add_argument("--make-corpus")
    ap.add_argument("--source", help="the trainer's source file (only TODO 1 looks at it)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--workdir")
    ap.add_argument("--reference-dir", help="where the solution's run is kept and reused")
    ap.add_argument("--record", metavar="FILE", help="write the result as JSON (for kit list)")
    ap.add_argument("--keep", action="store_true", help="keep the run folders")
    a = ap.parse_args(argv)
    if a.explain_build:
        if not a.source:
            ap.error("--explain-build needs --source")
        return explain_build(a.exercise, a.explain_build, a.source)
    missing = [o for o in ("binary", "solution", "ddprun", "make_corpus") if not getattr(a, o)]
    if missing:
        ap.error("missing " + ", ".join("--" + m.replace("_", "-") for m in missing))
    a.binary, a.solution, a.ddprun, a.make_corpus = map(
        os.path.abspath, (a.binary, a.solution, a.ddprun, a.make_corpus))
    for prog in (a.binary, a.solution, a.ddprun, a.make_corpus):
        if not os.access(prog, os.X_OK):
            sys.stderr.write(f"check: {prog} is not built\n")
            return 2
    if a.ranks < 2:
        sys.stderr.write("check: --ranks must be at least 2\n")
        return 2
    workdir = a.workdir or tempfile.mkdtemp(prefix="kit-check-")
    os.makedirs(workdir, exist_ok=True)
    ranks = a.ranks

    print(f"check {a.exercise}: {a.binary}")
    if a.reference_dir:
        with Locked(a.reference_dir):
            data = make_corpus(a.make_corpus, a.reference_dir)
            reference = reference_run(a.solution, ranks, a.reference_dir, data, a.ddprun)
    else:
        data = make_corpus(a.make_corpus, workdir)
        reference = None
    alone = Run(os.path.join(workdir, "alone"), 1).launch(a.binary, "alone", data, a.ddprun)
    if alone.failure():
        print(f"  {CROSS} the trainer does not run on its own: {alone.failure()}")
        return 1
    many = Run(os.path.join(workdir, f"ranks{ranks}"), ranks).launch(a.binary, "node", data, a.ddprun)
    if many.failure():
        print(f"  {CROSS} the trainer fails on {ranks} ranks: {many.failure()}")
    if reference is None:
        reference = reference_run(a.solution, ranks, workdir, data, a.ddprun)
    if reference.failure():
        print(f"  {CROSS} the solution itself fails: {reference.failure()}")
        return 1
    joined = all(many.events(r, "setup") for r in range(ranks))
    nodes = None
    if joined and many.finished():
        nodes = Run(os.path.join(workdir, f"nodes{ranks}"), ranks).launch(
            a.binary, "nodes", data, a.ddprun, NODES_FLAGS)

    v = Verdicts()
    if check_setup(v, many, nodes, a.source, ranks):
        uses, sizes, _ = check_samplers(v, many, ranks, reference)
        check_ddp(v, many, ranks)
        check_set_epoch(v, many, ranks, uses.get("train"), sizes.get("train"))
    else:
        for todo in ("4", "5", "6", "7", "8", "9"):
            v.add(todo, False, "needs setup()", "without it every process is rank 0 of 1")
    check_all_reduce(v, many, ranks)
    check_print0(v, many, ranks)
    check_save0(v, many, ranks)
    check_destroy(v, many, ranks)
    mine, theirs = final_test_loss(many), final_test_loss(reference)
    same = many.finished() and mine is not None and theirs is not None and \
        math.isclose(mine, theirs, rel_tol=1e-4)
    why = "" if same else "the run did not finish (see above)" if not many.finished() else \
        f"{mine} vs the solution's {theirs}; the first {CROSS} above is the place to look"
    v.add("all", same, f"final test loss on {ranks} ranks matches the solution's", why)
    v.print()
    note = not_judged_note(a.exercise)
    if note:
        print(note)
    failed = [t for t, ok, _, _ in v.rows if not ok]
    passed = [t for t, ok, _, _ in v.rows if ok]
    print(f"passed: {','.join(passed) or '-'}")
    print(f"failed: {','.join(failed) or '-'}")
    if a.record:
        record(a.record, a.exercise, a.source, v)
    if not a.keep and not a.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
