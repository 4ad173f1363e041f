"""Judgments shared by the DDP exercises, one per concept of the course ("setup", "sampler",
"ddp", "all_reduce", ...). Each adds a verdict under the concept's name; the exercise's rules
(common/tools/rules/) map the names to its TODO numbers. Each judges what the run did (the
traces and the ranks' output), never the source text."""
import math
import os
import re

from .runs import epochs_of, first_pass, kv, read, same_device


def reported(run, rank, rules):
        """The loss lines this rank printed or would have printed (print0 records them all)."""
        out = []
        for pattern, parse in ((rules.LOSS_LINE, lambda m: tuple(map(float, m.groups()))),
                               (rules.TEST_LINE, lambda m: float(m.group(1)))):
            for lines in (run.events(rank, "print0"), run.logs[rank].splitlines()):
                found = [parse(m) for m in map(pattern.search, lines) if m]
                if found:  # print0's record first; a std::printf line only shows in the log
                    break
            out.append(found)
        return tuple(out)


def check_setup(v, run, nodes, source, ranks):
    setups = {r: run.events(r, "setup") for r in range(ranks)}
    included = source is not None and re.search(r'#\s*include\s+"kit/runtime/distributed\.h"',
                                                 read(source))
    called = all(setups[r] for r in range(ranks))
    if included or called:
        v.add("include", True, "the kit's distributed headers are included")
    else:
        v.add("include", False, "the kit's distributed headers are included",
              "kit/runtime/distributed.h is not included, so setup() cannot be called")
    what = "every rank joins the job with kit::setup() and drives its own device"
    if not called:
        v.add("setup", False, "every rank joins the job with kit::setup()",
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
    if run.finished():
        idle = idle_rank(run, ranks)
        if idle:
            bad.append(idle)
    v.add("setup", not bad, what, "; ".join(bad))
    if not any(d.startswith("cuda") for d in devices):
        # On the CPU the check sees which device each rank asks for, but not a GPU that is
        # really driven: say so rather than pass it.
        v.note("setup", "needs a GPU: that every rank drives the GPU of its local rank with "
               "NCCL and holds memory on it; run ./kit check on a GPU node for that")
    return True


def idle_rank(run, ranks):
    """Every rank reports, at each epoch's end, the training steps it did on its device
    (kit::Metrics::end_epoch): a rank that did none, or on another device than setup() gave it,
    is a rank that does not pull its weight."""
    for r in range(ranks):
        setup = kv(run.events(r, "setup")[0]) if run.events(r, "setup") else {}
        reports = [kv(f) for f in run.events(r, "epoch_report")]
        if not reports:
            return f"rank {r} reported no epoch: it did not train"
        for rep in reports:
            if rep.get("steps") == "0":
                return f"rank {r} did no training step in epoch {rep.get('epoch')}"
            if setup.get("device") and not same_device(rep.get("device", ""), setup["device"]):
                return f"rank {r} reported its work on {rep.get('device')}, but setup() gave it " \
                       f"{setup['device']}"
    return None


def device_mismatch(run, ranks, layout):
    for r in range(ranks):
        setup = kv(run.events(r, "setup")[0]) if run.events(r, "setup") else {}
        want, local = setup.get("device", ""), setup.get("local_rank", "?")
        asked = [kv(f).get("device", "") for f in run.events(r, "model_to")]
        used = [kv(f).get("device", "") for f in run.events(r, "forward")]
        wrapped = [kv(f).get("device", "") for f in run.events(r, "ddp")]  # when DDP wrapped it
        for d in asked + used + wrapped:
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


# (concept, split, its name in a verdict): the splits of exercise 01; a rules module with other
# splits passes its own.
SPLITS = (("loader-train", "train", "training"), ("loader-valid", "valid", "validation"),
          ("loader-test", "test", "test"))


def check_samplers(v, run, ranks, reference, splits=SPLITS, unpadded=()):
    """TODOs sampler and loader-*. Returns {split: the loader reads through a sampler}, {split: its size}, and
    whether the training sampler shuffles. The splits in `unpadded` must be read without padding
    (a DistributedEvalSampler): each sample by exactly one rank."""
    n_samplers = len(run.events(0, "sampler"))
    sampler_problems, rows, uses, sizes = [], [], {}, {}
    train_shuffles = True
    for todo, split, name in splits:
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
            rows.append((todo, None if not run.finished() else False, what,
                         "the run stopped before it" if not run.finished()
                         else f"no {name} batches were read"))
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
        elif full and union != full and not run.finished():
            # A pass cut short by the stop: no evidence of whose sampler it reads through.
            rows.append((todo, None, what, "the run stopped during it"))
            continue
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
        if own and split in unpadded and 0 < overlap <= ranks - 1:
            sampler_problems.append(
                f"{overlap} {name} sample(s) were read by two ranks: a DistributedSampler pads its "
                "split with repeats, so the loss would depend on the number of ranks; use a "
                "kit::DistributedEvalSampler")
    what4 = "a DistributedSampler for each split"
    if n_samplers < len(splits):
        v.add("sampler", False, what4, f"{n_samplers} sampler(s) created on rank 0, expected "
              f"{len(splits)} ({', '.join(split for _, split, _ in splits)})")
    else:
        v.add("sampler", not sampler_problems, what4, "; ".join(sampler_problems))
    for todo, ok, what, why in rows:
        if ok is None:
            v.unreached(todo, what, why)
        else:
            v.add(todo, ok, what, why)
    return uses, sizes, train_shuffles


def check_ddp(v, run, ranks):
    what = "the model copies stay identical (DistributedDataParallel)"
    fps = [{kv(f)["step"]: kv(f)["params"] for f in run.events(r, "forward")} for r in range(ranks)]
    steps = sorted(set.intersection(*(set(f) for f in fps)), key=int) if fps else []
    if not steps:
        if not run.finished():
            v.unreached("ddp", what, "the run stopped before the first training step")
        else:
            v.add("ddp", False, what, "no training step was traced")
        return
    differ = [s for s in steps if len({f[s] for f in fps}) > 1]
    reduced = all(run.events(r, "ddp_step") for r in range(ranks))
    if differ and differ[0] == steps[0]:
        v.add("ddp", False, what, f"the ranks start step {differ[0]} with different weights "
              "(rank 0 vs rank 1 fingerprint differs): wrap the model in DistributedDataParallel")
    elif differ:
        why = f"the ranks start step {steps[0]} with the same weights but step {differ[0]} with " \
              "different ones: the gradients were not averaged"
        if not reduced and run.events(0, "ddp_no_sync"):
            why += f"; every backward ran inside ddp.no_sync() (TODO {v.todo('no_sync')})"
        elif not reduced:
            why += "; the DistributedDataParallel object did not live through the training (a " \
                   "temporary?): give it a name, so it lives until the end of main()"
        v.add("ddp", False, what, why,
              cause="no_sync" if not reduced and run.events(0, "ddp_no_sync") else None)
    elif not reduced:
        v.add("ddp", False, what, "the weights agree, but gradients were never averaged")
    else:
        v.add("ddp", True, what, "")


def check_ddp_forward(v, run, ranks):
    """For a model with buffers (batch norm): the training forward goes through ddp.forward,
    which copies rank 0's buffers to every rank first (kit/ddp/ddp.h: broadcast_buffers, PyTorch's
    default), each copy traced as ddp_buffers. PyTorch's rule skips the copy after a forward made
    inside no_sync(), so a trainer that runs a step's first K-1 micro-batches wholly inside the
    guard copies once per step: at least one copy per optimizer step on every rank passes."""
    what = "the training forward goes through the wrapper (ddp.forward: rank 0's batch-norm " \
           "buffers to every rank first)"
    if not all(run.events(r, "ddp") for r in range(ranks)):
        return  # no DistributedDataParallel: check_ddp says so
    steps = len(run.events(0, "step"))
    if steps == 0:
        return  # check_ddp says no training step was traced
    copies = [len(run.events(r, "ddp_buffers")) for r in range(ranks)]
    short = next((r for r in range(ranks) if copies[r] < steps), None)
    if short is None:
        v.add("ddp_forward", True, what)
        return
    why = f"DDP broadcast rank 0's buffers {copies[short]} times in {steps} steps on rank " \
          f"{short}: the training forward calls model->forward(x), not ddp.forward(x) (or " \
          "broadcast_buffers is off), so each rank's batch norm keeps statistics of its own " \
          "batches only, where Python's ddp_model(x) would start every forward from rank 0's"
    sums = [[kv(f).get("buffers") for f in run.events(r, "forward")] for r in range(ranks)]
    for k in range(min(map(len, sums))):
        other = next((r for r in range(1, ranks) if sums[r][k] != sums[0][k]), None)
        if other is not None:
            why += f" (from training forward {k + 1} on, rank 0 and rank {other} start with " \
                   "different running statistics)"
            break
    if run.events(0, "ddp_no_sync") and not run.events(0, "ddp_step"):
        # PyTorch's rule: a forward copies the buffers only after a forward outside no_sync().
        # With every forward inside the guard none is, and the guard's TODO is the mistake.
        v.add("ddp_forward", False, what, f"DDP broadcast rank 0's buffers {copies[short]} times "
              f"in {steps} steps on rank {short}: every forward ran inside ddp.no_sync(), and "
              f"a forward copies them only after one outside it (TODO {v.todo('no_sync')})",
              cause="no_sync")
        return
    v.add("ddp_forward", False, what, why)


def check_set_epoch(v, run, ranks, sampled, train_size, rules, shuffles=True):
    """Judged by the order in which the training samples were read: epoch 2 must not repeat epoch
    1, whatever was called. The set_epoch calls in the trace only help to say why it did."""
    what = "a new shuffle in every epoch (set_epoch)"
    if not sampled:
        v.add("set_epoch", False, what, f"needs the training sampler first (TODOs {v.todo('sampler')} and "
              f"{v.todo('loader-train')})", cause="sampler")
        return
    passes = max((epochs_of(run, r, "train") for r in range(ranks)), key=len)
    if len(passes) < 2:
        v.unreached("set_epoch", what, "the run stopped before epoch 2")
        return
    n = min(len(passes[0]), len(passes[1]))
    if passes[0][:n] != passes[1][:n]:
        v.add("set_epoch", True, what)
        return
    if not shuffles:
        v.add("set_epoch", False, what, "epoch 2 read the training samples in exactly the order "
              f"of epoch 1: the training sampler does not shuffle (TODO {v.todo('sampler')}), so "
              "no epoch can differ", cause="sampler")
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
                      for i, e in train_calls) for p in range(min(len(starts), rules.EPOCHS)))
    if calls and not train_calls:
        v.add("set_epoch", False, what, "set_epoch() was called, but on another sampler (one of "
              f"{calls[0][2]} samples, the training set has {train_size}): call train_sampler.set_epoch")
    elif train_calls and on_time:
        # Told in time, yet the same order: whatever the calls, the training did not get a new
        # shuffle (a loader that reads through another sampler, a sampler that ignores the epoch).
        v.add("set_epoch", False, what, "set_epoch() was called before every epoch, yet epoch 2 "
              "read the training samples in exactly the order of epoch 1: the training loader "
              "does not read through the sampler that was told the epoch, or that sampler "
              "ignores it")
    elif train_calls and starts and train_calls[0][0] > starts[0]:
        v.add("set_epoch", False, what, "set_epoch() is called after the epoch's batches were drawn, "
              "so epoch 2 repeats the order of epoch 1: call it at the start of every epoch")
    elif train_calls and len({e for _, e in train_calls}) == 1:
        v.add("set_epoch", False, what, f"set_epoch() gets {train_calls[0][1]} in every epoch: pass the "
              "epoch number")
    else:
        v.add("set_epoch", False, what, "epoch 2 read the training samples in exactly the order of "
              "epoch 1: the sampler was not told the epoch")


def reported_values(report, rules):
    """(label, value) of every number a rank reported: each epoch line's fields, named by the
    rules' REPORTED (default: exercise 01's training and validation loss), then the test loss."""
    names = getattr(rules, "REPORTED", ("training loss", "validation loss"))
    epochs, tests = report
    return [(f"epoch {e + 1} {name}", fields[i]) for i, name in enumerate(names)
            for e, fields in enumerate(epochs)] + [("test loss", t) for t in tests]


def check_all_reduce(v, run, ranks, rules):
    what = getattr(rules, "ALL_REDUCE_WHAT", "reported losses are averaged over all ranks")
    reports = [reported(run, r, rules) for r in range(ranks)]
    if not reports[0][0] or not reports[0][1]:
        if run.finished():
            v.add("all_reduce", False, what, "rank 0 reported no loss lines")
        elif not reports[0][0] and not reports[0][1]:
            v.unreached("all_reduce", what, "the run stopped before the first reported loss")
        return
    for r in range(1, ranks):
        rep = reports[r]
        if not rep[0] and not rep[1]:
            continue  # this rank never reached a print (print0 on rank 0 only): nothing to compare
        if rep != reports[0]:
            differ = [(label, a, b) for (label, a), (_, b) in
                      zip(reported_values(reports[0], rules), reported_values(rep, rules)) if a != b]
            label, a, b = differ[0] if differ else ("loss", float("nan"), float("nan"))
            v.add("all_reduce", False, what, f"rank 0 and rank {r} report a different {label} "
                  f"({a:.5f} vs {b:.5f}): each reported only its own share")
            return
    # What every rank put in and what rank 0 reported: the reported numbers must be the means of
    # all-reduced values, or (an evaluation) the ratios of an all-reduced [loss sum, count] pair,
    # [loss sum, correct predictions, count] triple or [sums..., count] (the capstone's ROUGE) to
    # its count (the last value).
    calls = [[kv(f) for f in run.events(r, "all_reduce")] for r in range(ranks)]
    n = min(len(c) for c in calls)
    ins = [[[float(x) for x in calls[r][k]["in"].split(",")] for r in range(ranks)]
           for k in range(n)]
    means, sums, own = [], [], []
    for x in ins:
        if all(len(values) == 1 for values in x):
            means.append(sum(v[0] for v in x) / ranks)
            sums.append(sum(v[0] for v in x))
            own.append(x[0][0])
        elif len({len(values) for values in x}) == 1 and len(x[0]) >= 2 and x[0][-1]:
            count = sum(v[-1] for v in x)
            for i in range(len(x[0]) - 1):
                means.append(sum(v[i] for v in x) / count)
                own.append(x[0][i] / x[0][-1])
    close = lambda x, ys: any(math.isclose(x, y, rel_tol=1e-6, abs_tol=rules.LOSS_TOL) for y in ys)  # noqa
    for label, x in reported_values(reports[0], rules):
        if close(x, means):
            continue
        if close(x, sums):
            why = f"the {label} {x:.5f} is the sum over the {ranks} ranks, not their mean: " \
                  "ReduceOp::SUM without dividing by the world size; use kit::ReduceOp::AVG"
        elif close(x, own):
            why = f"the {label} {x:.5f} is rank 0's own value, not reduced over the ranks"
        elif n == 0:
            why = "no all_reduce was called"
        else:
            why = f"the {label} {x:.5f} is not the mean over the ranks of any all-reduced value " \
                  "(nor the ratio of an all-reduced sum and count)"
        v.add("all_reduce", False, what, why)
        return
    # Each epoch's reported numbers, then the test loss (the rules' REDUCED when it differs).
    expected = getattr(rules, "REDUCED", len(getattr(rules, "REPORTED", "..")) * rules.EPOCHS + 1)
    if n < expected and run.finished():
        v.add("all_reduce", False, what, f"only {n} of the {expected} reported numbers were "
              "all-reduced")
        return
    v.add("all_reduce", True, what)


def check_print0(v, run, ranks, rules):
    what = "only rank 0 prints the losses (print0)"
    noisy = [r for r in range(1, ranks)
             if rules.LOSS_LINE.search(run.logs[r]) or rules.TEST_LINE.search(run.logs[r])]
    if noisy:
        v.add("print0", False, what, f"rank {noisy[0]} printed loss lines too, so the job output "
              f"has every line {ranks} times")
    elif not run.finished() and not rules.LOSS_LINE.search(run.logs[0]):
        v.unreached("print0", what, "the run stopped before the first loss line")
    elif not rules.LOSS_LINE.search(run.logs[0]) or not rules.TEST_LINE.search(run.logs[0]) and \
            run.finished():
        v.add("print0", False, what, "rank 0 printed no loss lines")
    else:
        v.add("print0", True, what)


def split_at_destroy(run, rank):
    """(events before destroy_process_group, events after it) of one rank."""
    events = run.traces[rank]
    at = next((i for i, (k, _) in enumerate(events) if k == "destroy"), len(events))
    return events[:at], events[at + 1:]


def check_save0(v, run, ranks, rules):
    """Judged by what the file system saw (Run.writes: inotify on the out-dir), not by what the
    kit says about itself: every complete write of a checkpoint and, for the kit's atomic write,
    the pid of the writer, which the ranks' traces map to a rank. The trace only tells how often
    each rank called save0."""
    what = "only rank 0 writes the checkpoints (save0)"
    names = rules.SAVED_FILES
    calls = {r: [f for k, f in run.traces[r] if k == "save0"] for r in range(ranks)}
    count = {r: {n: sum(1 for f in calls[r] if os.path.basename(f.split()[0]) == n) for n in names}
             for r in range(ranks)}
    pid_rank = run.pids()
    if not run.finished() and not any(calls.values()) and not any(
            run.writes(n) or os.path.isfile(os.path.join(run.out_dir, n)) for n in names):
        v.unreached("save0", what, "the run stopped before the first checkpoint")
        return
    problems, unsaved, missing = [], [], []
    for name in names:
        exists = os.path.isfile(os.path.join(run.out_dir, name))
        short = [r for r in range(1, ranks) if count[r][name] < count[0][name]]
        writes = run.writes(name)
        if short:
            problems.append(f"only rank 0 called save0 for {name} (rank {short[0]} did not): save0 "
                            "ends with a barrier that every rank must reach, so inside "
                            "if (rank == 0) rank 0 waits for ranks that never come (a hang, or a "
                            "crash once they exit); call it on every rank, it writes on rank 0 only")
            continue
        if not any(count[r][name] for r in range(ranks)):
            if exists or writes:
                unsaved.append(name)
            elif run.finished():
                missing.append(name)
            continue
        others = sorted({pid_rank.get(pid, f"pid {pid}") for pid in writes if pid is not None}
                        - {0}, key=str)
        direct = sum(1 for pid in writes if pid is None)
        by_rank0 = sum(1 for pid in writes if pid is not None and pid_rank.get(pid) == 0)
        if others:
            who = others[0] if isinstance(others[0], str) else f"rank {others[0]}"
            problems.append(f"{who} wrote {name} too ({len(writes)} writes of it for "
                            f"{count[0][name]} save0 call(s)): every rank but 0 must skip the "
                            "write")
        elif direct:
            problems.append(f"{name} was also written directly, not through save0: with "
                            "torch::save every rank writes the same file at once")
        elif by_rank0 != count[0][name] and (run.finished() or by_rank0 > count[0][name]):
            problems.append(f"rank 0 called save0 for {name} {count[0][name]} time(s), but the "
                            f"file was written {by_rank0} time(s)")
    if unsaved:
        problems.append(f"{' and '.join(unsaved)} written without save0: with torch::save every "
                        f"one of the {ranks} ranks writes the same file at once")
    if missing:
        problems.append(f"{' and '.join(missing)} missing")
    v.add("save0", not problems, what, "; ".join(problems))


def check_destroy(v, run, ranks):
    what = "the process group is closed at the end"
    after = [(r, k, f) for r in range(ranks) for k, f in split_at_destroy(run, r)[1]
             if k in ("save0", "print0", "all_reduce", "ddp_step", "forward", "coll",
                      "after_destroy")]
    destroyed = [r for r in range(ranks) if any(k == "destroy" for k, _ in run.traces[r])]
    exits = [run.events(r, "exit") for r in range(ranks)]
    if after:
        r, k, f = after[0]
        if k == "after_destroy":  # the kit refused the call: "save0 site=train.cpp:132"
            call, site = f.split()[0], kv(f).get("site", "")
            call = f"{call} ({site})" if site else call
        else:
            call = f"{k}({os.path.basename(f.split()[0]) if f else ''})"
        v.add("destroy", False, what, f"destroy_process_group() ran before {call} on rank {r}: "
              "the process group is closed by then; close it after the last print0/save0, as the "
              "last kit call of the program")
    elif run.finished() and any("group_alive=1" in e[-1] for e in exits if e):
        v.add("destroy", False, what, "the process group was still alive when the program ended")
    elif not run.finished() and not destroyed:
        v.unreached("destroy", what, "the run stopped before the end")
    elif not all(exits) and run.finished():
        v.add("destroy", False, what, f"needs setup() first (TODO {v.todo('setup')})",
              cause="setup")
    else:
        v.add("destroy", True, what)


def final_test_loss(run, rules):
    _, tests = reported(run, 0, rules)
    return tests[-1] if tests else None


def before_evaluations(run, rank):
    """For each evaluation of `rank`: (the buffers' sum it evaluates with, the last training
    forward before it as (params, buffers), the loss of the last step before it)."""
    out, forward, loss = [], None, None
    for kind, fields in run.traces[rank]:
        f = kv(fields)
        if kind == "forward":
            forward = (f.get("params"), f.get("buffers"))
        elif kind == "step":
            loss = f.get("loss")
        elif kind == "evaluate":
            out.append((f.get("buffers"), forward, loss))
    return out


def close_sums(a, b, rel=1e-9):
    try:
        return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=1e-12)
    except (TypeError, ValueError):
        return a == b


def check_eval_model(v, run, ranks, reference=None):
    """Every evaluation's first forward records the sum of the model's buffers (batch norm's
    running statistics, kit/check/model_trace.h): ranks that evaluate the same model agree on it. And
    the state is compared with the solution's run, not only across ranks: where the last training
    forward before an evaluation had the solution's weights and statistics and its step the same
    loss, the statistics evaluated with must be the solution's too (combined across the ranks the
    same way: a SUM, or rank 0's copy, agrees across ranks and is still wrong)."""
    what = "every rank evaluates, and rank 0 saves, the same batch-norm statistics"
    sums = [[kv(f).get("buffers") for f in run.events(r, "evaluate")] for r in range(ranks)]
    n = min(len(s) for s in sums)
    if n == 0:
        if run.finished():
            v.add("bn_stats", False, what, "no evaluation was traced")
        else:
            v.unreached("bn_stats", what, "the run stopped before the first evaluation")
        return
    for k in range(n):
        if len({sums[r][k] for r in range(ranks)}) > 1:
            other = next(r for r in range(1, ranks) if sums[r][k] != sums[0][k])
            v.add("bn_stats", False, what, f"at evaluation {k + 1} rank 0 and rank {other} hold "
                  "different running statistics: each rank updated its own from its own "
                  "batches (buffers are not averaged with the gradients; ddp.forward copies "
                  "rank 0's before each training forward, but every rank then adds its own "
                  "batch), so each evaluates "
                  "another model and rank 0 saves only its own; average them over the ranks "
                  "before evaluating")
            return
    if reference is None or reference.ranks != ranks:
        v.add("bn_stats", True, what)
        return
    mine = [before_evaluations(run, r) for r in range(ranks)]
    theirs = [before_evaluations(reference, r) for r in range(ranks)]
    for k in range(min(len(x) for x in mine + theirs)):
        # Every rank's last training forward (weights, statistics) and step loss before this
        # evaluation must be the solution's: otherwise the training already differs, and what
        # follows is not this TODO's to judge.
        if any(m[k][1] is None or t[k][1] is None or m[k][2] != t[k][2] or not all(
                close_sums(a, b) for a, b in zip(m[k][1], t[k][1]))
               for m, t in zip(mine, theirs)):
            break
        got, want = mine[0][k][0], theirs[0][k][0]
        if not close_sums(got, want, 1e-6):
            ratio = float(got) / float(want) if float(want or 0) else float("nan")
            why = (f"at evaluation {k + 1} every rank holds the same running statistics, but not "
                   f"the solution's (their sum {float(got):.6g}, the solution's "
                   f"{float(want):.6g}), although training ended with the solution's weights and "
                   "statistics: they were combined across the ranks another way than averaged")
            if math.isclose(ratio, ranks, rel_tol=0.05):
                why += f" ({ratio:.3g} x the solution's: summed, not averaged; ReduceOp::AVG)"
            v.add("bn_stats", False, what, why)
            return
    v.add("bn_stats", True, what)


def check_no_sync(v, run, ranks, accum):
    """Judged by the gradient all-reduces DDP made (its ddp_step events) against the optimizer
    steps (kit::Metrics' step events) and the micro-batches (the model's training forwards)."""
    what = f"one gradient all-reduce per step, after the last of its {accum} micro-batches (no_sync)"
    if not any(run.events(r, "ddp") for r in range(ranks)):
        v.add("no_sync", False, what, f"needs DistributedDataParallel (TODO {v.todo('ddp')})",
              cause="ddp")
        return
    steps = len(run.events(0, "step"))
    reduced = len(run.events(0, "ddp_step"))
    forwards = len(run.events(0, "forward"))
    if steps == 0 and not run.finished():
        v.unreached("no_sync", what, "the run stopped before the first training step")
    elif steps == 0:
        v.add("no_sync", False, what, "no training step was traced")
    elif reduced == steps:
        v.add("no_sync", True, what)
    elif reduced == 0 and run.events(0, "ddp_no_sync"):
        v.add("no_sync", False, what, "no backward averaged the gradients: the last "
              "micro-batch's backward ran inside no_sync() too, so every rank stepped with its own "
              "gradients and the replicas drift apart; end the guard before the last backward")
    elif reduced == 0:
        v.add("no_sync", False, what, "no backward averaged the gradients, and none ran inside "
              f"no_sync(): the DistributedDataParallel object of TODO {v.todo('ddp')} did not "
              "live through the training (a temporary?)")
    elif reduced >= forwards and run.events(0, "ddp_no_sync"):
        v.add("no_sync", False, what, f"every micro-batch's backward all-reduced the gradients "
              f"({reduced} all-reduces for {steps} steps) although no_sync() was used: the guard "
              "is read by the forward, as in PyTorch (a forward outside it prepares an averaged "
              "backward): put each of the first micro-batches' forward AND backward inside it")
    elif reduced >= forwards:
        v.add("no_sync", False, what, f"every micro-batch's backward all-reduced the gradients "
              f"({reduced} all-reduces for {steps} steps): run all but the last one inside "
              "ddp.no_sync(), and the last averages their sum at once")
    else:
        v.add("no_sync", False, what, f"{reduced} gradient all-reduces for {steps} steps of "
              f"{accum} micro-batches: exactly one per step, at its last micro-batch")


def first_update(run, rank, accum):
    """(the weights' sum at the first training forward, the change the first optimizer step made
    to it) on one rank; None when not traced. With `accum` micro-batches per step, forward
    accum + 1 is the first after an update."""
    sums = {kv(f).get("step"): float(kv(f).get("params", "nan")) for f in run.events(rank, "forward")}
    first, after = sums.get("1"), sums.get(str(accum + 1))
    return None if first is None or after is None else (first, after - first)


def check_lr_scaling(v, run, reference, accum, rule_text):
    """The first update compared with the solution's, when both start from the same weights and
    the same batch: with SGD's first step (momentum starts at the gradient) the change of the
    weights is the learning rate times the gradient, so the ratio of the two changes is the ratio
    of the two learning rates."""
    what = f"the learning rate follows {rule_text}"
    mine, theirs = first_update(run, 0, accum), first_update(reference, 0, accum)
    batches = lambda r: [f for f in r.events(0, "batch") if f.startswith("train ")][:accum]  # noqa
    if mine is None and not run.finished():
        v.unreached("lr", what, "the run stopped before the first optimizer step")
        return
    if mine is None or theirs is None:
        v.add("lr", False, what, "no optimizer step was traced")
        return
    if not math.isclose(mine[0], theirs[0], rel_tol=1e-12) or batches(run) != batches(reference):
        v.add("lr", False, what, "not judged: the first step starts from other weights or "
              f"another batch than the solution's (TODOs {v.todo('setup')}-{v.todo('loader-train')})",
              cause="setup")
        return
    others = [first_update(run, r, accum) for r in range(1, run.ranks)]
    if any(o is None or o[1] != mine[1] for o in others):
        v.add("lr", False, what, "not judged: the ranks made different first updates, so the "
              f"gradients were not averaged (TODOs {v.todo('ddp')} and {v.todo('no_sync')})",
              cause="ddp")
        return
    ratio = mine[1] / theirs[1] if theirs[1] else float("nan")
    if math.isclose(ratio, 1.0, rel_tol=1e-3):
        v.add("lr", True, what)
        return
    why = f"the first update is {ratio:.3g} x the solution's, so the learning rate is too"
    if math.isclose(ratio, 0.5, rel_tol=0.02):
        why += ": it was not scaled for the global batch (batch x world size)"
    elif math.isclose(ratio, 2.0, rel_tol=0.02):
        why += ": it was scaled twice"
    v.add("lr", False, what, why)


def with_flags(v, check, judgments):
    """Judges each run of the rules' FLAG_RUNS (check.flag_runs) as the main run was judged, by
    `judgments(scratch verdicts, run, the solution's run, name)`; a concept that passed on the
    main run but fails there gets that ✘ in its place, naming the flags. A TODO that hard-codes
    the value of RUN_FLAGS (2 micro-batches, the linear rule) passes the one and not the other."""
    for name, (mine, theirs) in check.flag_runs.items():
        flags = " ".join(check.rules.FLAG_RUNS[name])
        scratch = type(v)(v.labels)
        if not mine.finished():
            stop = mine.failure()
            scratch.add(getattr(check.rules, "FLAG_RUNS_TODO", {}).get(name, "all"), False,
                        "the run with other flags gets to its end", stop)
        else:
            judgments(scratch, mine, theirs, name)
        for i, (todo, ok, what, why) in enumerate(scratch.rows):
            if ok is not False:
                continue
            here = [k for k, row in enumerate(v.rows) if row[0] == todo]
            if any(v.rows[k][1] is False for k in here):
                continue  # the main run already fails it: one reason is enough
            row = (todo, False, what, f"with {flags}: {why}")
            if here:
                v.rows[here[0]] = row
            else:
                v.rows.append(row)
            if i in scratch.causes:
                v.causes[here[0] if here else len(v.rows) - 1] = scratch.causes[i]
