#!/usr/bin/env python3
"""Registers a GoogleTest binary's cases with CTest one suite at a time (kit_discover_tests in
tests/CMakeLists.txt): one CTest test per suite, named PREFIX<Suite>, which runs the suite's
cases in one process with --gtest_filter. Why: each start of a test binary that loads LibTorch
(most of them) costs about 0.5 CPU-s before the first case, and one test per case started a
binary about 200 times more per run of the suite (tests/README.md, "Cut on 2026-11-29"). A
failing case is named in the test's output, as gtest prints it.

Run after the binary is built (a POST_BUILD step); writes a CTest script that the build folder's
CTestTestfile.cmake includes.

usage: gtest_suites.py --exe EXE --out FILE --prefix PREFIX --labels L[;L...] --timeout S
                       --workdir DIR [--leave-out FILTER]
  --leave-out FILTER  gtest filter patterns (a:b) of the cases registered elsewhere, each a CTest
                      test of its own (kit_discover_tests's SERIAL and ALONE); a suite none of
                      whose cases is left gets no test
"""
import argparse
import fnmatch
import subprocess
import sys


def cases(exe):
    """[(suite, name)] in the binary's order, from --gtest_list_tests."""
    out = subprocess.run([exe, "--gtest_list_tests"], capture_output=True, text=True,
                         timeout=60)
    if out.returncode != 0:
        sys.exit(f"gtest_suites.py: {exe} --gtest_list_tests failed (exit {out.returncode}):\n"
                 f"{out.stdout}{out.stderr}")
    found, suite = [], None
    for line in out.stdout.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):  # "Suite." or "Prefix/Suite.  # TypeParam = ..."
            suite = line.split("#")[0].strip().rstrip(".")
        elif suite is not None:
            found.append((suite, line.split("#")[0].strip()))
    return found


def matches(full, patterns):
    return any(fnmatch.fnmatchcase(full, p) for p in patterns)


def bracket(text):
    """A CMake bracket argument that holds text whatever it contains."""
    eq = "="
    while f"]{eq}]" in text:
        eq += "="
    return f"[{eq}[{text}]{eq}]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--exe", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--labels", required=True)
    ap.add_argument("--timeout", type=int, required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--leave-out", default="")
    a = ap.parse_args()
    left_out = [p for p in a.leave_out.split(":") if p]
    suites = {}
    for suite, name in cases(a.exe):
        if not matches(f"{suite}.{name}", left_out):
            suites.setdefault(suite, []).append(name)
    lines = [f"# Written by tests/support/gtest_suites.py from {a.exe} --gtest_list_tests"]
    for suite, names in suites.items():
        test = bracket(a.prefix + suite)
        # The suite's cases but those registered elsewhere; a suite's timeout grows with its
        # cases, up to 10 minutes (a hang inside a case is still ended by CTest).
        flt = f"{suite}.*" + (f"-{':'.join(left_out)}" if left_out else "")
        timeout = min(max(a.timeout, a.timeout * len(names) // 2), max(a.timeout, 600))
        lines.append(f"add_test({test} {bracket(a.exe)} {bracket('--gtest_filter=' + flt)})")
        lines.append(f"set_tests_properties({test} PROPERTIES LABELS {bracket(a.labels)} "
                     f"TIMEOUT {timeout} WORKING_DIRECTORY {bracket(a.workdir)})")
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
