#!/usr/bin/env python3
"""What one participant's first hour costs on a login node, measured: build time and disk use of
the kit, of one exercise and of one job's checkpoints, without and with a kit_common that the
instructor built once for the course (KIT_PREBUILT_COMMON, common/cmake/prebuilt.cmake).
Prints figures (a measurement, not a test); exercises/HANDOUT.md quotes a run of it.

As root it sets the login node's scene of tests/cluster/scene.py (the user `nobody`, a home of
its own under /tmp, no network, Gloo's headers hidden) and gives `python3` the torch of --site (a
site-packages folder, as a site's module does, through PYTHONPATH). Then, as that user:
  1. the instructor: a copy of the repository, `cmake -S . -B kit-build` and
     `cmake --build kit-build --target kit_common`; the folder is then made read-only;
  2. participant A, on its own: `./kit check 00` in a fresh build folder (configure, the kit,
     exercise 00, the check's runs), again (the runs alone), then exercise 01's programs
     (`cmake --build build --target ex01-exercise ex01-solution corpus`);
  3. participant B, the same with KIT_PREBUILT_COMMON=<the instructor's folder>;
  4. one job of exercise 01's solution (2 ranks, the bundled corpus, defaults, 1 epoch of 20
     steps): the size of its run folder (3 checkpoints kept, model-best.pt, model-final.pt).
Each step's wall time, its CPU time (user + system of every process of it) and the folders'
sizes are printed, with the machine's load.

usage: participant_cost.py --site SITE_PACKAGES [--jobs N]
"""
import argparse
import os
import resource
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
sys.path.insert(0, HERE)
from checkout import copy_checkout  # noqa: E402
from scene import Scene  # noqa: E402


def load():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def cpu_seconds():
    """User and system time of every process this one has waited for (the builds' compilers too):
    what a step costs in CPU, which the machine's other load does not inflate as it does the wall."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(scene, site, what, script):
    start, before, cpu = time.time(), load(), cpu_seconds()
    rc, out = scene.as_user(site, script)
    took = time.time() - start
    print(f"{what}: {took:.0f} s, CPU {cpu_seconds() - cpu:.0f} s (exit {rc}; load average {before} "
          f"-> {load()})", flush=True)
    if rc not in (0, 1):  # ./kit check exits 1 on the shipped exercise's failing TODOs
        print(out[-3000:])
        sys.exit(f"{what} failed")
    return took, out


def size_mib(path):
    out = subprocess.run(["du", "-sm", path], capture_output=True, text=True).stdout
    return int(out.split()[0]) if out else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--site", required=True, help="a site-packages folder with torch")
    ap.add_argument("--jobs", default="2", help="compile jobs (KIT_JOBS)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("skipped: setting the scene (a user, namespaces) needs root")
        return 77
    scene = Scene(prefix="kit-participant-cost.")
    try:
        run(scene, a.site, a.jobs)
    finally:
        scene.remove()
    return 0


def run(scene, site, jobs):
    for who in ("instructor", "a", "b"):
        copy_checkout(ROOT, os.path.join(scene.home, who, "kit"), untracked=True)
    scene.give_to_user()
    home = scene.home
    print(f"machine: {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, KIT_JOBS={jobs}; the "
          f"clone: {size_mib(os.path.join(home, 'a', 'kit'))} MiB", flush=True)
    prefix = "$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"
    instr = f"{home}/instructor/kit-build"
    env = f"export KIT_JOBS={jobs} HOME={home};"

    t, _ = timed(scene, site, "instructor: configure and build kit_common",
                 f"{env} cd {home}/instructor/kit && cmake -S . -B {instr} -DCMAKE_BUILD_TYPE=Release "
                 f"-DCMAKE_CXX_COMPILER=clang++ -DKIT_BUILD_TESTS=OFF -DCMAKE_PREFIX_PATH={prefix} "
                 f">/dev/null && cmake --build {instr} -j {jobs} --target kit_common corpus >/dev/null "
                 f"&& chmod -R a-w {instr}")
    print(f"  the instructor's folder: {size_mib(instr)} MiB", flush=True)

    for who, extra in (("a", ""), ("b", f"KIT_PREBUILT_COMMON={instr}")):
        kit = f"{home}/{who}/kit"
        first, _ = timed(scene, site, f"participant {who}{' (prebuilt kit)' if extra else ''}: "
                         "./kit check 00, first time",
                         f"{env} cd {kit} && {extra} ./kit check 00 >/dev/null 2>&1")
        runs, _ = timed(scene, site, f"participant {who}: ./kit check 00 again (the check's runs)",
                        f"{env} cd {kit} && {extra} ./kit check 00 >/dev/null 2>&1")
        print(f"  -> building for check 00: about {first - runs:.0f} s; build folder "
              f"{size_mib(kit + '/build')} MiB", flush=True)
        timed(scene, site, f"participant {who}: exercise 01's programs",
              f"{env} cd {kit} && cmake --build build -j {jobs} --target ex01-exercise "
              "ex01-solution corpus >/dev/null")
        print(f"  -> build folder {size_mib(kit + '/build')} MiB; the clone with it "
              f"{size_mib(kit)} MiB", flush=True)

    kit = f"{home}/a/kit"
    timed(scene, site, "one job of exercise 01's solution (2 ranks, 20 steps)",
          f"{env} cd {kit} && build/bin/ddprun --nproc-per-node 2 -- build/bin/ex01-solution "
          "--out-dir runs/job --epochs 1 --max-steps 20 >/dev/null 2>&1")
    out = f"{kit}/runs/job"
    ckpt = os.path.join(out, "checkpoints")
    one = sorted(os.listdir(ckpt))[-1] if os.path.isdir(ckpt) else None
    print(f"  -> run folder {size_mib(out)} MiB; one checkpoint "
          f"{size_mib(os.path.join(ckpt, one)) if one else 0} MiB ({one}); "
          f"model-final.pt {os.path.getsize(os.path.join(out, 'model-final.pt')) / 2**20:.1f} MiB",
          flush=True)
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
