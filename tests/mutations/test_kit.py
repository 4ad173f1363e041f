#!/usr/bin/env python3
"""./kit's student commands on a temporary copy of the repository (never on the real exercises/):
list, hint, diff, stage, reset, restore, backups, and check's handling of a file that does not
compile (with a stand-in `cmake` that prints a real-looking compiler error, so no build is
needed; the real compiler's errors are tested by the compile mutants).

  * stage -> backup -> restore (and reset, and restore of any backup) loses nothing: contents
    and file modes come back byte for byte;
  * every refused command (unknown exercise, stage out of range, unknown TODO, no such backup,
    a file that does not compile) exits non-zero with one clear line and changes no file;
  * list counts TODOs by behaviour when check has judged this very file, else from the source.

usage: test_kit.py --work DIR
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from verdict import expect, failures, finish  # noqa: E402 (tests/support)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EX = "01-transformer-lm-ddp"
CPP = f"exercises/{EX}/train.cpp"
SBATCH = f"sbatch/{EX}/run.sbatch"




class Repo:
    def __init__(self, work):
        self.dir = os.path.join(work, "repo")
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(self.dir)
        for name in ("kit", "common", "exercises", "solutions", "sbatch"):
            src = os.path.join(ROOT, name)
            if os.path.isdir(src):
                shutil.copytree(src, os.path.join(self.dir, name), symlinks=True,
                                ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(src, os.path.join(self.dir, name))
        # A LibTorch is named so that the copy's ./kit does not make a .venv of its own; the
        # commands tested here never configure for real (kit check runs a stand-in cmake).
        self.env = dict(os.environ, KIT_NO_INSTALL="1", KIT_BUILD_DIR=os.path.join(work, "build"),
                        LC_ALL="C.UTF-8",
                        CMAKE_PREFIX_PATH=os.environ.get("CMAKE_PREFIX_PATH", "/nonexistent"))
        self.files = [f["exercise"] for f in self.info()["files"]]

    def info(self):
        out = subprocess.run([sys.executable, os.path.join(self.dir, "common/tools/stages.py"),
                              "info", EX], capture_output=True, text=True, check=True).stdout
        return json.loads(out)

    def kit(self, *args, env=None):
        p = subprocess.run([os.path.join(self.dir, "kit")] + list(args), cwd=self.dir,
                           capture_output=True, text=True, env=env or self.env)
        return p.returncode, p.stdout, p.stderr

    def path(self, rel):
        return os.path.join(self.dir, rel)

    def snapshot(self):
        """{path: (bytes, mode)} of the student's files."""
        out = {}
        for rel in self.files:
            with open(self.path(rel), "rb") as f:
                out[rel] = (f.read(), stat.S_IMODE(os.stat(self.path(rel)).st_mode))
        return out

    def digest(self):
        """Every file of the copy (the .kit state folder included)."""
        h = hashlib.sha256()
        for base, dirs, files in os.walk(self.dir):
            dirs.sort()
            for name in sorted(files):
                p = os.path.join(base, name)
                if "__pycache__" in p:
                    continue
                h.update(os.path.relpath(p, self.dir).encode())
                h.update(open(p, "rb").read())
                h.update(str(stat.S_IMODE(os.stat(p).st_mode)).encode())
        return h.hexdigest()

    def stage(self, k):
        """{path: text} of stage k, rendered by stages.py directly."""
        tmp = os.path.join(os.path.dirname(self.dir), f"render-{k}")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([sys.executable, self.path("common/tools/stages.py"), "stage", EX, str(k),
                        tmp], check=True)
        return {rel: open(os.path.join(tmp, os.path.basename(rel)), "rb").read()
                for rel in self.files}

    def write(self, rel, data):
        with open(self.path(rel), "wb") as f:
            f.write(data)


def test_refusals(repo):
    before = repo.digest()
    cases = [("list", "extra"), ("hint", "99", "1"), ("hint", "01", "99"), ("hint", "01"),
             ("diff", "99"), ("diff", "01", "18"), ("diff", "01", "-1"),
             ("stage", "99", "3"), ("stage", "01", "18"), ("stage", "01", "-1"),
             ("stage", "01", "x"), ("stage", "01", "2-3"), ("stage", "01"), ("stage",),
             ("reset", "99"), ("reset",), ("restore", "99"), ("restore", "01"),
             ("backups", "99"), ("check", "99"), ("check",), ("frobnicate",), (),
             ("watch",), ("watch", "99"), ("watch", "01", "extra"), ("diff", "01", "--bogus")]
    for args in cases:
        rc, out, err = repo.kit(*args)
        line = err.strip().splitlines()[-1] if err.strip() else ""
        expect(rc == 2 and line.startswith("kit: error: ") and not out.strip(),
               f"kit {' '.join(args)}: refused with exit 2 and one error line ({rc}: {line})")
    expect(repo.digest() == before, "the refused commands changed no file (nor made .kit/)")
    rc, out, _ = repo.kit("--help")
    expect(rc == 0 and all(c in out for c in ("list", "check", "hint", "diff", "stage", "reset",
                                                "restore", "backups")), "--help names every command")


def test_closed_pipe(repo):
    """`./kit list | head -1` once head has gone: kit's output goes to a pipe that nobody reads.
    kit must end without a Python traceback (a command that only prints dies of SIGPIPE, as any
    Unix tool would). The pipe is closed before kit starts, so that its very first write fails."""
    r, w = os.pipe()
    os.close(r)
    p = subprocess.run([os.path.join(repo.dir, "kit"), "list"], cwd=repo.dir, env=repo.env,
                       stdout=w, stderr=subprocess.PIPE, timeout=60)
    os.close(w)
    err = p.stderr.decode()
    expect(p.returncode != 0 and "Traceback" not in err and "BrokenPipe" not in err,
           f"kit list into a closed pipe: no traceback (exit {p.returncode}, stderr: {err.strip()[-300:]!r})")


def test_round_trip(repo):
    shipped = repo.snapshot()
    expect(shipped == {rel: (repo.stage(0)[rel], shipped[rel][1]) for rel in repo.files},
           "the copy's exercise files are stage 0")
    # The student has worked: an edit in each file, and a mode of their own on the job script.
    mine = dict(shipped)
    repo.write(CPP, shipped[CPP][0].replace(b"// TODO 1:", b"#include \"kit/ddp/ddp.h\"  // mine\n// TODO 1:")
               + b"// a note of mine, without a final newline")
    repo.write(SBATCH, shipped[SBATCH][0] + b"# my own line\n")
    os.chmod(repo.path(SBATCH), 0o750)
    mine = repo.snapshot()

    rc, out, err = repo.kit("stage", "01", "5")
    stage5 = repo.stage(5)
    expect(rc == 0 and all(repo.snapshot()[rel][0] == stage5[rel] for rel in repo.files),
           f"kit stage 01 5: both files are stage 5 ({rc} {err.strip()})")
    expect("backup 1" in out, "kit stage names the backup it made")
    expect(stat.S_IMODE(os.stat(repo.path(SBATCH)).st_mode) == 0o750,
           "kit stage keeps the job script's mode")
    rc, out, _ = repo.kit("list")
    expect(rc == 0 and f"{CPP}: 5 of 13 TODOs done, next: TODO 6" in out and
           f"{SBATCH}: 0 of 4 TODOs done, next: TODO 14" in out and "estimated from the source" in out,
           "kit list after stage 5: 5 of 13 and 0 of 4, estimated from the source")
    rc, out, _ = repo.kit("diff", "01")
    expect(rc == 0 and "against stage 6 (next: TODO 6" in out and
           "+  Loader val_loader(val_data, args.eval_batch_size, val_sampler);" in out,
           "kit diff 01 shows what TODO 6 adds")
    rc, out, _ = repo.kit("diff", "01", "5")
    expect(rc == 0 and out.count("identical: this file is stage 5") == 2, "kit diff 01 5: identical")
    before = repo.digest()
    rc, out, _ = repo.kit("stage", "01", "5")
    expect(rc == 0 and "nothing to do" in out and repo.digest() == before,
           "kit stage 01 5 again: nothing to do, no new backup")

    rc, out, err = repo.kit("restore", "01")
    expect(rc == 0 and repo.snapshot() == mine,
           f"kit restore 01: the student's files are back, byte for byte, modes too ({err.strip()})")
    rc, out, _ = repo.kit("stage", "01", "17")
    rc2, lst, _ = repo.kit("list")
    expect(rc == 0 and f"{CPP}: 13 of 13 TODOs done" in lst and f"{SBATCH}: 4 of 4 TODOs done" in lst,
           "kit stage 01 17: every TODO of both files done")
    rc, out, _ = repo.kit("reset", "01")
    expect(rc == 0 and {r: v[0] for r, v in repo.snapshot().items()} ==
           {r: v[0] for r, v in shipped.items()}, "kit reset 01: the exercise as shipped")
    rc, out, _ = repo.kit("backups", "01")
    expect(rc == 0 and len([l for l in out.splitlines() if l.strip()]) >= 4,
           "kit backups 01 lists every backup")
    # Every version the student's files ever had is in a backup: restore each one in turn.
    backups_dir = repo.path(f".kit/backups/{EX}")
    versions = []
    for n in sorted(int(d) for d in os.listdir(backups_dir) if d.isdigit()):
        rc, _, err = repo.kit("restore", "01", str(n))
        versions.append(repo.snapshot())
        expect(rc == 0, f"kit restore 01 {n} ({err.strip()})")
    expect(mine in versions, "the student's own version survived stage, restore, stage, reset")
    expect(any(v[CPP][0] == repo.stage(17)[CPP] for v in versions), "so did stage 17")
    rc, _, _ = repo.kit("restore", "01", "1")
    expect(repo.snapshot() == mine, "kit restore 01 1 brings back the very first backup")


def test_list_methods(repo):
    sys.path.insert(0, repo.path("common/tools"))
    import check  # the recorder that `kit check` uses
    repo.kit("stage", "01", "8")
    # A student who leaves the TODO comments in: TODO 8 stays counted as done.
    text = repo.snapshot()[CPP][0]
    text = text.replace(b"  kit::DistributedDataParallel ddp(model);",
                        b"  // TODO 8: Wrap the model in kit::DistributedDataParallel.\n"
                        b"  kit::DistributedDataParallel ddp(model);")
    # A student who deleted TODO 11's comment but kept its std::printf: not done.
    stage0 = repo.stage(0)[CPP]
    repo.write(CPP, text)
    rc, out, _ = repo.kit("list")
    expect(f"{CPP}: 8 of 13 TODOs done, next: TODO 9" in out,
           "a TODO comment left above solved code does not hide the TODO")
    lines = stage0.decode().splitlines(True)
    at = next(i for i, l in enumerate(lines) if "// TODO 11:" in l)
    while lines[at].lstrip().startswith("//"):
        del lines[at]
    repo.write(CPP, "".join(lines).encode())
    rc, out, _ = repo.kit("list")
    expect(f"{CPP}: 0 of 13 TODOs done" in out, "a TODO comment removed over unsolved code is "
           "not counted as done")
    # After `kit check`: the verdicts for this very content of the file, by behaviour.
    repo.kit("stage", "01", "8")
    v = check.Verdicts()
    for label in ("1", "2-3", "4", "5", "6", "7", "8"):
        v.add(label, True, "")
    for label in ("9", "10", "11", "12", "13", "all"):
        v.add(label, label == "12", "")
    os.makedirs(repo.path(".kit/check"), exist_ok=True)
    check.record(repo.path(f".kit/check/{EX}.json"), EX, repo.path(CPP), v)
    rc, out, _ = repo.kit("list")
    expect(f"{CPP}: 9 of 13 TODOs done, next: TODO 9" in out and "by behaviour" in out,
           "kit list uses the last check's verdicts for the same file")
    # A TODO with no verdict (judged only on a GPU, or not reached) is counted from the source:
    # stage 8's TODO 8 is done there.
    nv = check.Verdicts()
    for label in ("1", "2-3", "4", "5", "6", "7"):
        nv.add(label, True, "")
    nv.unreached("9", "", "the run stopped before it")
    check.record(repo.path(f".kit/check/{EX}.json"), EX, repo.path(CPP), nv)
    rc, out, _ = repo.kit("list")
    expect(f"{CPP}: 8 of 13 TODOs done, next: TODO 9" in out and "by behaviour" in out,
           f"a TODO the check gave no verdict counts as the source says ({out.strip()})")
    check.record(repo.path(f".kit/check/{EX}.json"), EX, repo.path(CPP), v)
    repo.write(CPP, repo.snapshot()[CPP][0] + b"// edited after the check\n")
    rc, out, _ = repo.kit("list")
    expect(f"{CPP}: 8 of 13 TODOs done" in out and "estimated from the source" in out,
           "an edit after the check falls back to the source estimate")
    # After `kit check --job`: the job script's verdicts, kept next to the trainer's. Stage 8's
    # job script is the shipped one; the recorded verdicts (15 and 17 passed) differ from the
    # source estimate (0 of 4), so the line shows which one kit list used.
    from checklib import job as jobcheck
    jv = check.Verdicts()
    for label in ("14", "15", "16", "17", "all"):
        jv.add(label, label in ("15", "17", "all"), "")
    jobcheck.record_job(repo.path(f".kit/check/{EX}.json"), EX, repo.path(SBATCH), jv)
    rc, out, _ = repo.kit("list")
    expect(f"{SBATCH}: 2 of 4 TODOs done, next: TODO 14" in out and "--job of this file" in out,
           "kit list counts the job script's TODOs by behaviour after check --job")
    check.record(repo.path(f".kit/check/{EX}.json"), EX, repo.path(CPP), v)
    rc, out, _ = repo.kit("list")
    expect(f"{SBATCH}: 2 of 4 TODOs done" in out,
           "a later check of the trainer keeps the job script's verdicts")
    repo.write(SBATCH, repo.snapshot()[SBATCH][0] + b"# edited after the check\n")
    rc, out, _ = repo.kit("list")
    expect(f"{SBATCH}: 0 of 4 TODOs done" in out and "--job judges by behaviour" in out,
           "an edit of the job script after check --job falls back to the source estimate")


def test_check_does_not_compile(repo, work):
    repo.kit("stage", "01", "5")
    lines = repo.snapshot()[CPP][0].decode().splitlines(True)
    lines = [l for l in lines if "kit::DistributedSampler train_sampler" not in l]
    repo.write(CPP, "".join(lines).encode())
    use = next(i for i, l in enumerate(lines, 1)
               if re.search(r"\btrain_sampler[,)]", l) and not l.lstrip().startswith("//"))
    col = lines[use - 1].index("train_sampler") + 1
    src = repo.path(CPP)
    error = (f"[ 50%] Building CXX object CMakeFiles/ex01-exercise.dir/{CPP}.o\n"
             f"{src}: In function \u2018int main(int, char**)\u2019:\n"
             f"{src}:{use}:{col}: error: \u2018train_sampler\u2019 was not declared in this scope; "
             "did you mean \u2018val_sampler\u2019?\n"
             f"  {use} | {lines[use - 1].rstrip()}\n"
             "      |                                                   ^~~~~~~~~~~~~\n"
             "make[2]: *** [CMakeFiles/ex01-exercise.dir/build.make:76] Error 1\n")
    fake, log = stand_in_cmake(work, error)
    env = dict(repo.env, PATH=fake + os.pathsep + os.environ["PATH"], FAKE_LOG=log)
    before = repo.digest()
    rc, out, err = repo.kit("check", "01", env=env)
    expect(rc == 1, f"kit check on a file that does not compile exits 1 ({rc})")
    expect("was not declared" in out, "it shows the compiler's error")
    expect("\u2718 TODO 4 " in out and "failed: 4" in out,
           "it names TODO 4, which declares train_sampler (the error is in TODO 5's line)")
    expect("does not compile" in err, "and says so in its last line")
    expect(repo.digest() == before, "and changes no file (no check record either)")
    print(out + err)
    # An error that is not in the student's file (a broken kit) is not blamed on a TODO.
    header = repo.path("common/kit/ddp/ddp.h")
    with open(log, "w") as f:
        f.write(f"{header}:30:5: error: \u2018frob\u2019 does not name a type\n"
                "   30 |     frob x;\n      |     ^~~~\n")
    rc, out, err = repo.kit("check", "01", env=env)
    expect(rc == 1 and "not in" in out and "failed: build" in out and "\u2718 TODO" not in out,
           "an error in a kit header is reported as not in the student's file")
    expect(repo.digest() == before, "and changes no file either")


def stand_in_cmake(work, log_text):
    """A PATH folder whose `cmake` configures fine and fails every build with log_text."""
    log = os.path.join(work, "fake-build.log")
    with open(log, "w") as f:
        f.write(log_text)
    fake = os.path.join(work, "fakebin")
    os.makedirs(fake, exist_ok=True)
    with open(os.path.join(fake, "cmake"), "w") as f:
        f.write('#!/bin/sh\n# A stand-in for cmake: configuring works, building fails.\n'
                'case " $* " in *" --build "*) cat "$FAKE_LOG"; exit 2 ;; esac\nexit 0\n')
    os.chmod(os.path.join(fake, "cmake"), 0o755)
    return fake, log


def wait_for(path, text, count, seconds):
    """Waits until `text` occurs `count` times in the file at path; returns its content."""
    deadline = time.monotonic() + seconds
    while True:
        out = open(path, encoding="utf-8", errors="replace").read()
        if out.count(text) >= count or time.monotonic() > deadline:
            return out
        time.sleep(0.1)


def test_watch(repo, work):
    """./kit watch 01 runs the real ./kit check at start and after each save, and not otherwise;
    SIGINT ends it with exit 0 and no traceback. The stand-in cmake makes every check a quick
    "does not compile", so no build is needed."""
    repo.kit("reset", "01")
    fake, log = stand_in_cmake(work, f"{repo.path(CPP)}:3:1: error: expected ';' after top level "
                                     "declarator\n")
    env = dict(repo.env, PATH=fake + os.pathsep + os.environ["PATH"], FAKE_LOG=log)
    out_path = os.path.join(work, "watch.out")
    waiting = "waiting for you to save"
    with open(out_path, "w") as out:
        p = subprocess.Popen([repo.path("kit"), "watch", "01"], cwd=repo.dir, env=env,
                             stdout=out, stderr=subprocess.STDOUT)
    try:
        text = wait_for(out_path, waiting, 1, 60)
        expect(text.count("kit watch: check #") == 1 and "does not compile" in text,
               "kit watch 01: runs the check once at start (the real ./kit check)")
        time.sleep(2.5)  # more than two polls, no save: no new check
        text = open(out_path, encoding="utf-8").read()
        expect(text.count("kit watch: check #") == 1, "no save, no new check")
        with open(repo.path(CPP), "ab") as f:
            f.write(b"// saved by the student\n")
        text = wait_for(out_path, waiting, 2, 60)
        expect(text.count("kit watch: check #") == 2 and "changed" in text and
               text.count("kit watch: exit 1;") == 2,
               "a save runs the check again, once")
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    text = open(out_path, encoding="utf-8").read()
    expect(rc == 0 and "kit watch: stopped" in text and "Traceback" not in text,
           f"SIGINT ends kit watch cleanly, exit 0 ({rc})")
    if failures:
        print(text)


def test_diff_solution(repo):
    repo.kit("stage", "01", "5")
    rc, out, _ = repo.kit("diff", "01", "--solution")
    expect(rc == 0 and "against stage 17 (the solution" in out and
           "+  kit::DistributedDataParallel ddp(model);" in out,
           "kit diff 01 --solution: what the solution has that stage 5 lacks")
    repo.kit("stage", "01", "17")
    rc, out, _ = repo.kit("diff", "01", "--solution")
    expect(rc == 0 and out.count("identical: this file is stage 17") == 2,
           "kit diff 01 --solution after stage 17: identical")


def test_job_refusals(repo, work):
    """./kit check 01 --job without Slurm, or without root: one line, exit 2, before any build
    (the stand-in cmake would fail a build loudly). Without Slurm, as root, the one command
    installs it: it sets the test cluster up (tests/slurm/cluster.sh setup, which installs
    Debian's Slurm; a stand-in here that records the call and fails)."""
    fake, log = stand_in_cmake(work, "a build was started\n")
    no_sbin = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if "sbin" not in d)
    env = dict(repo.env, PATH=fake + os.pathsep + no_sbin, FAKE_LOG=log)
    cluster = "tests/slurm/cluster.sh"
    called = os.path.join(work, "cluster-calls")
    os.makedirs(os.path.dirname(repo.path(cluster)), exist_ok=True)  # the copy has no tests/
    repo.write(cluster, f'#!/bin/sh\n# A stand-in: records the call, cannot set anything up.\n'
                        f'echo "$@" >> {called}\nexit 1\n'.encode())
    os.chmod(repo.path(cluster), 0o755)
    try:
        rc, out, err = repo.kit("check", "01", "--job", env=env)
    finally:
        shutil.rmtree(repo.path("tests"))
    calls = open(called).read().split() if os.path.exists(called) else []
    expect(rc == 2 and len(err.strip().splitlines()) == 1 and "cluster" in err and not out.strip()
           and calls == ["setup"],
           f"check --job without slurmctld/slurmd, as root: sets the test cluster up (which "
           f"installs Slurm) before any build; one line, exit 2 ({rc}: {err.strip()}; {calls})")
    with open(os.path.join(fake, "id"), "w") as f:
        f.write('#!/bin/sh\n# A stand-in for id: an ordinary user.\n'
                '[ "$1" = -u ] && echo 1000 || exec /usr/bin/id "$@"\n')
    os.chmod(os.path.join(fake, "id"), 0o755)
    env = dict(env, PATH=fake + os.pathsep + os.environ["PATH"])
    rc, out, err = repo.kit("check", "01", "--job", env=env)
    expect(rc == 2 and len(err.strip().splitlines()) == 1 and "root" in err and not out.strip()
           and "sudo ./kit check 01 --job" in err,
           f"check --job as an ordinary user: one line naming the one command, exit 2 ({rc}: "
           f"{err.strip()})")


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    a = ap.parse_args(argv)
    repo = Repo(os.path.abspath(a.work))
    test_refusals(repo)
    test_round_trip(repo)
    test_list_methods(repo)
    test_closed_pipe(repo)
    test_check_does_not_compile(repo, os.path.abspath(a.work))
    test_diff_solution(repo)
    test_watch(repo, os.path.abspath(a.work))
    test_job_refusals(repo, os.path.abspath(a.work))
    return finish()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
