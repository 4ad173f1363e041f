#!/usr/bin/env python3
"""kit.trace_seam_bite: common/tools/trace_seam.py check (kit.trace_seam) fails when it should.

On a copy of common/kit/, common/launcher/, solutions/ and exercises/ (all the check reads) it
requires that the copy
passes as it is, and that `check` fails, naming the file and the line, when a library file
outside kit/check/
  * calls trace::record() or guards a call with trace::enabled(), as ten files did before
    kit/check/observe.h;
  * includes kit/check/trace.h or kit/check/model_trace.h;
  * reads KIT_TRACE_WEIGHTS;
and when a library file, the launcher or a trainer reads a fault variable
(KIT_TEST_STOP_AFTER_STEP, KIT_DIE_DURING_SAVE, KIT_TEST_STEP_DELAY_MS); while the same call inside kit/check/, and the words in a comment, pass.

usage: test_trace_seam.py SOURCE_DIR WORK_DIR
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from verdict import expect, finish  # noqa: E402


def check(root, tool):
    p = subprocess.run([sys.executable, tool, "check", root], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def with_line(root, tool, path, anchor, new, wanted, why):
    """Inserts `new` after the first line of `path` that holds `anchor`, runs the check, expects
    exit 1 and a finding at "path:<the new line's number>:" holding `wanted` (None: expects a
    pass), and undoes the edit."""
    full = os.path.join(root, path)
    text = open(full, encoding="utf-8").read()
    lines = text.split("\n")
    at = next((i for i, line in enumerate(lines) if anchor in line), None)
    if at is None:
        raise SystemExit(f"test_trace_seam.py: {path} no longer holds {anchor!r}: update this test")
    open(full, "w", encoding="utf-8").write("\n".join(lines[:at + 1] + [new] + lines[at + 1:]))
    rc, out = check(root, tool)
    where = f"{path}:{at + 2}:"
    if wanted is None:
        ok = rc == 0
    else:
        ok = rc == 1 and any(line.startswith(where) and wanted in line for line in out.split("\n"))
    expect(ok, f"{why} (exit {rc}; wanted {'a pass' if wanted is None else where + ' ' + wanted})",
           detail=out)
    open(full, "w", encoding="utf-8").write(text)


def main(src, work):
    shutil.rmtree(work, ignore_errors=True)
    for folder in ("common/kit", "common/launcher", "solutions", "exercises"):
        shutil.copytree(os.path.join(src, folder), os.path.join(work, folder))
    tool = os.path.join(src, "common/tools/trace_seam.py")
    rc, out = check(work, tool)
    expect(rc == 0, "the copy passes as it is", detail=out)

    metrics, ddp = "common/kit/train/metrics.cpp", "common/kit/ddp/ddp.cpp"
    with_line(work, tool, metrics, "observe::step(", '  trace::record("step", "loss=1");',
              "calls the tracer (trace::record)",
              why="a library file that records a trace line itself fails, naming file and line")
    with_line(work, tool, ddp, "observe::ddp_no_sync()",
              '  if (trace::enabled()) std::fputs("traced", stderr);',
              "calls the tracer (trace::enabled)",
              why="a library file that asks trace::enabled() fails")
    with_line(work, tool, "common/kit/data/data_loader.h", '#include "kit/check/observe.h"',
              '#include "kit/check/trace.h"', "includes kit/check/trace.h",
              why="a library header that includes kit/check/trace.h fails")
    with_line(work, tool, "common/kit/models/resnet.cpp", '#include "kit/check/observe.h"',
              '#include "kit/check/model_trace.h"', "includes kit/check/model_trace.h",
              why="a model that includes kit/check/model_trace.h fails")
    with_line(work, tool, "common/kit/models/resnet.cpp", "observe::model_to(device);",
              '  if (std::getenv("KIT_TRACE_WEIGHTS")) std::abort();', "names KIT_TRACE_WEIGHTS",
              why="a model that reads KIT_TRACE_WEIGHTS fails")
    with_line(work, tool, "common/kit/train/checkpoint.cpp", "observe::checkpoint(name);",
              '  if (std::getenv("KIT_TEST_STOP_AFTER_STEP")) return;',
              "names the fault variable KIT_TEST_STOP_AFTER_STEP",
              why="a fault variable read in the library fails")
    with_line(work, tool, "common/launcher/ddprun.cpp", "#include",
              'static const char* die = std::getenv("KIT_DIE_DURING_SAVE");',
              "names the fault variable KIT_DIE_DURING_SAVE",
              why="a fault variable read in the launcher fails")
    with_line(work, tool, "solutions/01-transformer-lm-ddp/train.annotated.cpp", "#include",
              'static const char* delay = std::getenv("KIT_TEST_STEP_DELAY_MS");',
              "names the fault variable KIT_TEST_STEP_DELAY_MS",
              why="a fault variable read in a trainer's annotated source fails")
    # What is allowed: the tracer inside kit/check/, and the words in a comment.
    with_line(work, tool, "common/kit/check/observe.cpp", "void ddp_no_sync()",
              '  if (trace::enabled()) trace::record("ddp_no_sync", "");', None,
              why="the tracer called inside kit/check/ passes")
    with_line(work, tool, metrics, "observe::step(",
              "  // (before kit/check/observe.h: trace::record(\"step\", ...) and KIT_TRACE_DIR)",
              None, why="trace::record and KIT_TRACE_DIR in a comment pass")
    rc, _ = check(work, tool)
    expect(rc == 0, "the copy passes again after each edit was undone")
    shutil.rmtree(work, ignore_errors=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
