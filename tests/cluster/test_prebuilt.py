#!/usr/bin/env python3
"""kit_common built once for a course (KIT_PREBUILT_COMMON, common/cmake/prebuilt.cmake): this
build folder plays the instructor's, a new folder the participant's.

  * the participant's folder configures against it, builds exercise 00's solution and ddprun
    without compiling one source of common/kit/, links the instructor's libkit_common.so, and
    the program runs on 2 ranks with the right results;
  * a folder whose stamp is another kit's (or torch's, or compiler's) stops the configure step
    with one line; so does a folder with no kit built in it, also through `./kit build`
    (KIT_PREBUILT_COMMON in the environment), with exit 2.

usage: test_prebuilt.py --build BUILD_DIR --work DIR
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
from verdict import expect, finish  # noqa: E402


def cache(build, name):
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split("=", 1)[1].strip()
    return ""


def configure(build, target_dir, prebuilt):
    args = ["cmake", "-S", ROOT, "-B", target_dir, "-DKIT_BUILD_TESTS=OFF", "-DKIT_BUILD_STAGES=OFF",
            f"-DCMAKE_BUILD_TYPE={cache(build, 'CMAKE_BUILD_TYPE')}",
            f"-DCMAKE_CXX_COMPILER={cache(build, 'CMAKE_CXX_COMPILER')}",
            f"-DTorch_DIR={cache(build, 'Torch_DIR')}", f"-DKIT_PREBUILT_COMMON={prebuilt}"]
    return subprocess.run(args, capture_output=True, text=True)


def kit_errors(text):
    """The configure step's errors, each joined into one line (CMake indents its text)."""
    blocks = re.split(r"^CMake Error.*\n", text, flags=re.M)[1:]
    return [" ".join(l.strip() for l in b.split("\n\n")[0].splitlines()) for b in blocks]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    build, work = os.path.abspath(a.build), os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    lib = os.path.join(build, "lib", "libkit_common.so")
    if not os.path.isfile(lib):
        print(f"FAIL {lib} is not built: build kit_common first")
        return 1

    mine = os.path.join(work, "participant")
    r = configure(build, mine, build)
    expect(r.returncode == 0 and "kit_common prebuilt in" in r.stdout,
           "a participant's folder configures against the instructor's kit_common", r.stdout + r.stderr)
    r = subprocess.run(["cmake", "--build", mine, "-j", os.environ.get("KIT_JOBS", "2"), "--target",
                        "ex00-solution", "ddprun", "--", "VERBOSE=1"],
                       capture_output=True, text=True)
    expect(r.returncode == 0, "exercise 00's solution and ddprun build there", r.stdout[-3000:] + r.stderr)
    compiled = re.findall(r"-c \S*common/kit/\S+\.cpp", r.stdout)
    expect(not compiled, "no source of common/kit/ is compiled in the participant's folder", compiled)
    ldd = subprocess.run(["ldd", os.path.join(mine, "bin", "ex00-solution")], capture_output=True,
                         text=True).stdout
    expect(f"{lib} " in ldd or f"{os.path.realpath(lib)} " in ldd,
           "the program links the instructor's libkit_common.so", ldd)
    run = subprocess.run([os.path.join(mine, "bin", "ddprun"), "--nproc-per-node", "2", "--",
                          os.path.join(mine, "bin", "ex00-solution"), "--out-dir",
                          os.path.join(work, "out")], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    expect(run.returncode == 0 and "rank 1 of 2: local rank 1" in run.stdout
           and re.search(r"rank 0: all_reduce SUM 3 6 9", run.stdout),
           "it runs on 2 ranks with the right results", run.stdout + run.stderr)

    # Another kit: the same library with a stamp of other sources.
    other = os.path.join(work, "other-kit")
    os.makedirs(os.path.join(other, "lib"))
    os.symlink(lib, os.path.join(other, "lib", "libkit_common.so"))
    with open(os.path.join(build, "kit-common.stamp")) as f:
        stamp = f.read()
    with open(os.path.join(other, "kit-common.stamp"), "w") as f:
        f.write(re.sub(r"^sources \S+", "sources 0000", stamp))
    r = configure(build, os.path.join(work, "refused"), other)
    errors = kit_errors(r.stdout + r.stderr)
    expect(r.returncode != 0 and len(errors) == 1 and "was built from another kit, torch or compiler"
           in errors[0], "a folder built from another kit: one line, no build folder made", errors)

    # Nothing built there, through ./kit (the variable), as a participant meets it: exit 2.
    env = dict(os.environ, KIT_PREBUILT_COMMON=os.path.join(work, "empty"),
               KIT_BUILD_DIR=os.path.join(work, "kit-build"), KIT_NO_INSTALL="1",
               CMAKE_PREFIX_PATH=os.path.dirname(cache(build, "Torch_DIR")))
    os.makedirs(env["KIT_PREBUILT_COMMON"])
    r = subprocess.run([os.path.join(ROOT, "kit"), "build"], env=env, capture_output=True, text=True)
    lines = [l for l in r.stderr.splitlines() if l.startswith("kit: error:")]
    expect(r.returncode == 2 and len(lines) == 1 and "holds no built kit" in lines[0],
           "./kit with KIT_PREBUILT_COMMON of an empty folder: one line, exit 2", r.stderr)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
