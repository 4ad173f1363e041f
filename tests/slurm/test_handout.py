#!/usr/bin/env python3
"""The participant's handout (exercises/HANDOUT.md), every command of it, on the test cluster, as
an unprivileged user (`nobody`, a home of its own under /tmp: tests/cluster/scene.py), in a
reservation made on the cluster for that user.

As root: boots the test cluster (tests/slurm/cluster.sh, its configuration readable by the user),
creates the reservation `kit-course` for `nobody`, and makes a git repository of this checkout
for the user to clone. Then, as `nobody`, with torch given through PYTHONPATH as a site's module
gives it (the test cluster's GPUs are device files: KIT_ALLOW_CPU=1 stands for the CUDA torch a
real site's module brings):
  1. git clone; the generic site profile;
  2. sbatch/account.sh <project> <partition> --reservation kit-course (and one that does not
     exist: one line, exit 1, nothing saved); the profile then exports SBATCH_RESERVATION;
  3. ./kit check 00 on the exercise as shipped: it builds, runs, and fails TODO 1 first;
  4. sbatch sbatch/00-collectives/run.sbatch: the job runs in the reservation; its output is
     ex00-<job id>.out in the folder it was submitted from, with the reservation named and a
     line per rank; squeue --me;
  5. the stuck table: ./kit hint 00 1, ./kit stage 00 2, ./kit backups 00, ./kit restore 00,
     scancel of a held job;
  6. exercise 01 (stage 17: its job script finished): its program built, the data staged with
     download_wikitext2.sh (WIKITEXT2_URL: a file:// mirror of the build's corpus stands in for
     the network), run.sbatch submitted in the reservation and judged by ./kit check 01
     --job-output <job id>: the verdicts of a job in a reservation;
  7. the reservation deleted (it ended): sourcing the profile says so in one line and leaves it
     out; saving it again is refused.

usage: test_handout.py --build BUILD --python PYTHON  (PYTHON: one whose torch plays the site's
module; its site-packages go into PYTHONPATH. Root; exit 77, a skip, otherwise)
"""
import argparse
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
from checkout import copy_checkout  # noqa: E402
from verdict import expect, finish, root_test_args  # noqa: E402

USER = "nobody"
RESERVATION = "kit-course"
CLUSTER_SH = os.path.join(HERE, "cluster.sh")
# The exercise-01 job as small as the other Slurm tests run it (8 ranks share the cores).
QUICK = "--epochs 1 --max-steps 3 --d-model 32 --layers 1 --seq-len 16"


class Participant:
    """Runs shell scripts as USER in HOME/kit (after the clone), with the cluster's SLURM_CONF
    and torch through PYTHONPATH; the site profile is sourced first once the account is saved."""

    def __init__(self, home, conf, site, prebuilt):
        self.home, self.conf, self.site, self.prebuilt = home, conf, site, prebuilt
        self.profile = False
        self.ran = []  # every script run, for handout_commands()

    def run(self, script, timeout=600):
        self.ran.append(script)
        prelude = "cd ~/kit 2>/dev/null || cd ~; "
        if self.profile:
            prelude += ". sbatch/sites/generic.sh; "
        env = ["env", "-i", f"HOME={self.home}", "PATH=/usr/local/bin:/usr/bin:/bin",
               f"SLURM_CONF={self.conf}", f"PYTHONPATH={self.site}", "LANG=C.UTF-8", "KIT_JOBS=2",
               "KIT_ALLOW_CPU=1", "OMP_NUM_THREADS=1", "USER=" + USER,
               f"KIT_PREBUILT_COMMON={self.prebuilt}"]
        cmd = ["setpriv", f"--reuid={USER}", f"--regid={gid()}", "--clear-groups"] + env + \
              ["bash", "-c", prelude + script]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout, cwd="/")
        return p.returncode, p.stdout

    def wait(self, job, limit=300):
        """Until the job has left the queue (squeue --me, as the handout says)."""
        for _ in range(limit * 2):
            rc, out = self.run(f"squeue --me -h -j {job} -o %T 2>/dev/null")
            if not out.strip():
                return True
            time.sleep(0.5)
        return False


def handout_commands():
    """The participant's commands of exercises/HANDOUT.md (before its costs and the instructors'
    part, whose build cluster.prebuilt tests): each line of its sh blocks, and the commands quoted
    in its "stuck" table; each up to its first <placeholder>, `source` written as `.`."""
    text = open(os.path.join(ROOT, "exercises", "HANDOUT.md"), encoding="utf-8").read()
    text = text.split("## What it costs", 1)[0]
    lines = [l for b in re.findall(r"```sh\n(.*?)```", text, re.S) for l in b.splitlines()]
    stuck = text.split("## 5. When you are stuck", 1)[1].split("\n## ", 1)[0]
    lines += [c for c in re.findall(r"`([^`]+)`", stuck) if re.match(r"\./kit |scancel|squeue|sbatch", c)]
    out = []
    for line in lines:
        for cmd in line.split("#", 1)[0].split("&&"):
            cmd = re.sub(r"^source ", ". ", cmd.split("<", 1)[0].strip())
            if cmd:
                out.append(cmd)
    return out


def gid():
    return subprocess.run(["id", "-g", USER], capture_output=True, text=True).stdout.strip()


def root(*cmd, **kw):
    return subprocess.run(list(cmd), capture_output=True, text=True, **kw)


def main():
    a = root_test_args("--build", "--python", why="the test cluster and the user need root")
    site = subprocess.run([a.python, "-c", "import os, torch; print(os.path.dirname(os.path.dirname("
                           "torch.__file__)))"], capture_output=True, text=True).stdout.strip()
    if not site:
        print(f"FAIL {a.python} has no torch")
        return 1
    build = os.path.abspath(a.build)
    for f in ("bin/ddprun", "lib/libkit_common.so", "kit-common.stamp", "data/wikitext-2"):
        if not os.path.exists(os.path.join(build, f)):
            print(f"FAIL {build}/{f} is not built")
            return 1
    work = tempfile.mkdtemp(prefix="kit-handout.", dir="/tmp")
    os.chmod(work, 0o755)
    cluster = os.path.join(work, "cluster")
    home = os.path.join(work, "home")
    os.makedirs(home)
    rc = subprocess.run([CLUSTER_SH, "start", cluster]).returncode
    if rc != 0:
        print("FAIL the test cluster did not start")
        return 1
    opened = open_ancestors(site, build, ROOT)
    try:
        conf = os.path.join(cluster, "slurm.conf")
        for p in (cluster, conf, os.path.join(cluster, "gres.conf"), os.path.join(cluster, "cgroup.conf")):
            os.chmod(p, 0o755 if os.path.isdir(p) else 0o644)
        env = dict(os.environ, SLURM_CONF=conf)
        r = root("scontrol", "create", "reservation", f"reservationname={RESERVATION}",
                 f"users={USER}", "starttime=now", "duration=120", "nodes=ALL", env=env)
        expect(r.returncode == 0, f"the reservation {RESERVATION} is made", r.stdout + r.stderr)
        origin = os.path.join(work, "origin")
        make_origin(origin)
        subprocess.run(["chown", "-R", f"{USER}:{gid()}", home, origin], check=True)
        mirror = os.path.join(work, "mirror")  # the site's copy of WikiText-2: the build's corpus
        shutil.copytree(os.path.join(build, "data", "wikitext-2"), mirror)
        os.chmod(mirror, 0o755)
        me = Participant(home, conf, site, build)
        day(me, origin, env, mirror)
        missed = [c for c in handout_commands() if not any(c in script for script in me.ran)]
        expect(not missed, "every command of the handout was run above", missed)
    finally:
        subprocess.run([CLUSTER_SH, "stop", cluster])
        subprocess.run(["rm", "-rf", work])
        for folder, mode in reversed(opened):
            os.chmod(folder, mode)
    return finish()


def open_ancestors(*paths):
    """On a cluster the site's module tree and the instructor's prebuilt folder can be reached by
    every user. Here they lie in this checkout, which CI clones below a `mktemp -d` folder (mode
    700): each folder above them that others cannot pass through gets o+x (pass through, not
    list) for the test; [(folder, old mode)] for main() to put back."""
    opened = []
    for path in paths:
        folder = os.path.abspath(path)
        while folder != "/":
            mode = stat.S_IMODE(os.stat(folder).st_mode)
            if not mode & stat.S_IXOTH and folder not in [f for f, _ in opened]:
                os.chmod(folder, mode | stat.S_IXOTH)
                opened.append((folder, mode))
            folder = os.path.dirname(folder)
    return opened


def make_origin(origin):
    """The course's repository, as the instructor publishes it: this checkout, committed."""
    copy_checkout(ROOT, origin, untracked=True)
    git = ["git", "-C", origin, "-c", "user.name=kit", "-c", "user.email=kit@localhost"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the course"]):
        subprocess.run(git + cmd, check=True, capture_output=True)


def tokens(path):
    """Words plus one <eos> per line, as download_wikitext2.sh counts them."""
    with open(path) as f:
        return sum(len(line.split()) + 1 for line in f)


def day(me, origin, env, mirror):
    # 1. Clone; the environment (torch through PYTHONPATH, as a module gives it).
    rc, out = me.run(f"git clone -q {shlex.quote(origin)} kit && cd kit && ls kit")
    expect(rc == 0, "git clone", out)

    # 2. The account and the reservation, once; a reservation that does not exist is refused.
    rc, out = me.run("sbatch/account.sh course gpus --reservation nope-course")
    lines = [l for l in out.splitlines() if l.strip()]
    expect(rc == 1 and len(lines) == 1 and "reservation 'nope-course' does not exist" in out,
           "account.sh --reservation of one that does not exist: one line, exit 1", out)
    rc, out = me.run(f"sbatch/account.sh course gpus --reservation {RESERVATION}")
    expect(rc == 0 and f"reservation {RESERVATION}" in out, "account.sh saves the reservation", out)
    me.profile = True
    rc, out = me.run("echo \"$SBATCH_ACCOUNT $SBATCH_PARTITION $SBATCH_RESERVATION $SALLOC_RESERVATION\"")
    expect(out.strip() == f"course gpus {RESERVATION} {RESERVATION}",
           "the site profile passes account, partition and reservation to sbatch and salloc", out)

    # 3. ./kit check 00 on the exercise as shipped.
    rc, out = me.run("./kit check 00")
    expect(rc == 1 and "fix first: TODO 1" in out and "✘ TODO 1 " in out,
           "./kit check 00 builds and judges the shipped exercise (TODO 1 first)", out[-3000:])

    # 4. sbatch; squeue --me; the output where the handout says.
    rc, out = me.run("sbatch sbatch/00-collectives/run.sbatch")
    m = re.search(r"Submitted batch job (\d+)", out)
    expect(rc == 0 and m, "sbatch sbatch/00-collectives/run.sbatch", out)
    if m:
        job = m.group(1)
        rc, out = me.run("squeue --me")
        expect(rc == 0 and "JOBID" in out, "squeue --me", out)
        expect(me.wait(job), f"job {job} ends")
        rc, out = me.run(f"cat ex00-{job}.out; echo ---; cat ex00-{job}.err; echo ---; "
                         f"sort -s -k2,2n ex00-{job}.out | grep -c '^rank 0: after the barrier 1 of 1 ranks'; ls -d runs/ex00-{job}")
        expect(f"ex00: reservation: {RESERVATION}" in out,
               "the job ran in the reservation, and its .out says so", out)
        expect(re.search(r"---\n4\n", out) and f"runs/ex00-{job}" in out,
               "ex00-<job id>.out in the folder submitted from: 4 ranks (the shipped exercise: each "
               "alone), runs/ex00-<job id>/ beside it", out)

    # 5. When stuck.
    rc, out = me.run("./kit hint 00 1")
    expect(rc == 0 and out.strip(), "./kit hint 00 1", out)
    rc, out = me.run("./kit stage 00 2 && ./kit backups 00")
    expect(rc == 0 and "00-collectives" in out, "./kit stage 00 2 (yours saved: ./kit backups 00)", out)
    rc, out = me.run("./kit restore 00 && git diff --quiet exercises/00-collectives")
    expect(rc == 0, "./kit restore 00 brings back the participant's file (here: as shipped)", out)
    rc, out = me.run("sbatch --hold sbatch/00-collectives/run.sbatch")
    m = re.search(r"Submitted batch job (\d+)", out)
    expect(rc == 0 and m, "a job to stop", out)
    if m:
        rc, out = me.run(f"scancel {m.group(1)}")
        expect(rc == 0 and me.wait(m.group(1), 30), "scancel <job id> stops a job", out)

    # 6. Exercise 01: the program, the data once, the job in the reservation, --job-output.
    counts = " ".join(str(tokens(os.path.join(mirror, f"wiki.{s}.tokens"))) for s in ("train", "valid", "test"))
    rc, out = me.run("./kit stage 01 17 >/dev/null && cmake --build build --target ex01-exercise "
                     f">/dev/null && WIKITEXT2_URL=file://{mirror} WIKITEXT2_EXPECTED_TOKENS='{counts}' "
                     "common/data/download_wikitext2.sh ~/data/wikitext-2 && "
                     f"sbatch sbatch/01-transformer-lm-ddp/run.sbatch {QUICK}")
    m = re.search(r"Submitted batch job (\d+)", out)
    expect(rc == 0 and m, "exercise 01, stage 17: build, stage the data, sbatch run.sbatch", out[-2000:])
    if m:
        job = m.group(1)
        expect(me.wait(job, 600), f"job {job} ends")
        rc, out = me.run(f"./kit check 01 --job-output {job}")
        expect(rc == 0 and "✘" not in out and "✔ TODO 16" in out and "✔ TODO 17" in out,
               "./kit check 01 --job-output <job id>: a job in a reservation is judged as any", out)

    # 7. The reservation has ended: the profile says so, in one line, and leaves it out.
    r = root("scontrol", "delete", f"reservationname={RESERVATION}", env=env)
    expect(r.returncode == 0, "the reservation is deleted", r.stdout + r.stderr)
    me.profile = False
    rc, out = me.run(". sbatch/sites/generic.sh 2>/tmp/err.$$; echo \"[$SBATCH_RESERVATION]\"; "
                     "cat /tmp/err.$$; rm -f /tmp/err.$$")
    lines = [l for l in out.splitlines() if l.strip()]
    expect(len(lines) == 2 and lines[0] == "[]" and f"reservation '{RESERVATION}' does not exist"
           in lines[1], "after it ended: one line when the profile is sourced, no reservation "
           "passed on", out)


if __name__ == "__main__":
    sys.exit(main())
