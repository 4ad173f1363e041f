"""The flow of one check: prepare the exercise's data, run the student's build alone, on N ranks
of one node and with one rank per node, run the solution the same way (once, shared between
checks with --reference-dir), let the exercise's rules judge, print the verdicts.

An exercise of one process on one device (its rules say SINGLE_PROCESS = True: exercise 06) has
no ranks to compare: its build and the solution run alone, with RUN_FLAGS and with each of
FLAG_RUNS' flags (and FLAG_ENV's environment), all at once (single_process()); check.many is the
RUN_FLAGS run, check.ranks 1."""
from concurrent.futures import ThreadPoolExecutor
import argparse
import importlib
import json
import os
import subprocess
import shutil
import sys
import tempfile
import kit_toml  # tomllib where the Python has it (3.11+), a fallback on 3.9-3.10

from . import allocation, collectives, runs, stops
from .build_errors import explain_build, not_judged_note, stages_json
from .runs import Locked, Run, read
from .verdicts import CROSS, Verdicts, record

TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(os.path.dirname(TOOLS))


def load_rules(exercise):
    """common/tools/rules/<target>.py for exercises/<exercise>/info.toml's target ("ex01"), the
    programs its check needs besides ddprun (info.toml's [check] tools) and the libraries its
    runs preload ([check] preload: lib/lib<name>.so of the build)."""
    info_path = os.path.join(ROOT, "exercises", exercise, "info.toml")
    with open(info_path, "rb") as f:
        info = kit_toml.load(f)
    need = info.get("check", {})
    return (importlib.import_module(f"rules.{info['target']}"), need.get("tools", []),
            need.get("preload", []))


class Check:
    """What the rules see: the runs, the tools, the source, and where to put verdicts."""

    def __init__(self, rules, args, workdir):
        self.rules, self.args, self.workdir = rules, args, workdir
        self.ranks = args.ranks
        self.source = args.source
        self.verdicts = Verdicts(getattr(rules, "LABELS", {}))
        self.alone = self.many = self.nodes = self.reference = self.data = None
        self.flag_runs = {}  # name -> (the student's run, the solution's run) with FLAG_RUNS' flags

    def tool(self, name):
        """A program of the build (ddprun, make_corpus, ...): --<name> or --bin-dir/<name>."""
        given = getattr(self.args, name.replace("-", "_"), None)
        path = given or os.path.join(self.args.bin_dir or "", name)
        return os.path.abspath(path)

    def library(self, name):
        """A library of the build that a run preloads (kit_test_hooks): lib/lib<name>.so beside
        the programs' bin/."""
        return os.path.abspath(os.path.join(os.path.dirname(self.tool("ddprun")), "..", "lib",
                                            f"lib{name}.so"))

    def launch(self, binary, name, ranks, layout, data, flags, env=None):
        return Run(os.path.join(self.workdir, name), ranks).launch(
            binary, layout, data, self.tool("ddprun"), flags,
            dict(getattr(self.rules, "RUN_ENV", None) or {}, **(env or {})))


def generated_data(directory, command, marker):
    """The data a rules file generates (a corpus, an image set) in `directory`, made by
    `command` (a list) unless a previous check made it with the very same command: a cached
    folder made with other flags (a --reference-dir kept across versions of the rules) would
    judge the run on another data set than the rules assume. `marker`: a file the command writes
    last."""
    stamp = os.path.join(directory, ".made-by.json")
    key = json.dumps(command[1:])
    if read(stamp) != key or not os.path.isfile(os.path.join(directory, marker)):
        subprocess.run(command, check=True, capture_output=True)
        with open(stamp, "w") as f:
            f.write(key)
    return directory


def reference_run(check, directory, data, name="", flags=None, env=None, ranks=None):
    """The solution's run (with the rules' RUN_FLAGS, or with `flags` as the run called `name`),
    on check.ranks ranks unless `ranks` says otherwise. With --reference-dir it is made once and
    reused while the solution binary and the flags stay the same (a lock keeps parallel checks
    from racing)."""
    rules, solution = check.rules, check.args.solution
    ranks = ranks or check.ranks
    flags = rules.RUN_FLAGS if flags is None else flags
    st = os.stat(solution)
    made_by = read(os.path.join(data, ".made-by.json")) if data else None  # generated_data()
    run_env = dict(getattr(rules, "RUN_ENV", None) or {}, **(env or {}))  # the rules' too
    key = json.dumps([solution, st.st_mtime_ns, st.st_size, ranks, flags, rules.data_key(), run_env,
                      made_by, runs.PLACEMENT.gpus if runs.PLACEMENT else None])
    stamp = os.path.join(directory, f"key{name}.json")
    run = Run(os.path.join(directory, f"solution{ranks}{name}"), ranks)
    if read(stamp) == key and os.path.isfile(os.path.join(run.dir, "result.json")):
        return run.load()
    if os.path.exists(stamp):  # the run it vouched for is about to be replaced
        os.remove(stamp)
    run.launch(solution, "alone" if single(rules) else "node", data, check.tool("ddprun"), flags,
               run_env)
    if run.code == 0:
        with open(stamp, "w") as f:
            f.write(key)
    return run


def single(rules):
    """Whether the exercise is one process on one device (rules.SINGLE_PROCESS)."""
    return bool(getattr(rules, "SINGLE_PROCESS", False))


def single_process(check, data):
    """The runs of a one-process exercise: the student's build with RUN_FLAGS and with each of
    FLAG_RUNS' flags, and the solution's same runs (kept in --reference-dir), all at once: each is
    mostly the start of a process. check.many is the RUN_FLAGS run; check.alone the same run."""
    rules, a = check.rules, check.args
    base = a.reference_dir or check.workdir
    flag_runs = getattr(rules, "FLAG_RUNS", {})
    # name -> the environment of that run, from the rules' FLAG_ENV (name -> function(check)).
    envs = {name: make(check) for name, make in getattr(rules, "FLAG_ENV", {}).items()}

    def references():
        if check.reference is None:  # made under the lock already with --reference-dir
            check.reference = reference_run(check, base, data)
        return {name: reference_run(check, base, data, name, flags, envs.get(name))
                for name, flags in flag_runs.items()}

    with ThreadPoolExecutor(len(flag_runs) + 2) as pool:
        mine = {name: pool.submit(check.launch, a.binary, name, 1, "alone", data, flags,
                                  envs.get(name))
                for name, flags in flag_runs.items()}
        main = pool.submit(check.launch, a.binary, "alone", 1, "alone", data, rules.RUN_FLAGS)
        if a.reference_dir:  # one solution run at a time per flag set, shared between checks
            with Locked(a.reference_dir):
                theirs = references()
        else:
            theirs = references()
        check.many = check.alone = main.result()
        check.flag_runs = {name: (f.result(), theirs[name]) for name, f in mine.items()}


def program_solution(exercise):
    """The solution's source of the exercise's program (its first C++ file), whose lines the
    solution's run trace names."""
    info = stages_json("info", exercise)
    f = next((f for f in info.get("files", []) if f.get("lang", "cpp") == "cpp"), None)
    return os.path.join(ROOT, f["solution"]) if f else None


DEVICE_ENV = {"KIT_DEVICE_CHECK": "nccl"}
DEVICE_WHAT = ("every collective is given tensors on the rank's device (NCCL's rule, checked on "
               "this CPU with KIT_DEVICE_CHECK=nccl)")


def device_check(check, data, explain):
    """A tensor made on the host works with Gloo and stops the first GPU run: the student's build
    runs once more on the kit's fake device (KIT_DEVICE_CHECK=nccl, common/kit/runtime/device_check.h),
    where every collective refuses a tensor that is not on the rank's device, naming its call.
    Judged only where the solution's run works there (LibTorch 2.13+, a model whose kernels the
    fake device has: exercise 02's convolutions it has not)."""
    a, v = check.args, check.verdicts
    if runs.PLACEMENT and runs.PLACEMENT.gpus:
        return  # on GPUs with NCCL, NCCL itself refuses a tensor on the wrong device
    directory = a.reference_dir or check.workdir
    if a.reference_dir:
        with Locked(a.reference_dir):
            theirs = reference_run(check, directory, data, "device", check.rules.RUN_FLAGS, DEVICE_ENV)
    else:
        theirs = reference_run(check, directory, data, "device", check.rules.RUN_FLAGS, DEVICE_ENV)
    if not theirs.finished():
        why = (theirs.failure() or "").split(". ")[0]
        v.note("setup", "the device of each collective's tensors: the kit's device check "
               f"(KIT_DEVICE_CHECK=nccl) cannot run the solution here: {why}")
        return
    mine = check.launch(a.binary, f"device{check.ranks}", check.ranks, "node", data,
                        check.rules.RUN_FLAGS, DEVICE_ENV)
    if mine.finished():
        return
    stop = explain(mine)
    v.add(stop.todo or "run", False, DEVICE_WHAT,
          stop.how + (f" ({stop.where})" if stop.where else ""))


def solution_note(exercise):
    """After a full pass: the solution is no longer a spoiler, and comparing styles teaches."""
    return (f"every TODO passes: compare your code with the solution's: "
            f"./kit diff {exercise[:2]} --solution")


def parse_args(argv, doc):
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--exercise", required=True)
    ap.add_argument("--explain-build", metavar="LOG",
                    help="the build of --source failed with this log: explain and exit 1")
    ap.add_argument("--binary")
    ap.add_argument("--solution")
    ap.add_argument("--bin-dir", help="where the build's programs are (ddprun, data tools)")
    ap.add_argument("--ddprun")
    ap.add_argument("--make-corpus")
    ap.add_argument("--source", help="the trainer's source file")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--workdir")
    ap.add_argument("--reference-dir", help="where the solution's run is kept and reused")
    ap.add_argument("--record", metavar="FILE", help="write the result as JSON (for kit list)")
    ap.add_argument("--keep", action="store_true", help="keep the run folders")
    ap.add_argument("--core-runs", action="store_true",
                    help="only the runs that judge each TODO once, where an exercise's rules have "
                         "more (exercise 05: 4 of its 9 schedule x shape runs); the tests of the "
                         "stages and the mistakes table use it")
    a = ap.parse_args(argv)
    if a.explain_build and not a.source:
        ap.error("--explain-build needs --source")
    if not a.explain_build:
        missing = [o for o in ("binary", "solution") if not getattr(a, o)]
        if missing:
            ap.error("missing " + ", ".join("--" + m for m in missing))
    return a


def main(argv, doc):
    a = parse_args(argv, doc)
    if a.explain_build:
        return explain_build(a.exercise, a.explain_build, a.source)
    rules, tools, preload = load_rules(a.exercise)
    workdir = a.workdir or tempfile.mkdtemp(prefix="kit-check-")
    os.makedirs(workdir, exist_ok=True)
    check = Check(rules, a, workdir)
    a.binary, a.solution = os.path.abspath(a.binary), os.path.abspath(a.solution)
    # What the runs need, before any run: a program or a preloaded library that is missing would
    # stop a run, or, preloaded, be ignored by the loader with a warning and change what the run
    # does (a stop that never comes). One line naming it, and no verdicts.
    needed = [(p, os.access(p, os.X_OK)) for p in [a.binary, a.solution] +
              [check.tool(t) for t in ["ddprun"] + tools]]
    needed += [(check.library(lib), os.path.isfile(check.library(lib))) for lib in preload]
    for path, there in needed:
        if not there:
            name = os.path.basename(path)
            target = name[3:-3] if name.startswith("lib") and name.endswith(".so") else name
            print(f"  {CROSS} the check cannot start its runs: {path} is not built (cmake --build "
                  f"{os.path.dirname(os.path.dirname(path)) or '.'} --target {target})")
            return 2
    if single(rules):
        a.ranks = check.ranks = 1  # one process: the rules compare runs with other flags
    elif a.ranks < 2:
        sys.stderr.write("check: --ranks must be at least 2\n")
        return 2
    ranks = a.ranks
    # Inside a Slurm allocation: one GPU per rank with NCCL, or the CPU and one line saying why.
    runs.PLACEMENT = allocation.here(a.binary, ranks)

    print(f"check {a.exercise}: {a.binary}")
    if runs.PLACEMENT.line:
        print(runs.PLACEMENT.line)
    if a.reference_dir:
        with Locked(a.reference_dir):
            data = rules.prepare_data(check, a.reference_dir)
            check.reference = reference_run(check, a.reference_dir, data)
    else:
        data = rules.prepare_data(check, workdir)
    check.data = data  # for rules that launch runs of their own (rules/ex03.py)
    v = check.verdicts
    if single(rules):
        single_process(check, data)
        if check.many.failure():  # the closing row says "did not finish": here is why
            s = stops.explain(check.many, a.source, a.exercise, {}, v)
            print(f"  {CROSS} the program fails with the check's flags: {s.how}"
                  + (f" ({s.where})" if s.where else ""))
        rules.judge(check)
        return finish(check, a, v)
    labels_by_file = getattr(rules, "COLLECTIVE_FILES", {})
    explain = lambda run: stops.explain(run, a.source, a.exercise, labels_by_file, v)  # noqa: E731
    check.alone = check.launch(a.binary, "alone", 1, "alone", data, rules.RUN_FLAGS)
    # Work after destroy_process_group() fails even alone; the judges name its TODO. Any other
    # failure alone is placed in its TODO; the run on several ranks is still judged as far as it
    # got (a root rank that exists on 2 ranks but not alone fails here only).
    alone_stop = None
    if check.alone.failure() and not check.alone.events(0, "after_destroy"):
        alone_stop = explain(check.alone)
        print(f"  {CROSS} the program does not run on its own: {alone_stop.how}"
              + (f" ({alone_stop.where})" if alone_stop.where else ""))
    check.many = check.launch(a.binary, f"ranks{ranks}", ranks, "node", data, rules.RUN_FLAGS)
    many_stop = explain(check.many) if check.many.failure() else None
    if many_stop:
        print(f"  {CROSS} the program fails on {ranks} ranks: {many_stop.how}"
              + (f" ({many_stop.where})" if many_stop.where else ""))
    if check.reference is None:
        check.reference = reference_run(check, workdir, data)
    if check.reference.failure():
        print(f"  {CROSS} the solution itself fails: {check.reference.failure()}")
        return 1
    if alone_stop and not many_stop:
        v.add(alone_stop.todo or "run", False, "the program also runs alone (a world of 1)",
              alone_stop.how + (f" ({alone_stop.where})" if alone_stop.where else ""))
    elif alone_stop and not check.many.events(0, "setup") and not many_stop.todo:
        print(f"  {CROSS} nothing more can be judged: the program stops before setup()")
        return 1
    joined = all(check.many.events(r, "setup") for r in range(ranks))
    if joined and check.many.finished() and getattr(rules, "NODES_FLAGS", None) is not None:
        check.nodes = check.launch(a.binary, f"nodes{ranks}", ranks, "nodes", data,
                                   rules.NODES_FLAGS)
    # The flags a TODO must honour, run with values other than RUN_FLAGS' (rules' FLAG_RUNS): a
    # value hard-coded to the default, or one rule in place of another, shows only there.
    # The student's runs all at once (each mostly the start of its processes, or a wait for a
    # rank that never comes: one timeout for all of them, not one each), the solution's meanwhile.
    if joined and check.many.finished():
        flag_runs = getattr(rules, "FLAG_RUNS", {})
        with ThreadPoolExecutor(max(1, len(flag_runs))) as pool:
            mine = {name: pool.submit(check.launch, a.binary, f"{name}{ranks}", ranks, "node",
                                      data, flags) for name, flags in flag_runs.items()}
            for name, flags in flag_runs.items():
                if a.reference_dir:
                    with Locked(a.reference_dir):
                        theirs = reference_run(check, a.reference_dir, data, name, flags)
                else:
                    theirs = reference_run(check, workdir, data, name, flags)
                check.flag_runs[name] = (mine[name].result(), theirs)
    if joined and check.many.finished():
        device_check(check, data, explain)

    rules.judge(check)
    # A collective that not every rank called: named first, with its TODO and the rule, since
    # everything after it in the run is a consequence.
    parted = collectives.judge(v, check.many, ranks, check.reference, a.source,
                               lambda: stages_json("todos", a.exercise, "--json") or [],
                               labels_by_file, a.exercise)
    if not parted:
        solution_source = program_solution(a.exercise)
        collectives.judge_tensors(
            v, check.many, check.reference, ranks,
            lambda site: stops.place(site, a.source, a.exercise, labels_by_file, v)[0],
            lambda site: stops.place(site, solution_source, a.exercise, labels_by_file, v)[0])
    if parted:
        print(f"  {CROSS} {parted}")
    elif many_stop and many_stop.todo and not any(
            check.many.events(r, "after_destroy") for r in range(ranks)):
        # The run stopped at a line of a TODO: that TODO is where the run breaks, whatever the
        # rows judged from the part before it say. (A kit call after destroy_process_group() is
        # the destroy TODO's mistake wherever the refused call is: the judges name that TODO.)
        v.add(many_stop.todo, False, f"the run on {ranks} ranks gets to its end",
              f"{many_stop.how} ({many_stop.where})", first=True)
    return finish(check, a, v)


def finish(check, a, v):
    """Prints the verdicts, the TODO to fix first and the summary lines; the exit code."""
    v.print()
    note = not_judged_note(a.exercise)
    if note:
        print(note)
    first = v.first_to_fix()
    if first:  # the earliest TODO that failed on its own evidence, not a symptom of it
        print(f"fix first: TODO {first}")
    print(f"passed: {','.join(v.passed()) or '-'}")
    print(f"failed: {','.join(v.failed()) or '-'}")
    if v.not_reached():
        print(f"not reached: {','.join(v.not_reached())}")
    if not v.failed():
        print(solution_note(a.exercise))
    if a.record:
        record(a.record, a.exercise, a.source, v)
    if not a.keep and not a.workdir:
        shutil.rmtree(check.workdir, ignore_errors=True)
    elif a.keep:
        print(f"the runs' folders are kept in {check.workdir} (each run's logs: <run>/log/rankN.log, "
              "its output: <run>/out)")
    return 1 if v.failed() else 0
