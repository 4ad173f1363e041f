#!/usr/bin/env python3
"""The supported LibTorch range (common/README.md, "Building on a cluster"), checked when the kit is
configured: a LibTorch outside it stops `./kit build` with one line that names the version, the
range and the way out; -DKIT_ALLOW_UNTESTED_TORCH=ON turns the stop into a warning.

No real LibTorch is needed: a stand-in Torch package (a TorchConfig.cmake that claims a version)
is all the version check sees before it stops.

usage: test_torch_range.py --work DIR
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from verdict import expect, finish  # noqa: E402 (tests/support)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))




def fake_torch(prefix, version):
    d = os.path.join(prefix, "share", "cmake", "Torch")
    os.makedirs(d)
    with open(os.path.join(d, "TorchConfig.cmake"), "w") as f:
        f.write('set(Torch_FOUND TRUE)\nset(TORCH_LIBRARIES "")\nset(TORCH_INCLUDE_DIRS "")\n'
                'set(TORCH_INSTALL_PREFIX "${CMAKE_CURRENT_LIST_DIR}/../../..")\n')
    with open(os.path.join(d, "TorchConfigVersion.cmake"), "w") as f:
        f.write(f'set(PACKAGE_VERSION "{version}")\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    work = ap.parse_args().work
    shutil.rmtree(work, ignore_errors=True)
    env = dict(os.environ, KIT_NO_INSTALL="1")
    env.pop("Torch_DIR", None)
    with open(os.path.join(ROOT, "common", "cmake", "torch.cmake")) as f:
        text = f.read()
    oldest = re.search(r"set\(KIT_TORCH_OLDEST ([0-9.]+)\)", text).group(1)
    newest = re.search(r"set\(KIT_TORCH_NEWEST ([0-9.]+)\)", text).group(1)
    below = f"{oldest.split('.')[0]}.{int(oldest.split('.')[1]) - 1}.2"
    above = f"{newest.split('.')[0]}.{int(newest.split('.')[1]) + 1}.0"
    for version in ("1.13.1", below, above):
        prefix = os.path.join(work, version)
        fake_torch(prefix, version)
        run = subprocess.run([os.path.join(ROOT, "kit"), "build"], capture_output=True, text=True,
                             env=dict(env, CMAKE_PREFIX_PATH=prefix,
                                      KIT_BUILD_DIR=os.path.join(prefix, "build")), timeout=120)
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        detail = f"exit {run.returncode}, stderr:\n{run.stderr}"
        expect(run.returncode == 2, f"LibTorch {version}: ./kit build stops (exit 2)", detail)
        expect(len(lines) == 1 and f"LibTorch {version} is outside the supported range {oldest} "
               f"to {newest}" in lines[0] and "KIT_ALLOW_UNTESTED_TORCH" in lines[0],
               f"LibTorch {version}: one line with the version, the range and the way out", detail)
    # The way out: a warning instead of the stop (configuring may still fail later for other
    # reasons: the stand-in has no libraries; only the version check is judged here).
    prefix = os.path.join(work, "1.13.1")
    run = subprocess.run(["cmake", "-S", ROOT, "-B", os.path.join(work, "allowed"),
                          f"-DCMAKE_PREFIX_PATH={prefix}", "-DKIT_ALLOW_UNTESTED_TORCH=ON",
                          "-DKIT_BUILD_TESTS=OFF"], capture_output=True, text=True, env=env,
                         timeout=120)
    out = run.stdout + run.stderr
    expect("CMake Warning" in out and "outside the supported range" in out,
           "-DKIT_ALLOW_UNTESTED_TORCH=ON: the stop becomes a warning", out[-2000:])
    return finish()


if __name__ == "__main__":
    sys.exit(main())
