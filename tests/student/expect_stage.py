#!/usr/bin/env python3
"""Runs the student check (common/tools/check.py) on one build of an exercise and asserts that
exactly the TODOs of that stage pass: stage k passes TODOs 1..k (a pair "2-3" counts from 2) and
fails every later one by name. The final-loss comparison ("all") must fail on the unmodified
exercise (stage 0) and pass on the last stage; in between it passes as soon as every TODO that
changes the numbers is done (print0, save0 and destroy do not), so it is not pinned there.
Where a stage cannot show a later TODO at all (exercise 05: a pipeline does not run until its
forward, loss and backward are all there), the rules list those TODOs in NOT_REACHED_AT_STAGE:
"not reached" counts as failing for exactly them.

usage: expect_stage.py EXERCISE STAGE -- <check.py arguments>
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rules_of(ex):
    """The exercise's rules' NOT_REACHED_AT_STAGE ({stage: [TODO labels]}), or {}."""
    sys.path.insert(0, os.path.join(ROOT, "common/tools"))
    import importlib
    import kit_toml
    with open(os.path.join(ROOT, "exercises", ex, "info.toml"), "rb") as f:
        info = kit_toml.load(f)
    return getattr(importlib.import_module(f"rules.{info['target']}"), "NOT_REACHED_AT_STAGE", {})


def main(argv):
    ex, stage, rest = argv[0], int(argv[1]), argv[3:]
    todos = json.loads(subprocess.check_output(
        [sys.executable, os.path.join(ROOT, "common/tools/stages.py"), "todos", ex, "--json"]))
    code_todos = [t for t in todos if t["lang"] == "cpp"]
    last = max(t["last"] for t in code_todos)
    labels = {t["todo"]: t["first"] for t in code_todos}
    want_pass = {l for l, first in labels.items() if first <= stage} | ({"all"} if stage >= last else set())
    want_fail = (set(labels) | {"all"}) - want_pass
    if 0 < stage < last:
        want_fail.discard("all")

    # TODOs the rules say cannot show anything at this stage (a pipeline that cannot run yet,
    # rules/ex05.py): "not reached" is their right verdict, and a ✘ is allowed too.
    may_wait = set(rules_of(ex).get(stage, ()))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "common/tools/check.py"),
                        "--exercise", ex] + rest, capture_output=True, text=True)
    sys.stdout.write(p.stdout + p.stderr)
    lines = dict(l.split(": ", 1) for l in p.stdout.splitlines()
                 if l.startswith(("passed: ", "failed: ", "not reached: ")))
    got_pass = set(lines.get("passed", "-").split(",")) - {"-"}
    got_fail = set(lines.get("failed", "-").split(",")) - {"-"}
    waiting = set(lines.get("not reached", "-").split(",")) - {"-"}
    got_fail |= waiting & may_wait  # counted as failing: not done, and said so
    if 0 < stage < last:
        got_pass.discard("all")
        got_fail.discard("all")
    errors = []
    if "passed" not in lines:
        errors.append(f"the check did not finish (exit {p.returncode})")
    if got_pass != want_pass:
        errors.append(f"passing TODOs {sorted(got_pass)}, expected {sorted(want_pass)}")
    if got_fail != want_fail:
        errors.append(f"failing TODOs {sorted(got_fail)}, expected {sorted(want_fail)}")
    if want_fail and p.returncode == 0:
        errors.append("the check exited 0 although TODOs are missing")
    if not want_fail and p.returncode != 0:
        errors.append(f"the check exited {p.returncode} although everything is done")
    for todo in want_fail - {"all"} - (waiting & may_wait):  # each missing TODO named on its own line
        if not any(l.strip().startswith(f"\u2718 TODO {todo} ") for l in p.stdout.splitlines()):
            errors.append(f"no \u2718 line names TODO {todo}")
    for e in errors:
        print(f"FAIL stage {stage}: {e}")
    if not errors:
        print(f"OK stage {stage}: passes {sorted(want_pass)}, fails {sorted(want_fail)}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
