#!/usr/bin/env python3
"""Compile and link the kit, every exercise and every solution against one release of LibTorch,
from its pip wheel alone, without installing it: the check that the kit still builds with the
oldest and the newest PyTorch a site may have (common/README.md, "Building on a cluster").

Every torch wheel on the package index but one (2.13.0+cpu, which the suite runs) is a CUDA build
of several GB, and its CUDA libraries (another few GB) would be needed only to run it. So this
takes the wheel alone (`pip download --no-deps`), unpacks only its headers, libtorch_cpu and libc10,
and points the build at them through a small stand-in for the wheel's TorchConfig.cmake: the kit
is compiled as against a CPU LibTorch (the Gloo path, which `./kit check` runs on a login node),
and linked with the CUDA libraries that libtorch_cpu names left unresolved (they are not there;
nothing is run). The kit's CUDA-only code (compat.h's KIT_HAVE_NCCL branches) is compiled
against a full CUDA torch by `./kit cuda-build`, and run on a GPU by tests/gpu/run.sh.

usage: build_against_torch.py --torch VERSION --work DIR [--wheel FILE] [--no-cap] [--jobs N]
                              [--quick | --fetch-only]
  --torch VERSION   e.g. 2.4.1: downloaded from the package index into DIR/wheels (kept there)
  --wheel FILE      a wheel already on disk instead
  --no-cap          ignore the pip configuration of this machine (its cap on torch versions)
  --quick           kit_common, ddprun and every solution only, without optimisation (-O0): every
                    torch API the kit and its trainers call, compiled and linked, in about half
                    the CPU time (the exercises are the solutions less the TODOs' code, and the
                    benchmarks and data tools call what kit_common does); CI runs this, and the
                    whole build in its long run (tests/cluster/CMakeLists.txt)
  --fetch-only      download and unpack the wheel into DIR, build nothing: ./kit test does this
                    while the kit builds, so that cluster.torch_oldest's lane does not wait for
                    the package index
Prints one line per step and a last line "kit: LibTorch VERSION: ..." with what was built.
Exit status 0 when everything compiled and linked, 1 when the build failed, 2 when the wheel
could not be had.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "common", "tools"))
import kit_toml  # noqa: E402


def say(text):
    print(f"kit: {text}", flush=True)


def fail(text, code):
    print(f"kit: error: {text}", file=sys.stderr, flush=True)
    sys.exit(code)


def fetch_wheel(version, wheels, no_cap):
    os.makedirs(wheels, exist_ok=True)
    found = glob.glob(os.path.join(wheels, f"torch-{version}-*.whl"))
    if found:
        return found[0]
    env = dict(os.environ)
    if no_cap:
        env["PIP_CONFIG_FILE"] = os.devnull
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "-d", wheels, f"torch=={version}"]
    say(f"downloading torch {version} (the wheel alone, no CUDA libraries)")
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    found = glob.glob(os.path.join(wheels, f"torch-{version}-*.whl"))
    if run.returncode != 0 or not found:
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        fail(f"pip could not download torch=={version}: {last}", 2)
    return found[0]


def unpack(wheel, dest):
    """Headers, libtorch_cpu, libc10 (and the OpenMP runtime they need), version.py and the real
    TorchConfig.cmake (for its C++ ABI flag): about a third of the wheel."""
    keep = re.compile(r"^torch/(include/.*|lib/(libtorch_cpu|libc10|libgomp[^/]*)\.so[^/]*|"
                      r"version\.py|share/cmake/Torch/TorchConfig\.cmake)$")
    if os.path.isfile(os.path.join(dest, "torch", "version.py")):
        return os.path.join(dest, "torch")
    shutil.rmtree(dest, ignore_errors=True)
    with zipfile.ZipFile(wheel) as z:
        z.extractall(dest, [n for n in z.namelist() if keep.match(n)])
    return os.path.join(dest, "torch")


def stand_in_config(torch_dir, prefix):
    """<prefix>/share/cmake/Torch: a TorchConfig.cmake that offers libtorch_cpu and libc10 as the
    target `torch`, with the wheel's headers and C++ ABI, and the wheel's version."""
    with open(os.path.join(torch_dir, "version.py")) as f:
        version = re.search(r"__version__ = '([^'+]+)", f.read()).group(1)
    with open(os.path.join(torch_dir, "share", "cmake", "Torch", "TorchConfig.cmake")) as f:
        abi = re.search(r"_GLIBCXX_USE_CXX11_ABI=([01])", f.read())
    lib = os.path.join(torch_dir, "lib")
    inc = os.path.join(torch_dir, "include")
    d = os.path.join(prefix, "share", "cmake", "Torch")
    os.makedirs(d, exist_ok=True)
    flags = f"-D_GLIBCXX_USE_CXX11_ABI={abi.group(1)}" if abi else ""
    with open(os.path.join(d, "TorchConfig.cmake"), "w") as f:
        f.write(f"""# Stand-in written by tests/cluster/build_against_torch.py: torch {version}'s CPU part only.
set(TORCH_INSTALL_PREFIX "{torch_dir}")
set(TORCH_INCLUDE_DIRS "{inc}" "{inc}/torch/csrc/api/include")
set(TORCH_CXX_FLAGS "{flags}")
add_library(torch SHARED IMPORTED)
set_target_properties(torch PROPERTIES IMPORTED_LOCATION "{lib}/libtorch_cpu.so"
  INTERFACE_INCLUDE_DIRECTORIES "${{TORCH_INCLUDE_DIRS}}"
  INTERFACE_COMPILE_OPTIONS "${{TORCH_CXX_FLAGS}}"
  INTERFACE_LINK_LIBRARIES "{lib}/libc10.so")
set(TORCH_LIBRARIES torch)
set(Torch_FOUND TRUE)
""")
    with open(os.path.join(d, "TorchConfigVersion.cmake"), "w") as f:
        f.write(f'set(PACKAGE_VERSION "{version}")\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n')
    return version


def targets():
    """(exercise targets, solution targets) of every exercises/*/info.toml."""
    names = []
    for path in sorted(glob.glob(os.path.join(ROOT, "exercises", "*", "info.toml"))):
        with open(path, "rb") as f:
            names.append(kit_toml.load(f)["target"])
    return [f"{t}-exercise" for t in names], [f"{t}-solution" for t in names]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--torch", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--wheel")
    ap.add_argument("--no-cap", action="store_true")
    ap.add_argument("--jobs", type=int, default=min(os.cpu_count() or 2, 4))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--fetch-only", action="store_true")
    a = ap.parse_args()
    work = os.path.abspath(a.work)
    wheel = a.wheel or fetch_wheel(a.torch, os.path.join(work, "wheels"), a.no_cap)
    start = time.time()
    torch_dir = unpack(wheel, os.path.join(work, f"torch-{a.torch}"))
    if a.fetch_only:
        say(f"torch {a.torch}: the wheel and its unpacked headers and libraries are in {work}")
        return 0
    prefix = os.path.join(work, f"prefix-{a.torch}")
    version = stand_in_config(torch_dir, prefix)
    build = os.path.join(work, f"build-{a.torch}" + ("-quick" if a.quick else ""))
    shutil.rmtree(build, ignore_errors=True)
    cfg = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
           f"-DCMAKE_PREFIX_PATH={prefix}", "-DKIT_BUILD_TESTS=OFF", "-DKIT_BUILD_STAGES=OFF",
           # libtorch_cpu names CUDA libraries (its profiler's) that the wheel alone lacks
           "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--unresolved-symbols=ignore-in-shared-libs"]
    if shutil.which("clang++"):
        cfg.append("-DCMAKE_CXX_COMPILER=clang++")
    exercises, solutions = targets()
    build_cmd = ["cmake", "--build", build, "-j", str(a.jobs)]
    if a.quick:  # the optimiser is a quarter of a trainer's compile and checks no API
        cfg.append("-DCMAKE_CXX_FLAGS_RELEASE=-O0 -DNDEBUG")
        build_cmd += ["--target", "ddprun"] + solutions
    env = dict(os.environ)
    env.pop("CMAKE_PREFIX_PATH", None)
    env.pop("Torch_DIR", None)
    os.makedirs(build)
    log = os.path.join(build, "build.log")
    with open(log, "w") as out:
        rc = subprocess.run(cfg, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
        if rc == 0:
            what = "kit_common, ddprun and the solutions, -O0" if a.quick else "everything"
            say(f"compiling against torch {version} in {build} ({what}; {a.jobs} jobs; log: "
                f"{log})")
            rc = subprocess.run(build_cmd, stdout=out, stderr=subprocess.STDOUT,
                                env=env).returncode
    if rc != 0:
        with open(log) as f:
            errors = [line.rstrip() for line in f if "error" in line]
        print("\n".join(errors[:20]), file=sys.stderr)
        fail(f"the kit does not build against torch {version} (log: {log})", 1)
    wanted = ([] if a.quick else exercises) + solutions + ["ddprun"]
    missing = [t for t in wanted if not os.path.isfile(os.path.join(build, "bin", t))]
    if missing:
        fail(f"built against torch {version}, but {', '.join(missing)} missing in {build}/bin", 1)
    what = (f"kit_common, {len(solutions)} solutions and ddprun compiled (-O0) and linked"
            if a.quick else f"the kit, {len(exercises)} exercises, {len(solutions)} solutions and "
            "ddprun compiled and linked")
    say(f"LibTorch {version}: {what} in {time.time() - start:.0f} s (the CPU and Gloo path)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
