#!/usr/bin/env python3
"""A participant's first morning on a login node, simulated: the kit must build and `./kit check`
must run from a fresh copy of the repository as an unprivileged user, with no package
installed for it, the system's Gloo headers out of sight, no network at all, and a torch other
than the pinned one already imported by the `python3` on PATH (a site module or the user's venv).

What it does, as root (it needs root to set the scene; exit 77, a skip, otherwise):
  1. copies the repository as git would clone it (tracked and untracked-not-ignored files) into
     WORK/home/kit, owned by the user `nobody`;
  2. in a new mount and network namespace: hides /usr/include/gloo behind an empty folder, brings
     up loopback only (no route to anything, the package index included), and drops to `nobody`,
     with PYTHON's folder first on PATH;
  3. as that user: `./kit demo --epochs 1 --max-steps 3` (build, then 2 ranks on Gloo), then
     `./kit stage NN LAST` and `./kit check NN` for exercises 00 and 01 (the finished exercise
     must pass every TODO).
Each step must succeed, say which torch it built against and how it got Gloo's headers, and
nothing may ask for root (no apt-get, no sudo) or the network.

The torch is given the way a site's PyTorch module gives it: PYTHONPATH names its site-packages
(here the site-packages of VENV: the CUDA torch that ./kit cuda-build puts in .venv-cuda), for
the system's python3.

usage: login_node.py --venv VENV --work DIR
"""
import glob
import json
import os
import pwd
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
from checkout import copy_checkout  # noqa: E402
from verdict import expect, finish, root_test_args  # noqa: E402

USER = "nobody"


def as_user(work, site, script):
    """Run a shell script as USER in the login node's scene; (exit code, output)."""
    home = os.path.join(work, "home")
    path = "/usr/local/bin:/usr/bin:/bin"
    hide = "/usr/include/gloo"
    scene = f"""set -e
ip link set lo up
if [ -d {hide} ]; then mount --bind {work}/empty {hide}; fi
exec setpriv --reuid={USER} --regid=$(id -g {USER}) --clear-groups \
  env -i HOME={home} PATH={path} ${{site:+PYTHONPATH=$site}} LANG=C.UTF-8 KIT_JOBS=2 sh -c "$1"
"""
    run = subprocess.run(["unshare", "--mount", "--net", "env", f"site={site}", "sh", "-c", scene,
                          "scene", script],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=1500)
    return run.returncode, run.stdout


def main():
    a = root_test_args("--venv", "--work", why="setting the scene (a user, namespaces) needs root")
    sites = glob.glob(os.path.join(os.path.abspath(a.venv), "lib", "python3*", "site-packages"))
    if not sites or not os.path.isdir(os.path.join(sites[0], "torch")):
        print(f"FAIL no torch in {a.venv} (./kit cuda-build makes .venv-cuda, the torch used here)")
        return 1
    site = sites[0]
    version = subprocess.run(["/usr/bin/python3", "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=site)).stdout.strip()
    with open(os.path.join(ROOT, "requirements.txt")) as f:
        pinned = [line.split("==")[1].strip() for line in f if line.startswith("torch==")][0]
    expect(version and not version.startswith(pinned), f"the user's torch ({version}) is not the "
           f"pinned {pinned}")

    work = os.path.abspath(a.work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "empty"))
    kit = os.path.join(work, "home", "kit")
    copy_checkout(ROOT, kit, untracked=True)  # as a clone would have it, work in progress too
    user = pwd.getpwnam(USER)
    for d, _, names in os.walk(os.path.join(work, "home")):
        for p in [d] + [os.path.join(d, n) for n in names]:
            os.lchown(p, user.pw_uid, user.pw_gid)

    # The scene itself: gloo hidden, no network, not root.
    rc, out = as_user(work, site, "id -u; ls /usr/include/gloo | wc -l; "
                      "python3 -c 'import socket; socket.create_connection((\"pypi.org\", 443), 3)' "
                      "2>&1 | tail -n 1")
    lines = out.splitlines()
    expect(rc == 0 and len(lines) >= 3 and lines[0] != "0", "the steps run as a user, not root", out)
    expect(len(lines) >= 2 and lines[1].strip() == "0", "the system's Gloo headers are hidden", out)
    expect(len(lines) >= 3 and "rror" in lines[2], "the network cannot be reached", out)

    rc, out = as_user(work, site, "cd ~/kit && ./kit demo --epochs 1 --max-steps 3")
    expect(rc == 0, "./kit demo builds and trains on 2 ranks", out)
    expect(f"LibTorch {version} from the torch that" in out,
           "it says it builds against the torch that python3 imports", out)
    expect("Gloo headers: none needed" in out, "it says how it gets by without Gloo's headers", out)
    expect("final test loss" in out, "the training reaches its end", out)
    expect("apt-get" not in out and "sudo" not in out, "nothing asked for root", out)

    # Bad input: a python3 without torch and no network. One line that names the fix, exit 2,
    # and no half-made .venv left behind.
    rc, out = as_user(work, "", "cd ~/kit && KIT_BUILD_DIR=$HOME/build-none ./kit build 2>&1 >/dev/null; "
                      "echo rc=$?; ls -d .venv 2>/dev/null || echo no-venv")
    lines = out.strip().splitlines()
    expect(len(lines) == 3 and lines[1] == "rc=2" and lines[2] == "no-venv"
           and "load the site's PyTorch module" in lines[0],
           "no torch and no network: one error line naming the fix, exit 2, no .venv left", out)

    # ./kit check on the finished exercises 00 (collectives) and 01 (the flagship: the trainer
    # built against the CUDA torch, run on the CPU with Gloo, judged TODO by TODO).
    for ex, name in (("00", "00-collectives"), ("01", "01-transformer-lm-ddp")):
        todos = subprocess.run([sys.executable, os.path.join(ROOT, "common", "tools", "stages.py"),
                                "todos", name, "--json"], capture_output=True, text=True,
                               check=True).stdout
        last = max(int(str(t["todo"]).split("-")[-1]) for t in json.loads(todos))
        rc, out = as_user(work, site, f"cd ~/kit && ./kit stage {ex} {last} && ./kit check {ex}")
        expect(rc == 0, f"./kit check {ex} passes the finished exercise (stage {last}) on the "
               "login node", out)
        expect("✘" not in out and "✔" in out, f"{ex}: no TODO is judged ✘", out)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
