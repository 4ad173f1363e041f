"""`kit check EXERCISE --job`: the exercise's job script on the throw-away two-node Slurm of
tests/slurm/cluster.sh, judged by what the jobs did, never by the script's text. This file runs
the jobs and fills one record (job_judge.Job) per job; job_judge.py judges them, the same code
that judges a real cluster's job from what it left (`--job-output`, job_output.py).

Two jobs run, one after the other, each with the solution's trainer (so only the job script is
judged) behind a small wrapper:

  * "as written": sbatch SCRIPT, with the script's own #SBATCH lines;
  * "reshaped":   sbatch --nodes=2 --gres=gpu:2 SCRIPT. A job script must follow its allocation
                  (sbatch/README.md: only --nodes and --gres change), and on the real shape alone a
                  script with one GPU and one task could not be told from a right one.

Two probes record what happened, in files of the check's work folder:
  * a stand-in `srun`, first in the job's PATH, notes the environment the job script hands to
    its step (CUDA_VISIBLE_DEVICES as the script set it: Slurm replaces it inside the tasks),
    then runs the real srun with the same arguments;
  * the trainer's wrapper (KIT_PROGRAM) notes what each task got from Slurm and the script
    (SLURM_PROCID/LOCALID/NTASKS, its node, MASTER_ADDR/MASTER_PORT), then runs the trainer.

The TODOs (which is which: info.toml's [check.job]):
  gpus        the job asks for every GPU of a node, and the script shows the trainer exactly
              the job's GPUs (in both jobs: a fixed list fails the reshaped one);
  rendezvous  every task sees MASTER_ADDR = the job's first node and MASTER_PORT = the job's
              port (20000 + job id % 10000, as kit_job_port);
  tasks       in both jobs, on every node of the job, one task per allocated GPU, local ranks
              0..G-1, and SLURM_NTASKS = GPUs x nodes;
  nodes       the job as written spans both nodes of the cluster.
  all         (not a TODO) both jobs complete, and each prints one final test loss.

The cluster is started before the first job and stopped after the last, whatever happens
(exceptions, Ctrl-C, SIGTERM).
"""
import glob
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .job_judge import Job, ROOT, gpus_of, judge, job_labels, record_job, report

RESHAPE = ["--nodes=2", "--gres=gpu:2"]
JOB_TIMEOUT = int(os.environ.get("KIT_SLURM_JOB_TIMEOUT", "240"))
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
# What the tasks and the stand-in srun record: nothing else of the environment matters here.
TASK_VARS = ["SLURM_JOB_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURMD_NODENAME",
             "MASTER_ADDR", "MASTER_PORT"]
SRUN_VARS = ["SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS"]
# A pending job with one of these reasons waits for an administrator: no use waiting for it.
HELD = ("launch_failed_requeued_held", "JobHeld")
# What every start of the test cluster logs (no PMIx, no saved state yet): not worth a line.
LOG_NOISE = ("pmix", "MPI:", "state file", "NOTE: Trying backup", "MailProg", "hwloc")


class Interrupted(Exception):
    """Ctrl-C or SIGTERM: stop the cluster and leave."""


def recorder(path, names):
    """A shell snippet that writes NAME=value lines ("(unset)" when unset) to path."""
    lines = " ".join(f'"{n}=${{{n}-(unset)}}"' for n in names)
    return f"printf '%s\\n' {lines} > \"{path}\""


class Probes:
    def __init__(self, work, program):
        self.dir = os.path.join(work, "probes")
        self.bin = os.path.join(work, "probe-bin")
        os.makedirs(self.dir, exist_ok=True)
        os.makedirs(self.bin, exist_ok=True)
        real_srun = shutil.which("srun")
        if real_srun is None:
            raise SystemExit("check: srun is not installed (Debian's slurm-client)")
        self.wrapper = os.path.join(work, "trainer")
        self._write(os.path.join(self.bin, "srun"), [
            "# kit check --job: notes what the job script hands to its step, then the real srun.",
            recorder(f"{self.dir}/srun-$SLURM_JOB_ID-$$.env", SRUN_VARS),
            f'exec {shlex.quote(real_srun)} "$@"'])
        self._write(self.wrapper, [
            "# kit check --job: notes what this task was given, then runs the trainer.",
            recorder(f"{self.dir}/task-$SLURM_JOB_ID-${{SLURM_STEP_ID:-x}}-$SLURM_PROCID.env",
                     TASK_VARS),
            f'exec {shlex.quote(program)} "$@"'])

    @staticmethod
    def _write(path, lines):
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + "\n".join(lines) + "\n")
        os.chmod(path, 0o755)

    def read(self, kind, job):
        out = []
        for p in sorted(glob.glob(os.path.join(self.dir, f"{kind}-{job}-*.env"))):
            with open(p) as f:
                out.append(dict(l.rstrip("\n").split("=", 1) for l in f if "=" in l))
        return out


class Cluster:
    """tests/slurm/cluster.sh start/stop as a context manager."""

    def __init__(self, script, work):
        self.script, self.dir = script, os.path.join(work, "cluster")
        self.conf = None

    def __enter__(self):
        os.makedirs(self.dir, exist_ok=True)
        p = subprocess.run([self.script, "start", self.dir], capture_output=True, text=True)
        if p.returncode != 0:
            self.__exit__(None, None, None)
            why = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
            raise SystemExit(f"check: the test cluster did not start: {why}")
        self.conf = os.path.join(self.dir, "slurm.conf")
        return self

    def __exit__(self, *exc):
        subprocess.run([self.script, "stop", self.dir], capture_output=True)
        return False

    def env(self):
        return dict(os.environ, SLURM_CONF=self.conf)

    def scontrol(self, *args):
        """scontrol's answer; "" when it fails, None when the controller did not answer in time
        (a command that waits on Slurm must never wait unbounded)."""
        try:
            p = subprocess.run(["scontrol", "-o", *args], capture_output=True, text=True,
                               env=self.env(), timeout=30)
        except subprocess.TimeoutExpired:
            return None
        return p.stdout if p.returncode == 0 else ""

    def fields(self, *args):
        """The key=value pairs of `scontrol -o show ...` (first record); None: no answer."""
        answer = self.scontrol("show", *args)
        if answer is None:
            return None
        line = answer.splitlines()
        out = {}
        for word in (line[0].split() if line else []):
            k, _, v = word.partition("=")
            out.setdefault(k, v)
        return out

    def hostnames(self, nodelist):
        return [h for h in (self.scontrol("show", "hostnames", nodelist) or "").split() if h] \
            if nodelist else []

    def log_tails(self, lines=15):
        """The last lines of the daemons' logs: what a job that never ended leaves to go on."""
        out = []
        for path in sorted(glob.glob(os.path.join(self.dir, "log", "*.log"))):
            with open(path, errors="replace") as f:
                tail = [l for l in f.read().splitlines()
                        if not any(n in l for n in LOG_NOISE)][-lines:]
            out.append(f"--- {os.path.relpath(path, self.dir)} (last {len(tail)} lines)")
            out += tail
        return "\n".join(out)


def clean_env(base):
    """The caller's environment without anything of a Slurm job or a launcher: those would leak
    into the jobs (sbatch forwards the environment) and hide the script's own settings."""
    drop = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "CUDA_VISIBLE_DEVICES", "KIT_MASTER_PORT", "KIT_PROGRAM", "KIT_OUT_DIR",
            "KIT_BUILD", "KIT_SITE"}
    return {k: v for k, v in base.items()
            if k not in drop and not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}


def run_job(cluster, probes, job, script, args, exercise_flags, work):
    folder = os.path.join(work, job.name)
    os.makedirs(folder, exist_ok=True)
    env = clean_env(os.environ)
    env.update(SLURM_CONF=cluster.conf, KIT_SITE="local", KIT_ROOT=ROOT, KIT_PROGRAM=probes.wrapper,
               KIT_DATA_DIR=os.path.abspath(args.data), OMP_NUM_THREADS="1",
               PATH=probes.bin + os.pathsep + env.get("PATH", ""))
    try:
        p = subprocess.run(["sbatch", "--parsable", *job.opts, script, *exercise_flags],
                           cwd=folder, capture_output=True, text=True, env=env, timeout=60)
    except subprocess.TimeoutExpired:
        job.state = "SUBMIT_FAILED"
        job.submit_error = "sbatch had no answer from the controller within 60 s"
        return
    if p.returncode != 0:
        job.state = "SUBMIT_FAILED"
        job.submit_error = (p.stderr.strip().splitlines() or ["?"])[-1]
        return
    job.id = p.stdout.strip().split(";")[0]
    start = time.monotonic()
    reason, next_note = "", start + 30
    while True:
        f = cluster.fields("job", job.id)
        if f is not None and not f:
            job.state = job.state if job.state in FINAL_STATES else "GONE"
            break
        if f:
            if f.get("NodeList") and f["NodeList"] != "(null)":
                job.info = f  # kept while Slurm still knows the job (it forgets it 2 s after)
            job.state, reason = f.get("JobState", "?"), f.get("Reason", "")
            if job.state in FINAL_STATES:
                break
            if reason.startswith(HELD):  # Slurm will not start it again on its own
                subprocess.run(["scancel", job.id], env=cluster.env(), timeout=30)
                job.state = f"HELD ({reason})"
                job.stuck = cluster.log_tails()
                break
        now = time.monotonic()
        if now > start + JOB_TIMEOUT:
            subprocess.run(["scancel", job.id], env=cluster.env(), timeout=30)
            job.state = (f"NOT DONE AFTER {JOB_TIMEOUT} s (still {job.state}"
                         + (f", reason {reason}" if reason and reason != "None" else "") + ")")
            job.stuck = cluster.log_tails()
            break
        if now > next_note:  # a job that is slow to end says so while it runs
            print(f"  job {job.id} ({job.label()}): {job.state}"
                  + (f" ({reason})" if reason and reason != "None" else "")
                  + f" after {now - start:.0f} s", flush=True)
            next_note = now + 30
        time.sleep(0.2)
    job.nodes = cluster.hostnames(job.info.get("NodeList", ""))
    job.gpus = gpus_of(job.info.get("TresPerNode", "")) or gpus_of(job.info.get("TRES", ""))
    name = job.info.get("JobName", "job")
    for attr, ext in (("out", "out"), ("err", "err")):
        try:
            with open(os.path.join(folder, f"{name}-{job.id}.{ext}"), errors="replace") as f:
                setattr(job, attr, f.read())
        except OSError:
            pass
    job.tasks = probes.read("task", job.id)
    job.sruns = probes.read("srun", job.id)


def main(args):
    labels, _ = job_labels(args.exercise)
    work = args.workdir or tempfile.mkdtemp(prefix="kit-check-job-")
    os.makedirs(work, exist_ok=True)
    script = os.path.abspath(args.script)
    for what, path in (("the job script", script), ("the trainer", args.program),
                       ("the data", os.path.join(args.data,
                                                 labels.get("data_file", "wiki.train.tokens")))):
        if not os.path.exists(path):
            sys.stderr.write(f"check: {what} is missing: {path}\n")
            return 2

    def stop(signum, frame):
        raise Interrupted()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    print(f"check {args.exercise} --job: {os.path.relpath(script, ROOT)} on a two-node test "
          "Slurm (the solution's trainer runs in it)", flush=True)
    written, reshaped = Job("as-written", []), Job("reshaped", RESHAPE)
    try:
        probes = Probes(work, os.path.abspath(args.program))
        with Cluster(os.path.abspath(args.cluster), work) as cluster:
            nodes = (cluster.scontrol("show", "node") or "").splitlines()
            node_gpus = gpus_of(next((w.split("=", 1)[1] for w in (nodes[0].split() if nodes else [])
                                      if w.startswith("Gres=")), ""))
            for job in (written, reshaped):
                run_job(cluster, probes, job, script, args, labels.get("flags", []), work)
                print(f"  job {job.id or '-'} ({job.label()}): {job.state}", flush=True)
                if job.stuck:
                    print(job.stuck, flush=True)
    except Interrupted:
        print("check: interrupted; the test cluster is stopped", flush=True)
        return 130

    v = judge(labels, written, reshaped, node_gpus)
    report(v, args.exercise)
    if args.record:
        record_job(args.record, args.exercise, script, v)
    if not args.keep and not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if v.failed() else 0
