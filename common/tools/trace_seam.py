#!/usr/bin/env python3
"""The checker's instrumentation stays behind its seam, and fault injection stays in the tests.

The library (common/kit/) reports what a run does through kit/check/observe.h, one typed call per
event; only kit/check/ knows the run trace: its lines, its files, its KIT_TRACE_* variables
(common/kit/README.md, "check/"). Fault injection reaches the trainers only through
kit/train/checkpoint_hooks.h, filled in by the preloaded common/testing/libkit_test_hooks.so.

`check` reads the code (comments aside; string contents too for the tracer's names) of every .h
and .cpp of common/kit/, common/launcher/, solutions/ and exercises/ (the trainers), and fails,
one line per finding with file:line, when
  * a file of common/kit/ outside check/ names the tracer (`trace::record`, `trace::enabled`,
    any `trace::`), or includes kit/check/trace.h or kit/check/model_trace.h;
  * a file of common/kit/ outside check/, or of common/launcher/, names a KIT_TRACE_* variable
    (in code or in a string: that is how getenv is called);
  * any of these files names a fault variable (KIT_TEST_*, KIT_DIE_*) in code or in a string:
    a trainer would read it on every run. (common/testing/, the preloaded test library, is where
    they are read.)

Commands:
  trace_seam.py check [ROOT]   exit 1 on a finding
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEAM = "kit/check/observe.h"
TRACER = re.compile(r"\btrace::\w*")
TRACE_INCLUDE = re.compile(r'#\s*include\s*"(kit/check/(?:model_)?trace\.h)"')
TRACE_VAR = re.compile(r"\bKIT_TRACE\w*")
FAULT_VAR = re.compile(r"\bKIT_(?:TEST|DIE)_\w*")
# A C++ comment or a string or character literal, for code_and_strings() below.
TOKENS = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def code_and_strings(text):
    """(code, code_with_strings): the text with comments blanked, and with strings blanked too.
    Newlines stay, so that line numbers hold."""
    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))

    def no_comment(m):
        return blank(m) if m.group(0).startswith("/") else m.group(0)

    def no_comment_no_string(m):
        s = m.group(0)
        return blank(m) if s.startswith("/") else s[0] + " " * (len(s) - 2) + s[-1]
    return TOKENS.sub(no_comment_no_string, text), TOKENS.sub(no_comment, text)


def sources(root, folder):
    base = os.path.join(root, folder)
    for d, subdirs, files in os.walk(base):
        subdirs.sort()
        for f in sorted(files):
            if f.endswith((".h", ".cpp")):
                full = os.path.join(d, f)
                yield os.path.relpath(full, root), full


def findings(root):
    found = []
    for folder in ("common/kit", "common/launcher", "solutions", "exercises"):
        for rel, full in sources(root, folder):
            text = open(full, encoding="utf-8").read()
            code, with_strings = code_and_strings(text)
            library = rel.startswith("common/kit/") and not rel.startswith("common/kit/check/")
            for n, (line, sline) in enumerate(zip(code.split("\n"), with_strings.split("\n")), 1):
                if library:
                    for m in TRACER.finditer(line):
                        found.append(f"{rel}:{n}: calls the tracer ({m.group(0)}) outside "
                                     f"kit/check/: report the event through {SEAM} (one "
                                     "observe:: function per event; the formatting lives there)")
                    for m in TRACE_INCLUDE.finditer(sline):
                        found.append(f"{rel}:{n}: includes {m.group(1)} outside kit/check/: "
                                     f"include {SEAM}")
                if library or rel.startswith("common/launcher/"):
                    for m in TRACE_VAR.finditer(sline):
                        found.append(f"{rel}:{n}: names {m.group(0)} outside kit/check/: the "
                                     "trace's variables are read in kit/check/ only")
                for m in FAULT_VAR.finditer(sline):
                    found.append(f"{rel}:{n}: names the fault variable {m.group(0)} on the "
                                 "production path: fault injection goes through "
                                 "kit/train/checkpoint_hooks.h (common/testing/ fills it in)")
    return found


def main(argv):
    if len(argv) < 2 or argv[1] != "check" or len(argv) > 3:
        sys.exit("usage: trace_seam.py check [ROOT]")
    root = argv[2] if len(argv) == 3 else ROOT
    if not os.path.isdir(os.path.join(root, "common/kit/check")):
        sys.exit(f"trace_seam: {root} has no common/kit/check/: not a checkout of the kit")
    found = findings(root)
    for f in found:
        print(f)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
