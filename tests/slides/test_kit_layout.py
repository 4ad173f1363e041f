#!/usr/bin/env python3
"""kit.layout_bite: common/tools/kit_layout.py check (kit.layout) fails when it should.

On a copy of the checkout it requires that the copy passes as it is, and that `check` fails,
naming the file and line, when
  * an exercise includes a header by its old flat path (`#include "kit/ddp.h"`);
  * a page or a rule names a source that way (`common/kit/zero.cpp`);
  * a new folder has no line in the table, a header of a folder is not described, a source lies
    outside the folders, or the table's "first included by" column is stale;
  * a source of common/kit/ includes a folder that is not below its own (the model including the
    flags of train/, the runtime including train/, sharding including ddp's peer... as the
    library had it before its layers were ordered), or a new folder has no layer;
  * a page names a header at a folder it moved away from (kit/sharding/zero_checkpoint.h);
and that `kit/compat.h`, which stays at the top, and a folder-qualified path pass.

usage: test_kit_layout.py SOURCE_DIR WORK_DIR
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from checkout import copy_checkout  # noqa: E402
from verdict import expect, finish  # noqa: E402


def check(root):
    p = subprocess.run([sys.executable, os.path.join(root, "common/tools/kit_layout.py"), "check",
                        root], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def with_edit(root, path, old, new, *wanted, why):
    full = os.path.join(root, path)
    text = open(full, encoding="utf-8").read()
    if old not in text:
        raise SystemExit(f"test_kit_layout.py: {path} no longer holds {old!r}: update this test")
    open(full, "w", encoding="utf-8").write(text.replace(old, new, 1))
    rc, out = check(root)
    expect(rc == 1 and all(w in out for w in wanted), f"{why} (exit {rc}; wanted {wanted})",
           detail=out)
    open(full, "w", encoding="utf-8").write(text)


def main(src, work):
    shutil.rmtree(work, ignore_errors=True)
    copy_checkout(src, work, untracked=True)
    rc, out = check(work)
    expect(rc == 0, "the copy passes as it is", detail=out)
    ex = "exercises/01-transformer-lm-ddp/train.cpp"
    include = '#include "kit/data/data_loader.h"'
    at = open(os.path.join(work, ex), encoding="utf-8").read().split("\n").index(
        next(l for l in open(os.path.join(work, ex), encoding="utf-8").read().split("\n")
             if l.startswith(include))) + 1
    with_edit(work, ex, include, '#include "kit/data_loader.h"',
              f"{ex}:{at}:", "names kit/data_loader.h",
              why="an exercise's include of an old flat path fails, naming file and line")
    with_edit(work, "sbatch/README.md", "\n", "\nsee common/kit/zero.cpp\n", "sbatch/README.md:2:",
              why="a page naming common/kit/zero.cpp fails")
    with_edit(work, "common/tools/rules/ex03.py", "\n", '\nWHERE = "kit/checkpoint.cpp"\n',
              "common/tools/rules/ex03.py:2:", why="a rule naming kit/checkpoint.cpp fails")
    with_edit(work, "common/tools/rules/ex00.py", "\n", "\nINCLUDED = r'#include \"kit/distributed\\.h\"'\n",
              "common/tools/rules/ex00.py:2:", "names kit/distributed\\.h",
              why="a rule's regular expression with the old path (escaped dot) fails")
    rc, _ = check(work)
    expect(rc == 0, "the copy passes again after each edit was undone")
    # kit/compat.h and a folder path are fine: checked on their own
    full = os.path.join(work, "sbatch/README.md")
    text = open(full, encoding="utf-8").read()
    open(full, "w", encoding="utf-8").write(text + "\nkit/compat.h, kit/sharding/zero.cpp\n")
    rc, out = check(work)
    expect(rc == 0, "kit/compat.h and a folder-qualified path pass")
    open(full, "w", encoding="utf-8").write(text)

    os.makedirs(os.path.join(work, "common/kit/tensor"))
    open(os.path.join(work, "common/kit/tensor/layers.h"), "w").write("#pragma once\n")
    rc, out = check(work)
    expect(rc == 1 and "common/kit/tensor/: a folder with no line in FOLDERS" in out,
           "a new folder without its line in the table fails")
    shutil.rmtree(os.path.join(work, "common/kit/tensor"))
    open(os.path.join(work, "common/kit/ddp/overlap.h"), "w").write("#pragma once\n")
    rc, out = check(work)
    expect(rc == 1 and "kit/ddp/overlap.h is not described" in out,
           "a header that common/kit/README.md does not describe fails")
    os.remove(os.path.join(work, "common/kit/ddp/overlap.h"))
    open(os.path.join(work, "common/kit/loose.cpp"), "w").write("\n")
    rc, out = check(work)
    expect(rc == 1 and "common/kit/loose.cpp: a source outside the folders" in out,
           "a source outside the folders fails")
    os.remove(os.path.join(work, "common/kit/loose.cpp"))
    with_edit(work, "common/kit/models/transformer_lm.h", "#pragma once\n",
              '#pragma once\n#include "kit/train/args.h"\n',
              "common/kit/models/transformer_lm.h:", "includes kit/train/args.h", "not below models/",
              why="the model including train/'s flags fails, naming the file, line and folders")
    with_edit(work, "common/kit/runtime/distributed.cpp", '#include "kit/runtime/files.h"',
              '#include "kit/train/files.h"', "common/kit/runtime/distributed.cpp:",
              "not below runtime/", why="the runtime including train/ fails")
    with_edit(work, "common/kit/data/data_loader.h", "#pragma once\n",
              '#pragma once\n#include "kit/models/resnet.h"\n', "not below data/",
              why="a peer of the same layer (data/ including models/) fails")
    with_edit(work, "common/kit/ddp/ddp.h", "#pragma once\n",
              '#pragma once\n#include "kit/check/trace.h"\n', "check/ only through",
              why="a folder including check/ other than its seam (observe.h) fails")
    with_edit(work, "sbatch/README.md", "\n", "\nsee kit/sharding/zero_checkpoint.h\n",
              "sbatch/README.md:2:", "names kit/sharding/zero_checkpoint.h, which common/kit/ does not have",
              why="a path of a file that moved to another folder fails")
    os.makedirs(os.path.join(work, "common/kit/tensor"))
    open(os.path.join(work, "common/kit/tensor/layers.h"), "w").write("#pragma once\n")
    rc, out = check(work)
    expect(rc == 1 and "common/kit/tensor/: a folder with no layer in LAYERS" in out,
           "a new folder without its layer fails")
    shutil.rmtree(os.path.join(work, "common/kit/tensor"))
    sol = "solutions/00-collectives/collectives.cpp"
    with_edit(work, sol, '#include "kit/train/args.h"', '#include "kit/runtime/env.h"',
              "the folder table is not what kit_layout.py renders",
              why="the table's 'first included by' column follows the solutions' includes")
    shutil.rmtree(work, ignore_errors=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
