#!/usr/bin/env python3
"""No silent download on a cluster: `./kit build` with a `python3` that has no torch.

On what looks like a login node (not root, and Slurm's sbatch on PATH or a site profile
sourced) the kit must not install torch into .venv: one line says which module to load, exit 2,
no .venv made. KIT_INSTALL_TORCH=1 lets it install (here it then tries the package index, which
the scene cannot reach: pip's one line). As root, on a machine that is no login node, it installs
as before.

The scene is tests/cluster/scene.py's: the user `nobody`, a home under /tmp, no network. The
kit's copy there holds what `./kit build` reads before it would install: the `kit` script,
requirements.txt and the site profiles. A stand-in `sbatch` on PATH plays Slurm's commands.

usage: test_no_download.py    (needs root to set the scene; exit 77, a skip, otherwise)
"""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
sys.path.insert(0, HERE)  # scene.py
from scene import Scene  # noqa: E402
from verdict import expect, finish  # noqa: E402

# Build with the python3 of the system, which has no torch; report the exit code and whether a
# .venv appeared. stdout (cmake's and the kit's progress) is dropped: the error line is stderr.
BUILD = ("cd ~/kit && {env} KIT_BUILD_DIR=$HOME/build ./kit build 2>&1 >/dev/null; echo rc=$?; "
         "ls -d .venv 2>/dev/null || echo no-venv")
STUB = "mkdir -p ~/stub && printf '#!/bin/sh\\nexit 0\\n' >~/stub/sbatch && chmod +x ~/stub/sbatch; "


def lines_of(out):
    return [l for l in out.strip().splitlines() if l.strip()]


def main():
    if os.geteuid() != 0:
        print("skipped: setting the scene (a user, namespaces) needs root")
        return 77
    if subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True).returncode == 0:
        print("skipped: the system's python3 has torch here; the test needs one without")
        return 77
    scene = Scene(prefix="kit-no-download.")
    try:
        kit = os.path.join(scene.home, "kit")
        os.makedirs(kit)
        for f in ("kit", "requirements.txt"):
            shutil.copy2(os.path.join(ROOT, f), kit)
        shutil.copytree(os.path.join(ROOT, "sbatch"), os.path.join(kit, "sbatch"))
        scene.give_to_user()
        cases(scene)
    finally:
        scene.remove()
    return finish()


def cases(scene):
    with open(os.path.join(ROOT, "requirements.txt")) as f:
        pinned = [l.strip() for l in f if l.startswith("torch==")][0]

    rc, out = scene.as_user("", STUB + BUILD.format(env="PATH=$HOME/stub:$PATH"))
    lines = lines_of(out)
    expect(len(lines) == 3 and lines[1] == "rc=2" and lines[2] == "no-venv",
           "a login node (not root, sbatch on PATH): one line, exit 2, no .venv", out)
    first = lines[0] if lines else ""
    expect("looks like a cluster login node (not root, Slurm's sbatch on PATH)" in first
           and "'module spider PyTorch'" in first and "KIT_INSTALL_TORCH=1" in first,
           "... saying why, which module to load, and how to install anyway", out)

    rc, out = scene.as_user("", BUILD.format(env="KIT_SITE=jureca"))
    lines = lines_of(out)
    expect(len(lines) == 3 and lines[1] == "rc=2" and lines[2] == "no-venv"
           and "site profile jureca sourced" in lines[0]
           and "'module load Stages/2025 GCC OpenMPI PyTorch CMake'" in lines[0],
           "a site profile sourced (KIT_SITE=jureca): the profile's modules, in one line", out)

    rc, out = scene.as_user("", STUB + BUILD.format(env="PATH=$HOME/stub:$PATH KIT_INSTALL_TORCH=1"))
    lines = lines_of(out)
    expect(len(lines) == 3 and lines[1] == "rc=2" and lines[2] == "no-venv"
           and f"pip could not install {pinned}" in lines[0],
           "KIT_INSTALL_TORCH=1: it installs (pip tries the index, unreachable here)", out)

    # Root on a machine that is no login node: the pinned torch is installed as before.
    script = (f"ip link set lo up; cd {scene.home}/kit && env -i PATH=/usr/bin:/bin HOME={scene.home} "
              f"KIT_NO_INSTALL=1 KIT_BUILD_DIR={scene.work}/root-build ./kit build 2>&1 >/dev/null; "
              "echo rc=$?")
    run = subprocess.run(["unshare", "--net", "sh", "-c", script], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=600)
    lines = lines_of(run.stdout)
    expect(len(lines) == 2 and lines[1] == "rc=2" and f"pip could not install {pinned}" in lines[0],
           "as root (no login node): it installs, as before", run.stdout)


if __name__ == "__main__":
    sys.exit(main())
