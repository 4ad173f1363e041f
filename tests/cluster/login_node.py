#!/usr/bin/env python3
"""A participant's first morning on a login node, simulated: the kit must build and `./kit check`
must run from a fresh copy of the repository as an unprivileged user, with no package
installed for it, the system's Gloo headers out of sight, no network at all, and a torch other
than the pinned one already imported by the `python3` on PATH (a site module or the user's venv).

What it does, as root (it needs root to set the scene; exit 77, a skip, otherwise):
  1. copies the repository as git would clone it (tracked and untracked-not-ignored files) into
     HOME/kit, owned by the user `nobody`, where HOME is the scene's own folder under /tmp (mode
     755; never under the clone, which may sit below a folder the user cannot enter: scene.py);
  2. in a new mount and network namespace: hides /usr/include/gloo behind an empty folder, brings
     up loopback only (no route to anything, the package index included), and drops to `nobody`,
     with PYTHON's folder first on PATH;
  3. as that user: `./kit demo --epochs 1 --max-steps 3` (the README's set-up: build, then 2
     ranks on Gloo), then, for the exercises of ON_THE_LOGIN_NODE, `./kit stage NN LAST &&
     ./kit check NN`, the solution's files over the exercise's, which must pass every TODO; for
     exercise 01, the README's first, also `./kit check 01` on the exercise as shipped before,
     which must fail and name its first TODO ("fix first: TODO 1"). `./kit check` builds whatever
     its runs need (the exercise, the solution, info.toml's [check] tools and preload): nothing
     else is built before it, so a target the check forgets is a failure here (issue 40:
     exercise 03's stopped runs preload lib/libkit_test_hooks.so). ON_THE_LOGIN_NODE holds one
     exercise for each kind of thing a check builds or prepares (a data tool, a preloaded
     library, data prepared in Python); the test fails when an exercise's [check] needs a kind
     that none of them needs;
  4. then, not a participant's step, what `./kit cuda-build` checks, in that same build folder
     (so that CI compiles kit_common against the CUDA torch once, not twice): the GPU tests and
     tests/ddp's NCCL cases compiled (KIT_CUDA_TARGETS) without compiling kit_common again, the
     2-rank run that must say "no GPU", KIT_BACKEND=nccl refused in one line, `ctest -L gpu`
     with every test that needs a GPU skipped and saying why. Not the other trainers,
     benchmarks and tools: they have no line of their own that the CUDA torch compiles
     differently (no KIT_HAVE_NCCL, no CUDA-only call: `./kit cuda-build` says so of the
     stages), and this torch's API is checked by kit_common and the trainers of step 3.
Each step must succeed, say which torch it built against and how it got Gloo's headers, and
nothing may ask for root (no apt-get, no sudo) or the network.

The torch is given the way a site's PyTorch module gives it: PYTHONPATH names its site-packages
(here the site-packages of VENV: the CUDA torch of requirements-cuda.txt, which ./kit test
installs in .venv-cuda), for the system's python3.

usage: login_node.py --venv VENV
"""
import glob
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
from checkout import copy_checkout  # noqa: E402
from verdict import expect, finish, root_test_args  # noqa: E402
from scene import PROBE, Scene, judge_probe, parse_probe  # noqa: E402


def main():
    a = root_test_args("--venv", why="setting the scene (a user, namespaces) needs root")
    sites = glob.glob(os.path.join(os.path.abspath(a.venv), "lib", "python3*", "site-packages"))
    if not sites or not os.path.isdir(os.path.join(sites[0], "torch")):
        print(f"FAIL no torch in {a.venv} (./kit test and ./kit cuda-build make .venv-cuda, the "
              "torch used here)")
        return 1
    site = sites[0]
    version = subprocess.run(["/usr/bin/python3", "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=site)).stdout.strip()
    with open(os.path.join(ROOT, "requirements.txt")) as f:
        pinned = [line.split("==")[1].strip() for line in f if line.startswith("torch==")][0]
    expect(version and not version.startswith(pinned), f"the user's torch ({version}) is not the "
           f"pinned {pinned}")

    scene = Scene()
    try:
        morning(scene, site, version)
    finally:
        scene.remove()
    return finish()


def morning(scene, site, version):
    """The participant's steps, each judged."""
    as_user = scene.as_user
    copy_checkout(ROOT, os.path.join(scene.home, "kit"), untracked=True)  # work in progress too
    scene.give_to_user()

    # The scene itself: gloo hidden, no network, not root.
    rc, out = as_user(site, PROBE)
    for holds, what in judge_probe(parse_probe(out)):
        expect(rc == 0 and holds, what, out)

    rc, out = as_user(site, "cd ~/kit && ./kit demo --epochs 1 --max-steps 3")
    expect(rc == 0, "./kit demo builds and trains on 2 ranks", out)
    expect(f"LibTorch {version} from the torch that" in out,
           "it says it builds against the torch that python3 imports", out)
    expect("Gloo headers: none needed" in out, "it says how it gets by without Gloo's headers", out)
    expect("final test loss" in out, "the training reaches its end", out)
    expect("apt-get" not in out and "sudo" not in out, "nothing asked for root", out)

    # Bad input: a python3 without torch and no network. One line that names the fix, exit 2,
    # and no half-made .venv left behind.
    rc, out = as_user("", "cd ~/kit && KIT_BUILD_DIR=$HOME/build-none ./kit build 2>&1 >/dev/null; "
                      "echo rc=$?; ls -d .venv 2>/dev/null || echo no-venv")
    lines = out.strip().splitlines()
    expect(len(lines) == 3 and lines[1] == "rc=2" and lines[2] == "no-venv"
           and "load the site's PyTorch module" in lines[0],
           "no torch and no network: one error line naming the fix, exit 2, no .venv left", out)

    # ./kit check on the exercises of ON_THE_LOGIN_NODE finished, and on exercise 01 (the README's
    # first exercise) as shipped (the trainers built against the CUDA torch, run on the CPU with
    # Gloo, judged TODO by TODO). A check builds its exercise, the solution, ddprun and its
    # info.toml's [check] tools and preload before its first run, and a finished exercise's check
    # runs every run its rules have; an exercise as shipped stops at its first TODO, which
    # student.NN-exercise judges in the main build. student.NN-solution runs every finished check
    # in the main build; what only this scene shows is that a check builds what its runs need
    # with nothing built before it, and runs on another torch: one check for each kind of need
    # is enough (tests/README.md, 2026-11-28 night: 01 finished and 02 left out, about 70 s).
    kinds = {name[:2]: check_kinds(name) for name in exercises()}
    covered = set().union(*(kinds[ex] for ex in set(ON_THE_LOGIN_NODE) | {AS_SHIPPED}
                            if ex in kinds))
    for ex, kind in sorted(kinds.items()):
        what = ", ".join(sorted(kind)) or "nothing"
        expect(kind <= covered, f"{ex}: what its check needs ({what}) a check here needs too",
               f"missing: {sorted(kind - covered)}: add an exercise whose check needs it to "
               "ON_THE_LOGIN_NODE (login_node.py)")
    for name in exercises():
        ex = name[:2]
        if ex not in ON_THE_LOGIN_NODE and ex != AS_SHIPPED:
            continue
        todos = json.loads(subprocess.run(
            [sys.executable, os.path.join(ROOT, "common", "tools", "stages.py"), "todos", name,
             "--json"], capture_output=True, text=True, check=True).stdout)
        last = max(int(str(t["todo"]).split("-")[-1]) for t in todos)
        first = min((t for t in todos if t["lang"] == "cpp"), key=lambda t: t["first"])["todo"]
        if ex == AS_SHIPPED:
            start = time.time()
            rc, out = as_user(site, f"cd ~/kit && ./kit check {ex}")
            expect(rc == 1 and f"fix first: TODO {first}\n" in out,
                   f"./kit check {ex} fails the exercise as shipped, naming TODO {first} first "
                   f"({time.time() - start:.0f} s)", out)
        if ex not in ON_THE_LOGIN_NODE:
            continue
        start = time.time()
        rc, out = as_user(site, f"cd ~/kit && ./kit stage {ex} {last} && ./kit check {ex}")
        expect(rc == 0, f"./kit check {ex} passes the finished exercise (stage {last}) on the "
               f"login node ({time.time() - start:.0f} s)", out)
        expect("✘" not in out and "✔" in out, f"{ex}: no TODO is judged ✘", out)

    cuda_build(as_user, site)


def cuda_build(as_user, site):
    """What `./kit cuda-build` checks, in the folder the participant built (not a participant's
    step): CI builds kit_common against the CUDA torch once, here, not twice. The GPU tests and
    tests/ddp's NCCL cases (KIT_CUDA_TARGETS: gpu_tests and ddp_tests, and the trainer, ddprun
    and tools they run), the 2-rank run that must say "no GPU", KIT_BACKEND=nccl refused in one
    line, and `ctest -L gpu`, whose tests must all skip, each saying why. Left out of the whole
    `./kit cuda-build`: exercises 00, 02, 04 and 05, the benchmarks and the tools, code that
    compiles the same on the CPU torch (the docstring): this test took 548 CPU-s without them,
    724 with them (2026-11-29)."""
    start = time.time()
    rc, out = as_user(site, "cd ~/kit && KIT_NO_INSTALL=1 KIT_CUDA_PYTHON=python3 "
                      "KIT_CUDA_BUILD_DIR=$HOME/kit/build KIT_CUDA_TARGETS='gpu_tests ddp_tests' "
                      "./kit cuda-build")
    expect(rc == 0, f"./kit cuda-build in the participant's build folder compiles the GPU tests "
           f"against the CUDA torch and runs ({time.time() - start:.0f} s)", out)
    expect("NCCL ON" in out, "the CUDA build compiles the NCCL path (configure says NCCL ON)", out)
    expect("kit_common.dir" not in out, "it reuses the participant's kit_common: no file of "
           "common/kit compiled again", out)
    expect(re.search(r"CUDA build, KIT_BACKEND=nccl: .*KIT_BACKEND=nccl", out) is not None,
           "KIT_BACKEND=nccl without a GPU: one line", out)
    gpu = re.search(r"100% tests passed, 0 tests failed out of (\d+), (\d+) of them skipped: "
                    r"no GPU", out)
    expect(gpu is not None and int(gpu.group(2)) > 0, "ctest -L gpu: no GPU test fails; those that "
           "need a GPU skip here, saying why", out)


AS_SHIPPED = "01"  # the exercise also checked as shipped: the README's first

# The exercises checked finished on the login node, one for each kind of thing a check builds or
# prepares there (check_kinds). The others' checks need nothing of another kind (00: nothing; 01,
# 04 and 05: 01's corpus tool, which exercise 01's check as shipped builds too; 02 and 06: a data
# tool, as 03's; 04: 03's preload), and student.NN-solution runs them in the main build. Until
# 2026-11-29 exercise 06 was checked here too, for its trainer run as one process (no ddprun):
# a way of running, not a thing to build, which student.ex06-solution runs (45 s of a CI lane).
ON_THE_LOGIN_NODE = {
    "03": "a data tool (make_corpus), a preloaded library (kit_test_hooks) for its stopped runs",
    "07": "data prepared in Python by ./kit data xsum (the user's h5py and sentencepiece)",
}


def check_kinds(name):
    """The kinds of thing an exercise's ./kit check builds or prepares besides the trainers and
    ddprun, from its info.toml's [check]: a data tool it builds (tools), a library its runs
    preload (preload)."""
    info = json.loads(subprocess.run(
        [sys.executable, os.path.join(ROOT, "common", "tools", "stages.py"), "info", name],
        capture_output=True, text=True, check=True).stdout).get("check", {})
    return ({"a data tool"} if info.get("tools") else set()) | \
        ({"a preloaded library"} if info.get("preload") else set())


def exercises():
    """Every exercise, by its folder name, in order: each folder of exercises/ with an
    info.toml."""
    return sorted(os.path.basename(os.path.dirname(p))
                  for p in glob.glob(os.path.join(ROOT, "exercises", "*", "info.toml")))


if __name__ == "__main__":
    sys.exit(main())
