#!/usr/bin/env python3
"""Runs the student check (common/tools/check.py, what `./kit check` runs) on one mutant of
tests/mutations/mutants.py and asserts that it names the mutant's TODO.

usage: run_mutant.py EXERCISE ID check -- <check.py arguments>
       run_mutant.py EXERCISE ID compile --build-dir DIR --target TARGET --source FILE --log FILE
                                          [--cmake CMAKE]

`check`: kind "run" must fail, name the mutant's TODO in its one "fix first: TODO n" line (the
earliest TODO that failed on its own evidence, not a symptom of it) and have exactly the expected
TODOs failing; kind "stops" (a run that stops: a hang, a crash, an error) the same with only the
mutant's TODO failing, and exactly the TODOs of `also` "not reached"; kind "equivalent" must pass
everything; kind "diverges" must pass every TODO and
fail the closing row ("all"), which names the mutant's TODO (or "outside the TODOs") and holds
every phrase of its `also`.
`compile`: builds TARGET (which must fail), then asks check.py to explain the build log, as
`./kit check` does; the explanation must show the compiler error and name the TODO.
"""
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CHECK_PY = os.path.join(ROOT, "common", "tools", "check.py")
ROW = re.compile(r"^\s*([\u2714\u2718]) TODO (\S+)\s")
FIRST = re.compile(r"^fix first: TODO (\S+)$", re.M)
NOT_REACHED = re.compile(r"^not reached: (\S+)$", re.M)


def mutant(ex, mid):
    out = subprocess.run([sys.executable, os.path.join(HERE, "mutants.py"), "show", ex, mid],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def rows(stdout):
    return [(m.group(1) == "\u2714", m.group(2)) for m in map(ROW.match, stdout.splitlines()) if m]


def run_check(ex, m, rest):
    binary = rest[rest.index("--binary") + 1] if "--binary" in rest else None
    if binary and not os.path.isfile(binary):
        return [f"{binary} is not built: a mutant of the long table (label mutations_long) is "
                "built only by `cmake --build build --target long_mutants` (KIT_TEST_LONG=1 "
                "./kit test builds and runs them)"]
    p = subprocess.run([sys.executable, CHECK_PY, "--exercise", ex] + rest,
                       capture_output=True, text=True)
    sys.stdout.write(p.stdout + p.stderr)
    got = rows(p.stdout)
    failed = [label for ok, label in got if not ok and label != "all"]
    errors = []
    if "passed: " not in p.stdout:
        errors.append(f"the check did not finish (exit {p.returncode})")
    if m["kind"] == "equivalent":
        if p.returncode != 0 or any(not ok for ok, _ in got):
            errors.append(f"a correct rewrite was judged wrong (exit {p.returncode}, failing: "
                          f"{[l for ok, l in got if not ok]})")
    elif m["kind"] == "diverges":
        closing = next((l for l in p.stdout.splitlines() if ROW.match(l)
                        and ROW.match(l).group(2) == "all"), "")
        place = "outside the TODOs" if m["todo"] == "-" else f"(TODO {m['todo']}"
        if p.returncode == 0 or not closing.lstrip().startswith("\u2718"):
            errors.append(f"the check passed a run that is not the solution's (exit {p.returncode})")
        if failed:
            errors.append(f"TODO(s) {failed} failed; every TODO should pass")
        for phrase in [place] + m["also"]:
            if phrase not in closing:
                errors.append(f"the closing row does not say '{phrase}': {closing.strip()}")
    else:
        stops = m["kind"] == "stops"
        want = {m["todo"]} | (set() if stops else set(m["also"]))
        first = FIRST.search(p.stdout)
        if p.returncode == 0:
            errors.append("the check exited 0 on a mutant")
        if not failed:
            errors.append(f"no TODO failed; TODO {m['todo']} should have")
        elif not first or first.group(1) != m["todo"]:
            errors.append(f"the 'fix first' line names {first.group(0) if first else 'nothing'}, "
                          f"not TODO {m['todo']}")
        if failed and set(failed) != want:
            errors.append(f"failing TODOs {sorted(set(failed))}, expected {sorted(want)}")
        if stops:
            unreached = NOT_REACHED.search(p.stdout)
            got = unreached.group(1).split(",") if unreached else []
            if sorted(got) != sorted(m["also"]):
                errors.append(f"TODOs 'not reached': {got}, expected {m['also']}")
    return errors


def run_compile(ex, m, args):
    opts = dict(zip(args[::2], args[1::2]))
    log = opts["--log"]
    os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
    with open(log, "w") as f:
        b = subprocess.run([opts.get("--cmake", "cmake"), "--build", opts["--build-dir"],
                            "--target", opts["--target"]],
                           stdout=f, stderr=subprocess.STDOUT)
    if b.returncode == 0:
        return [f"the mutant {opts['--target']} compiled; it should not"]
    p = subprocess.run([sys.executable, CHECK_PY, "--exercise", ex, "--explain-build", log,
                        "--source", opts["--source"]], capture_output=True, text=True)
    sys.stdout.write(p.stdout + p.stderr)
    errors = []
    if p.returncode == 0:
        errors.append("check.py --explain-build exited 0")
    if not re.search(r"error", p.stdout):
        errors.append("the compiler's error is not shown")
    named = [label for ok, label in rows(p.stdout) if not ok]
    if named != [m["todo"]]:
        errors.append(f"the report names TODO(s) {named}, expected [{m['todo']}]")
    if f"failed: {m['todo']}" not in p.stdout.splitlines():
        errors.append(f"no 'failed: {m['todo']}' line")
    return errors


def main(argv):
    if len(argv) < 3 or argv[2] not in ("check", "compile"):
        sys.stderr.write("run_mutant.py: usage: run_mutant.py EXERCISE ID check|compile ... "
                         "(see the top of tests/mutations/run_mutant.py)\n")
        return 2
    ex, mid, mode, rest = argv[0], argv[1], argv[2], argv[3:]
    m = mutant(ex, mid)
    print(f"mutant {mid} ({m['kind']}): {m['what']} -> TODO {m['todo']}")
    if mode == "check":
        errors = run_check(ex, m, rest[1:] if rest[:1] == ["--"] else rest)
    else:
        errors = run_compile(ex, m, rest)
    for e in errors:
        print(f"FAIL mutant {mid}: {e}")
    if not errors:
        print(f"OK mutant {mid}: " + ("passes, as it should" if m["kind"] == "equivalent"
                                      else f"the check names TODO {m['todo']}"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
