#!/usr/bin/env python3
"""The mutation suite: typical student mistakes, each a small patch on an exercise's solution,
and the TODO that `kit check` (common/tools/check.py) must name for it. The mistakes of each
exercise are in tests/mutations/table/<target>.py.

A mutant is the solution with one mistake in it: a dropped line, a wrong argument, the right
code in the wrong place. Every (old, new) edit must match the solution exactly once; when the
solution changes so that one no longer does, `write` fails and names it (the build stops), so
the suite cannot silently rot. `verify` (a test of its own) applies every patch and checks that
every TODO of every exercise's trainer has at least one mutant, or a reason in the table's
COVERED_BY_STAGES (a TODO that repeats an earlier exercise's kit call).

Kinds:
  run        compiles; the check must fail, its "fix first" line must name `todo`, and the failing TODOs
             must be exactly {todo} | also ("all", the final-loss row, is not constrained)
  compile    does not compile; the check's compiler report must name `todo`
  stops      compiles, and the run stops (a hang, a crash, an error): the check must name `todo`
             as the TODO to fix first, fail no other TODO, and say "not reached" for exactly the
             TODOs of `also` (those whose work comes after the stop)
  equivalent a correct rewrite the check must pass in full (guards against false alarms)
  diverges   compiles and passes every TODO, but the run is not the solution's: the closing row
             ("all") must fail and name the place where the run first leaves the solution's,
             `todo` ("-": outside the TODOs), and contain every phrase of `also`

In CI: the first mutant of each TODO, in the table's order, and the first of each kind of verdict
in the course that those leave out (`tier`): every kind is judged in CI at least once, by the
engine all exercises share, not in every exercise (2026-11-29: 13 mutants fewer, about 150 s of
test time). The others are the long table: its patches are verified with the
others' (`verify`, the test mutations.table), its programs are built only by the target
long_mutants, and its tests carry the label mutations_long, which `./kit test` builds and runs
only with KIT_TEST_LONG=1. Why: a mutant costs a compile and a whole check (15-60 s on CI's
machines). The full table took 46 minutes of test time in a CI run of 2026-11-28; the first of
each (TODO, kind) pair (101 mutants) still kept CI at 58 minutes against a budget of 40. One a
TODO and one a kind (80) kept every TODO's judgement and every kind of verdict in CI; what only
the long table shows is a TODO's second mistake, of another kind or judged on other evidence, and
an exercise's first mistake of a kind that its TODOs' first ones do not make (a correct rewrite
that must pass: exercise 00's is in CI).
Order a table so that the mutant CI should run for a TODO comes first.

usage: mutants.py list EXERCISE              id kind todo tier, one mutant a line (for CMake)
       mutants.py write EXERCISE ID SOLUTION OUT
       mutants.py show EXERCISE ID           the mutant as JSON
       mutants.py verify                     every patch applies; every TODO is covered; the
                                             check rules' PLACES are in the solution
"""
import importlib.util
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "table")


def load_table():
    """Every exercise's mistakes: tests/mutations/table/<target>.py defines EXERCISE and
    MUTANTS, a list of (id, kind, todo, what, [(old, new), ...], also)."""
    table = {}
    for name in sorted(os.listdir(TABLE)):
        if not name.endswith(".py"):
            continue
        spec = importlib.util.spec_from_file_location(f"mutants_{name[:-3]}", os.path.join(TABLE, name))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        table[module.EXERCISE] = module.MUTANTS
        COVERED_BY_STAGES[module.EXERCISE] = getattr(module, "COVERED_BY_STAGES", {})
    return table


# TODO -> why a table has no mutant for it: a TODO whose mistakes are the same kit calls as an
# earlier exercise's (mutated there); dropping it is what the previous stage's test already
# shows (tests/student), and every mutant costs check time.
COVERED_BY_STAGES = {}
MUTANTS = load_table()


class MutantError(Exception):
    pass


def mutants(ex):
    if ex not in MUTANTS:
        return []
    return [dict(id=i, kind=k, todo=t, what=w, edits=e, also=a) for i, k, t, w, e, a in MUTANTS[ex]]


def tier(ex):
    """id -> "ci" for the first mutant of each TODO of the exercise's table, in its order, and for
    the first of each kind of verdict in the course's tables (exercise by exercise, in order) that
    the TODOs' first ones leave out; "long" for the others (the module's docstring says why)."""
    kinds = set()
    for other in sorted(MUTANTS):
        todos, tiers = set(), {}
        for m in mutants(other):
            new = m["todo"] not in todos or m["kind"] not in kinds
            tiers[m["id"]] = "ci" if new else "long"
            todos.add(m["todo"])
            kinds.add(m["kind"])
        if other == ex:
            return tiers
    return {}


def find(ex, mid):
    for m in mutants(ex):
        if m["id"] == mid:
            return m
    raise MutantError(f"no mutant '{mid}' for exercise {ex} (tests/mutations/table/)")


def apply(m, text, where):
    for n, (old, new) in enumerate(m["edits"], 1):
        count = text.count(old)
        if count != 1:
            raise MutantError(
                f"mutant '{m['id']}' (TODO {m['todo']}), edit {n}: the text to replace occurs "
                f"{count} times in {where}, not once; update tests/mutations/table/ to the "
                f"changed solution. The text:\n{old}")
        text = text.replace(old, new)
    return text


def rules_of(ex):
    """The exercise's check rules (common/tools/rules/<target>.py)."""
    sys.path.insert(0, os.path.join(ROOT, "common", "tools"))
    info = subprocess.run([sys.executable, os.path.join(ROOT, "common/tools/stages.py"), "info", ex],
                          capture_output=True, text=True, check=True)
    return importlib.import_module(f"rules.{json.loads(info.stdout)['target']}")


def solution_path(ex):
    info = subprocess.run([sys.executable, os.path.join(ROOT, "common/tools/stages.py"), "info", ex],
                          capture_output=True, text=True, check=True)
    files = [f for f in json.loads(info.stdout)["files"] if f.get("lang", "cpp") == "cpp"]
    return os.path.join(ROOT, files[0]["solution"])


def verify():
    errors = []
    for ex in sorted(MUTANTS):
        rows = json.loads(subprocess.run(
            [sys.executable, os.path.join(ROOT, "common/tools/stages.py"), "todos", ex, "--json"],
            capture_output=True, text=True, check=True).stdout)
        labels = {r["todo"] for r in rows if r.get("lang", "cpp") == "cpp"}
        path = solution_path(ex)
        text = open(path, encoding="utf-8").read()
        # The trainer lines the check's closing row points at are found by a piece of their text
        # (common/tools/rules/<target>.py, PLACES): each piece must still be in the solution.
        for name, (piece, _) in sorted(getattr(rules_of(ex), "PLACES", {}).items()):
            if piece not in text:
                errors.append(f"{ex}: PLACES['{name}'] of its check rules, '{piece}', is not in "
                              f"{path}: update common/tools/rules/ to the changed solution")
        seen = set()
        for m in mutants(ex):
            if m["id"] in seen:
                errors.append(f"{ex}: mutant id '{m['id']}' twice")
            seen.add(m["id"])
            try:
                if apply(m, text, path) == text:
                    errors.append(f"{ex}: mutant '{m['id']}' changes nothing")
            except MutantError as e:
                errors.append(f"{ex}: {e}")
            if m["todo"] not in labels and not (m["kind"] == "diverges" and m["todo"] == "-"):
                errors.append(f"{ex}: mutant '{m['id']}' names TODO {m['todo']}, which the "
                              f"exercise does not have ({sorted(labels)})")
        covered = {m["todo"] for m in mutants(ex) if m["kind"] in ("run", "stops", "compile")}
        for label, why in COVERED_BY_STAGES.get(ex, {}).items():
            if label not in labels:
                errors.append(f"{ex}: COVERED_BY_STAGES names TODO {label}, which the exercise "
                              "does not have")
            elif not why:
                errors.append(f"{ex}: COVERED_BY_STAGES gives no reason for TODO {label}")
        covered |= set(COVERED_BY_STAGES.get(ex, {}))
        for label in sorted(labels - covered, key=lambda l: int(l.split("-")[0])):
            errors.append(f"{ex}: no mutant for TODO {label}")
        print(f"{ex}: {len(mutants(ex))} mutants ({list(tier(ex).values()).count('ci')} in CI), "
              f"TODOs covered: "
              f"{', '.join(sorted(covered, key=lambda l: int(l.split('-')[0])))}")
    for ex in [e for e in os.listdir(os.path.join(ROOT, "exercises"))
               if os.path.isfile(os.path.join(ROOT, "exercises", e, "info.toml"))]:
        if ex not in MUTANTS:
            errors.append(f"exercise {ex} has no mutants in tests/mutations/table/")
    for e in errors:
        print("FAIL " + e)
    return 1 if errors else 0


def main(argv):
    if len(argv) >= 1 and argv[0] == "verify":
        return verify()
    if len(argv) == 2 and argv[0] == "list":
        tiers = tier(argv[1])
        for m in mutants(argv[1]):
            print(m["id"], m["kind"], m["todo"], tiers[m["id"]])
        return 0
    if len(argv) == 3 and argv[0] == "show":
        print(json.dumps(find(argv[1], argv[2])))
        return 0
    if len(argv) == 5 and argv[0] == "write":
        ex, mid, solution, out = argv[1:]
        m = find(ex, mid)
        text = apply(m, open(solution, encoding="utf-8").read(), solution)
        header = (f"// MUTANT {mid} of {ex} (tests/mutations/mutants.py), a mistake for TODO "
                  f"{m['todo']}: {m['what']}\n")
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        # The header replaces the solution's first line (a comment), so that the mutant's line
        # numbers stay the solution's.
        lines = text.split("\n")
        if lines[0].startswith("//"):
            lines[0] = header.rstrip("\n")
        new = "\n".join(lines)
        if not os.path.exists(out) or open(out, encoding="utf-8").read() != new:
            with open(out, "w", encoding="utf-8") as f:
                f.write(new)
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except MutantError as e:
        sys.stderr.write(f"mutants.py: {e}\n")
        sys.exit(1)
