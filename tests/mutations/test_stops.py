#!/usr/bin/env python3
"""The check's engine without a build: how a stopped run is told (common/tools/checklib/stops.py)
and how the verdicts are shown (checklib/verdicts.py), on runs made up here.

  * a rank killed by a signal is named a crash, with the signal and what it usually means,
    never as the last line the program printed;
  * the kit's error names its call site; a line of the student's own writing in a TODO's place
    is placed in that TODO through the annotated source (not "a line outside the TODOs");
  * a site in a kit file the rules map to a TODO (ddp.cpp: DDP's) names that TODO;
  * a call the kit refused after destroy_process_group() is not blamed on the refused line;
  * generated data (a corpus) is made again when the command that makes it changed, not reused
    from a --reference-dir kept across versions of the rules;
  * a run that needs a library preloaded fails with one line naming it when the library is
    missing (no process started) or when the loader ignores it (the real loader's warning, for a
    file that is no shared object), never passes as if the library had been there (issue 40);
  * rows print in TODO order, each TODO once in the summary, "not reached" apart; the TODO to
    fix first is the earliest that failed on its own evidence, not one whose ✘ follows from it;
  * exercise 05's activations held at once (the trace's live bytes): a rank that holds more than
    the solution's run of the same flags, beyond the tolerance, fails TODO 8 naming the rank and
    both figures; as many bytes, or a trace without them, leaves the verdict alone;
  * exercise 05's ranks that each timed out in a cycle of waits: the TODO of the rank furthest
    behind, which waits for what a rank ahead of it passed by.

usage: test_stops.py    (exit 1 on the first failure, with what was expected)
"""
import io
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "common", "tools"))

from checklib import stops  # noqa: E402
from checklib.verdicts import Verdicts  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
from verdict import expect, finish  # noqa: E402

EX = "00-collectives"


class FakeRun:
    """What stops.explain reads of a Run: exit code, launcher output, rank logs and traces."""

    def __init__(self, code, ranks=2, stderr="", logs=None, traces=None):
        self.code, self.ranks, self.stderr, self.stdout = code, ranks, stderr, ""
        self.logs = logs or {}
        self.traces = traces or {r: [] for r in range(ranks)}

    def events(self, rank, kind):
        return [f for k, f in self.traces.get(rank, []) if k == kind]

    def failure(self):
        return None if self.code == 0 else f"exit code {self.code}"


def student_file(edit=None):
    """The solution of exercise 00 as a student's file, with one line replaced."""
    text = open(os.path.join(ROOT, "solutions", EX, "collectives.cpp")).read()
    if edit:
        assert text.count(edit[0]) == 1, edit[0]
        text = text.replace(*edit)
    # Named as the kit's CallSite names it, by its base name; a folder of its own per run.
    path = os.path.join(tempfile.mkdtemp(prefix="kit-test-stops-"), "collectives.cpp")
    with open(path, "w") as f:
        f.write(text)
    return path, text


def line_of(text, piece):
    return next(n for n, l in enumerate(text.splitlines(), 1) if piece in l)


def test_crash():
    run = FakeRun(139, stderr="ddprun: rank 1 (pid 4242) died: killed by signal 11 (SIGSEGV); "
                  "stopping the other 1 rank\n",
                  logs={0: "rank 0: all_reduce SUM 3 6 9\n", 1: "[1/2] train loss 2.5\n"})
    stop = stops.explain(run, None, EX, {}, Verdicts())
    expect("crashed with SIGSEGV" in stop.how and "segmentation fault" in stop.how and
           stop.rank == 1 and "train loss" not in stop.how,
           f"a rank killed by SIGSEGV is named a crash with its signal ({stop.how})")
    alone = FakeRun(-6, ranks=1, logs={0: "something\n"})
    stop = stops.explain(alone, None, EX, {}, Verdicts())
    expect("SIGABRT" in stop.how, f"a process alone killed by SIGABRT says so ({stop.how})")


def test_site_in_todo():
    # The student's own broadcast line: not the solution's text, but in TODO 4's place.
    path, text = student_file(("kit::broadcast(shared, /*root=*/0);",
                               "if (rank == 0) kit::broadcast(shared, 2);"))
    n = line_of(text, "kit::broadcast(shared, 2)")
    run = FakeRun(1, logs={0: f"rank 0: error: rank 0: broadcast #1 (collectives.cpp:{n}) failed: "
                           "ProcessGroupGloo::broadcast: invalid root rank: 2\n"})
    stop = stops.explain(run, path, EX, {}, Verdicts())
    expect(stop.todo == "4" and f"line {n}" in stop.where,
           f"a rewritten line of TODO 4 is placed in TODO 4 ({stop.todo}, {stop.where})")
    outside = line_of(text, "show(rank, \"mine\", mine);")
    run = FakeRun(1, logs={0: f"rank 0: error: all_reduce #1 (collectives.cpp:{outside}) failed\n"})
    stop = stops.explain(run, path, EX, {}, Verdicts())
    expect(stop.todo is None and "outside the TODOs" in stop.where,
           f"a line outside every TODO is said to be outside ({stop.where})")


def test_kit_file_and_destroy():
    v = Verdicts({"ddp": "8", "destroy": "13"})
    run = FakeRun(1, logs={1: "rank 1: error: all_reduce #40 (ddp.cpp:312) timed out after 30 s\n"})
    stop = stops.explain(run, None, "01-transformer-lm-ddp", {"ddp.cpp": "ddp"}, v)
    expect(stop.todo == "8", f"a site in ddp.cpp names DDP's TODO ({stop.todo}, {stop.where})")
    late = FakeRun(1, logs={0: "rank 0: error: rank 0: save0 (train.cpp:144) after "
                            "destroy_process_group(): the process group is closed\n"},
                   traces={0: [("after_destroy", "save0 site=train.cpp:144")], 1: []})
    stop = stops.explain(late, None, "01-transformer-lm-ddp", {}, v)
    expect(stop.todo is None and "TODO 13" in stop.where,
           f"a call after destroy_process_group() points at the destroy TODO ({stop.where})")


def test_library_error_at_caller():
    # A kit error that names its own line and then the trainer's that called it (Checkpoints::
    # save_sharded appends its CallSite): placed at the trainer's line, in its TODO, not in the kit.
    ex = "03-transformer-lm-zero"
    text = open(os.path.join(ROOT, "solutions", ex, "train.cpp")).read()
    path = os.path.join(tempfile.mkdtemp(prefix="kit-test-stops-"), "train.cpp")
    with open(path, "w") as f:
        f.write(text)
    n = line_of(text, "checkpoints.save_sharded(save_shard, s);")
    run = FakeRun(1, logs={1: f"rank 1: error: barrier #3 (zero_checkpoint.cpp:48) timed out after "
                           f"30 s (train.cpp:{n})\n"})
    stop = stops.explain(run, path, ex, {}, Verdicts())
    expect(stop.todo == "5" and f"line {n} of train.cpp" in stop.where,
           f"a library error is placed at its caller's line, TODO 5 ({stop.todo}, {stop.where})")
    # The rank whose collective failed because the other left is not the one to explain.
    run = FakeRun(1, logs={0: "rank 0: error: rank 0: barrier #86 (checkpoint.cpp:369) failed: "
                           "another rank left the job (it died, or it finished without calling "
                           f"this collective) (train.cpp:{n})\n",
                           1: f"rank 1: error: checkpoint step-6: the ZeRO save wrote no shard of "
                           f"rank(s) 0, 1 (train.cpp:{n})\n"})
    stop = stops.explain(run, path, ex, {}, Verdicts())
    expect(stop.rank == 1 and "wrote no shard" in stop.how,
           f"the rank that left is explained, not the one it left waiting ({stop.how})")
    # A hang: rank 1 timed out in the kit's collective, rank 0 waits in the save's barrier,
    # which its trace names at the trainer's line (a save inside `if (rank == 0)`).
    run = FakeRun(1, logs={1: "rank 1: error: rank 1: reduce_scatter #41 (zero.cpp:187) timed "
                           "out after 30 s: the other ranks never joined it\n"},
                  traces={0: [("coll", f"kind=barrier site=train.cpp:{n}")],
                          1: [("coll", "kind=reduce_scatter site=zero.cpp:187")]})
    stop = stops.explain(run, path, ex, {}, Verdicts())
    expect(stop.todo == "5" and "rank 0 waits in a collective of your line" in stop.how,
           f"a hang is placed where the ranks parted, the line only one rank reached "
           f"({stop.todo}, {stop.how})")


def test_archive():
    # A file in the layout torch::serialize::OutputArchive writes (a zip; data.pkl rebuilds each
    # tensor from a storage by persistent id; the storage's bytes in data/<key>), made here
    # without torch: checklib/archive.py must read back every key's values and shape.
    import array
    import pickle
    import types
    import zipfile
    from checklib import archive

    fake = types.ModuleType("torch"), types.ModuleType("torch._utils")
    saved = {m.__name__: sys.modules.get(m.__name__) for m in fake}

    def rebuild(*args):
        raise AssertionError("never called: only pickled")
    rebuild.__module__, rebuild.__qualname__ = "torch._utils", "_rebuild_tensor_v2"
    fake[1]._rebuild_tensor_v2 = rebuild
    storages = {"Float": type("FloatStorage", (), {"__module__": "torch"}),
                "Long": type("LongStorage", (), {"__module__": "torch"})}
    for k, c in storages.items():
        setattr(fake[0], c.__name__, c)
    Module = type("Module", (), {"__module__": "torch", "__reduce__":
                                 lambda self: (Module, (), self.__dict__)})
    fake[0].Module = Module

    class Storage:
        def __init__(self, tensor):
            self.tensor = tensor

    class T:
        def __init__(self, key, kind, values, shape):
            self.key, self.kind, self.values, self.shape = key, kind, values, shape

        def __reduce__(self):
            return rebuild, (Storage(self), 0, self.shape, (1,) * len(self.shape), False, {})

    class Writer(pickle.Pickler):
        def persistent_id(self, obj):
            if isinstance(obj, Storage):
                t = obj.tensor
                return ("storage", storages[t.kind], t.key, "cpu", len(t.values))
            return None
    tensors = {"0": T("0", "Float", [0.5, -1.25, 3.0, 4.0], (2, 2)), "1": T("1", "Long", [7], (1,))}
    root = Module()
    root.__dict__.update(tensors)
    try:
        sys.modules.update({m.__name__: m for m in fake})
        out = io.BytesIO()
        Writer(out, protocol=2).dump(root)
    finally:
        for name, m in saved.items():
            if m is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = m
    path = os.path.join(tempfile.mkdtemp(prefix="kit-test-archive-"), "shard-0-of-1.pt")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", out.getvalue())
        z.writestr("archive/data/0", array.array("f", tensors["0"].values).tobytes())
        z.writestr("archive/data/1", array.array("q", tensors["1"].values).tobytes())
    got = archive.tensors(path)
    expect(sorted(got) == ["0", "1"] and list(got["0"].values) == [0.5, -1.25, 3.0, 4.0] and
           got["0"].shape == (2, 2) and list(got["1"].values) == [7],
           f"a LibTorch archive's tensors are read without torch ({ {k: list(v.values) for k, v in got.items()} })")
    try:
        archive.tensors(os.path.join(os.path.dirname(path), "none.pt"))
        expect(False, "a missing archive raises")
    except (OSError, ValueError):
        expect(True, "a missing archive raises OSError or ValueError")


def test_presentation():
    v = Verdicts({"ddp": "7", "no_sync": "15", "lr": "14"})
    v.add("lr", False, "the learning rate", "not judged: the ranks differ", cause="ddp")
    v.add("ddp", False, "the copies stay identical", "inside no_sync()", cause="no_sync")
    v.add("no_sync", False, "one all-reduce per step", "none averaged")
    v.add("1", True, "included")
    v.add("ddp", True, "the forward goes through the wrapper")
    v.unreached("9", "a new shuffle", "the run stopped before epoch 2")
    v.add("all", False, "the run", "differs")
    out = io.StringIO()
    v.print(out)
    todos = [l.split()[2] for l in out.getvalue().splitlines()]
    expect(todos == ["1", "7", "7", "9", "14", "15", "all"], f"rows in TODO order ({todos})")
    expect(v.failed() == ["7", "14", "15", "all"] and v.passed() == ["1"] and
           v.not_reached() == ["9"],
           f"each TODO once: failed {v.failed()}, passed {v.passed()}, not reached "
           f"{v.not_reached()}")
    expect(v.first_to_fix() == "15", f"fix first: the TODO whose own evidence failed "
           f"({v.first_to_fix()}), not 7 or 14 whose ✘ follows from it")
    expect("not reached" in out.getvalue() and "\u2718 TODO 9" not in out.getvalue(),
           "a TODO the run did not reach is neither ✔ nor ✘")


def test_generated_data():
    from checklib import engine
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "corpus")
        make = lambda n: ["sh", "-c", f'mkdir -p "$0" && echo {n} >> "$0/made"', data]  # noqa: E731
        engine.generated_data(data, make(1), "made")
        engine.generated_data(data, make(1), "made")
        runs = open(os.path.join(data, "made")).read().split()
        expect(runs == ["1"], f"the same command twice makes the data once (made: {runs})")
        engine.generated_data(data, make(2), "made")
        runs = open(os.path.join(data, "made")).read().split()
        expect(runs == ["1", "2"], f"another command makes it again (made: {runs})")


def test_preload():
    from checklib import runs
    with tempfile.TemporaryDirectory() as tmp:
        prog = os.path.join(tmp, "prog")
        with open(prog, "w") as f:
            f.write("#!/bin/sh\necho trained\n")
        os.chmod(prog, 0o755)
        missing = os.path.join(tmp, "lib", "libkit_test_hooks.so")
        run = runs.Run(os.path.join(tmp, "missing"), 1).launch(prog, "alone", None, "", [],
                                                                {"LD_PRELOAD": missing})
        why = run.failure() or ""
        expect(run.code != 0 and missing in why and "not built" in why and "\n" not in why,
               f"a preload that is not built fails the run in one line naming it ({why})")
        expect(stops.explain(run, None, EX, {}, Verdicts()).how == why,
               "and the stop is told in those words, placed in no TODO")
        not_a_library = os.path.join(tmp, "hooks.so")
        with open(not_a_library, "w") as f:
            f.write("not a shared object\n")
        run = runs.Run(os.path.join(tmp, "ignored"), 1).launch(prog, "alone", None, "", [],
                                                                {"LD_PRELOAD": not_a_library})
        why = run.failure() or ""
        expect(run.code != 0 and not_a_library in why and "without it" in why,
               f"the loader's 'cannot be preloaded ... ignored' fails the run, naming the file ({why})")


def pp_trace(peaks):
    """Two training steps of a 2-rank pp run: 1F1B at m 2 on each rank, whose live bytes (above
    1000 at each step's start) rise by 100 a forward and reach peaks[rank] in the second step."""
    traces = {}
    for r, peak in enumerate(peaks):
        events = []
        for step in (1, 2):
            top = 200 if step == 1 else peak
            for kind, mb, live0, live in (("F", 0, 0, 100), ("F", 1, 100, top), ("B", 0, top, 100),
                                          ("B", 1, 100, 0)):
                events.append(("pp", f"kind={kind} stage={r} mb={mb} t0=0 t1=1 live0={1000 + live0} "
                                     f"live={1000 + live}"))
            events.append(("step", f"epoch=1 step={step} loss=1.0"))
        traces[r] = events
    return traces


def test_activations():
    from rules import ex05
    ref = FakeRun(0, traces=pp_trace([200 * 1024, 200 * 1024]))
    for peaks, fails in (([200 * 1024, 200 * 1024], False), ([200 * 1024, 400 * 1024], True),
                         ([230 * 1024, 200 * 1024], False)):
        e = ex05.Evidence("pp2")
        e.ok("order")
        ex05.judge_activations(e, FakeRun(0, traces=pp_trace(peaks)), ref, ex05.layout_of("pp2"))
        state, text = e.state["order"]
        expect((state == "fail") == fails and (not fails or ("rank 1 held 400 KiB" in text and
                                                              "holds 200 KiB" in text)),
               f"activations peaking at {[p // 1024 for p in peaks]} KiB against the solution's 200: "
               f"TODO 8 {'fails naming rank 1 and both figures' if fails else 'stands'} ({text})")
    bare = {r: [(k, " ".join(x for x in f.split() if not x.startswith("live")))
                for k, f in events] for r, events in pp_trace([400 * 1024] * 2).items()}
    e = ex05.Evidence("pp2")
    e.ok("order")
    ex05.judge_activations(e, FakeRun(0, traces=bare), ref, ex05.layout_of("pp2"))
    expect(e.state["order"][0] == "ok", "a trace without live bytes leaves TODO 8's verdict alone")


def test_waits_in_vain():
    """Exercise 05's stop in a cycle of waits (a CI run of 2026-11-29): the last stage never sent
    its input's gradient back (TODO 5) and went on to the loss's broadcast (TODO 4's line). Rank 0
    waits in TODO 5's receive, the last stage in the broadcast, and on a loaded machine both can
    time out before either hears of the other. The TODO is the receive's, of the rank furthest
    behind (2 actions done against 4), whichever rank's line is listed first or is the earlier
    TODO; ranks equally far name the earlier TODO."""
    from types import SimpleNamespace
    from rules import ex05
    source = os.path.join(ROOT, "solutions", "05-transformer-lm-pp", "train.cpp")
    text = open(source).read()
    recv, bcast = line_of(text, "kit::recv(grad,"), line_of(text, "kit::broadcast(sum,")
    check = SimpleNamespace(source=source, args=SimpleNamespace(exercise="05-transformer-lm-pp"),
                            verdicts=Verdicts(ex05.LABELS))
    timed_out = {0: f"recv #1 from rank 1 (train.cpp:{recv}) timed out after 12 s: rank 1 never "
                    "posted the matching send",
                 1: f"broadcast #1 (train.cpp:{bcast}) timed out after 12 s: the other ranks "
                    "never joined it"}

    def run(actions, by_log):
        traces = {r: [("pp", f"kind={'F' if i < 2 else 'B'} stage={r} mb={i % 2} t0=0 t1=1")
                      for i in range(n)] for r, n in enumerate(actions)}
        logs = {r: f"rank {r}: error: rank {r} in group 0,1: {line}\n" for r, line in timed_out.items()}
        return FakeRun(1, stderr="".join(logs[r] for r in (1, 0)), logs=logs if by_log else {},
                       traces=traces)

    for actions, todo in (([2, 4], ex05.LABELS["backward"]), ([2, 2], ex05.LABELS["loss"]),
                          ([4, 2], ex05.LABELS["loss"])):
        for by_log in (True, False):  # the rank logs, or only the launcher's lines
            named, why = ex05.Judge(check).explain(run(actions, by_log))
            expect(named == todo, f"ranks timed out in TODO 5's receive and TODO 4's broadcast "
                   f"after {actions} actions ({'rank logs' if by_log else 'launcher only'}): "
                   f"TODO {todo} is named (named: {named}; {why[:50]}...)")


def main():
    test_waits_in_vain()
    test_activations()
    test_crash()
    test_generated_data()
    test_preload()
    test_site_in_todo()
    test_kit_file_and_destroy()
    test_library_error_at_caller()
    test_archive()
    test_presentation()
    return finish()


if __name__ == "__main__":
    sys.exit(main())
