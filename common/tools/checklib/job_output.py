"""`kit check EXERCISE --job-output DIR|JOBID`: the job script judged by what ONE job of a real
cluster left behind, with no Slurm daemon and no root: the verdicts come from job_judge.py, the
same code that judges `--job`'s jobs on the test cluster.

What a job of sbatch/<exercise>/run.sbatch leaves in the folder it was submitted from (the
script's #SBATCH --output/--error and sbatch/job.sh's KIT_OUT):
  <name>-<id>.out   sbatch/job.sh's kit_show_job lines, written by the batch script just before
                    its step: "job ID on N node(s) NODELIST, site S", "GPUs per node: G
                    allocated, CUDA_VISIBLE_DEVICES=...", "rendezvous: MASTER_ADDR=...
                    MASTER_PORT=..."; then the trainer's: every rank's "rank R of W: local rank
                    L, device D", rank 0's "epoch E, rank R (NODE, D): ..." per rank and its
                    "final test loss";
  <name>-<id>.err   Slurm's, the kit's and the trainer's errors;
  runs/<name>-<id>/ metrics.csv (one row per rank and epoch, with the rank's node) and models.
A requeued job appends each run to the same files: the last run (from its last "job ID on" line)
is the one judged.

From these the record of job_judge.Job is filled as the probes of `--job` fill it: each rank
line is a task (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, its node from rank 0's report), with
the MASTER_ADDR/MASTER_PORT the batch script exported before srun (srun hands its environment to
the tasks); CUDA_VISIBLE_DEVICES as the script set it is what it handed to its step. Slurm's own
GPU numbering of the job is not in the output: the job's GPUs count as 0..G-1 (what a batch
script sees where Slurm confines jobs to their GPUs).

What one job cannot show (job_judge.judge says so, as "not judged"): whether the GPU list
follows another --gres (a fixed list passes on the shape it was written for), and for a job of
one GPU on one node, whether srun starts one task per GPU. `--job` runs the second shape.
A node's GPU count is not in the output either: it is the course's, the --gres of the
exercise's solution.sbatch.
"""
import csv
import glob
import os
import re
import subprocess
import sys

from .job_judge import Job, ROOT, judge, job_labels, report

SHOW = re.compile(r"^\S+: job (\d+) on (\d+) node\(s\) (\S+), site (\S+)$")
GPUS = re.compile(r"^\S+: GPUs per node: (\d+) allocated, CUDA_VISIBLE_DEVICES=(\S*)$")
MEET = re.compile(r"^\S+: rendezvous: MASTER_ADDR=(\S*) MASTER_PORT=(\S*)$")
RANK = re.compile(r"^rank (\d+) of (\d+): local rank (\d+), device \S+$")
REPORT = re.compile(r"^  epoch \d+, rank (\d+) \(([^,()]+), ")
ERROR = re.compile(r"\berror\b", re.IGNORECASE)


class Refused(Exception):
    """Nothing to judge: one line for the student, exit 2."""


def expand_nodelist(nodelist):
    """Slurm's hostlist without scontrol: "jwb[0012-0013,0020],login1" -> jwb0012, jwb0013,
    jwb0020, login1 (zero padding kept)."""
    parts, depth, cur = [], 0, ""
    for c in nodelist:
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    out = []
    for part in filter(None, parts):
        m = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", part)
        if not m:
            out.append(part)
            continue
        head, ranges, tail = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            hi = hi or lo
            if not (lo.isdigit() and hi.isdigit()):
                out.append(part)  # not Slurm's syntax: keep it as one name
                break
            for i in range(int(lo), int(hi) + 1):
                out += expand_nodelist(f"{head}{i:0{len(lo)}d}{tail}")
    return out


def job_name(info):
    """The --job-name of the exercise's job script ("ex01"): the stem of its output files."""
    for f in info.get("files", []):
        if f.get("lang") != "bash":
            continue
        for path in (f.get("exercise"), f.get("solution")):
            try:
                with open(os.path.join(ROOT, path)) as s:
                    m = re.search(r"^#SBATCH\s+(?:--job-name=|-J\s*)(\S+)", s.read(), re.M)
            except (OSError, TypeError):
                continue
            if m:
                return m.group(1)
    return "job"


def course_node_gpus(info):
    """The GPUs of one of the course's nodes: the --gres of the exercise's solution script."""
    for f in info.get("files", []):
        if f.get("lang") == "bash" and f.get("solution"):
            try:
                with open(os.path.join(ROOT, f["solution"])) as s:
                    m = re.search(r"^#SBATCH\s+--gres=gpu:(?:\w+:)?(\d+)", s.read(), re.M)
            except OSError:
                continue
            if m:
                return int(m.group(1)), f["solution"]
    return 4, "the course"


def find_job(where, name, exercise, cwd):
    """(the .out file, the job id) that `--job-output WHERE` names; Refused when none."""
    stem = re.compile(rf"^{re.escape(name)}-(\d+)\.out$")
    how = (f"the {name}-<job id>.out (and .err) that Slurm writes where you ran `sbatch "
           f"sbatch/{exercise}/run.sbatch`")
    if os.path.isfile(where):
        m = stem.match(os.path.basename(where))
        if not m:
            raise Refused(f"{where} is not a job's output of exercise {exercise}: expected {how}")
        return where, m.group(1)
    if os.path.isdir(where):
        outs = [(os.path.getmtime(p), int(m.group(1)), p, m.group(1))
                for p in glob.glob(os.path.join(where, f"{glob.escape(name)}-*.out"))
                for m in [stem.match(os.path.basename(p))] if m]
        if outs:
            _, _, path, job_id = max(outs)
            if len(outs) > 1:
                print(f"{len(outs)} jobs of {name} in {where}: judging the newest, {job_id} "
                      f"(--job-output {os.path.join(where, name + '-<job id>.out')} for another)")
            return path, job_id
        # The job's run folder (runs/<name>-<id>): the .out lies two levels up.
        m = re.match(rf"^{re.escape(name)}-(\d+)$", os.path.basename(os.path.normpath(where)))
        up = m and os.path.join(where, os.pardir, os.pardir, f"{m.group(0)}.out")
        if up and os.path.isfile(up):
            return os.path.normpath(up), m.group(1)
        raise Refused(f"{where} holds no job of exercise {exercise}: expected {how}; give that "
                      "folder, or the job id from there")
    if where.isdigit():
        places = list(dict.fromkeys([os.path.abspath(cwd), ROOT]))
        for d in places:
            path = os.path.join(d, f"{name}-{where}.out")
            if os.path.isfile(path):
                return path, where
        raise Refused(f"job {where} left no {name}-{where}.out in {' or '.join(places)}: give the "
                      f"folder you submitted it from (--job-output DIR)")
    raise Refused(f"no folder {where}: give the folder you ran `sbatch sbatch/{exercise}/run.sbatch` "
                  f"in (it holds {name}-<job id>.out), or the job id")


def site_addresses(site, first):
    """Where rank 0 listens on the site's own network (kit_site_master_addr of its profile,
    e.g. an InfiniBand name), besides the node's name; empty when the profile has none."""
    profile = os.path.join(ROOT, "sbatch", "sites", f"{site}.sh")
    if not first or not os.path.isfile(profile):
        return set()
    try:
        p = subprocess.run(
            ["bash", "-c", '. "$1" >/dev/null 2>&1 && declare -F kit_site_master_addr >/dev/null '
                           '&& kit_site_master_addr "$2"', "site", profile, first],
            capture_output=True, text=True, timeout=20, env=dict(os.environ, KIT_SITE=site))
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {l.strip() for l in p.stdout.splitlines() if l.strip()}


def read_job(out_path, job_id, name):
    """A job_judge.Job from the files the job left."""
    job = Job("job", [], label=f"job {job_id}")
    job.id = job_id
    with open(out_path, errors="replace") as f:
        lines = f.read().splitlines()
    # A requeued job appended every run: judge the last one.
    starts = [i for i, l in enumerate(lines) if SHOW.match(l)]
    lines = lines[starts[-1]:] if starts else lines
    job.out = "\n".join(lines) + "\n"
    err_path = out_path[:-len(".out")] + ".err"
    try:
        with open(err_path, errors="replace") as f:
            job.err = f.read()
    except OSError:
        job.err = ""
    site, addr, port, run_dir = "", "(unset)", "(unset)", ""
    ranks, hosts = {}, {}
    for l in lines:
        if m := SHOW.match(l):
            job.id, site = m.group(1), m.group(4)
            job.nodes = expand_nodelist(m.group(3))
        elif m := GPUS.match(l):
            job.gpus = int(m.group(1))
            job.sruns = [{"CUDA_VISIBLE_DEVICES": m.group(2) or "(unset)",
                          "SLURM_JOB_GPUS": "(unset)"}]
        elif m := MEET.match(l):
            addr, port = m.group(1) or "(unset)", m.group(2) or "(unset)"
        elif m := RANK.match(l):
            ranks[m.group(1)] = (m.group(2), m.group(3))
        elif m := REPORT.match(l):
            hosts[m.group(1)] = m.group(2)
        elif ", output: " in l and l.split(": ", 1)[-1].startswith("data: "):
            run_dir = l.rsplit(", output: ", 1)[1]
    # Large jobs list no rank per line: metrics.csv has each rank's node.
    for d in (run_dir, os.path.join(os.path.dirname(out_path), "runs", f"{name}-{job.id}")):
        csv_path = os.path.join(d, "metrics.csv") if d else ""
        if csv_path and os.path.isfile(csv_path) and any(r not in hosts for r in ranks):
            with open(csv_path, newline="", errors="replace") as f:
                for row in csv.DictReader(f):
                    if row.get("rank") and row.get("host"):
                        hosts.setdefault(row["rank"], row["host"])
            break
    job.tasks = [{"SLURM_JOB_ID": job.id, "SLURM_PROCID": r, "SLURM_NTASKS": w,
                  "SLURM_LOCALID": local, "SLURMD_NODENAME": hosts.get(r, "(not reported)"),
                  "MASTER_ADDR": addr, "MASTER_PORT": port}
                 for r, (w, local) in sorted(ranks.items(), key=lambda kv: int(kv[0]))]
    job.master_addrs = site_addresses(site, job.nodes[0] if job.nodes else "")
    errors = [l for l in job.err.splitlines() if ERROR.search(l)]
    finals = sum(l.startswith("final test loss ") for l in lines)
    job.state = ("FAILED" if errors else "COMPLETED" if finals else
                 "UNFINISHED (no final test loss in its .out: still running, or stopped early)")
    if errors:
        job.err = "\n".join(errors)  # why_failed() quotes the last of them
    return job


def main(args):
    labels, info = job_labels(args.exercise)
    name = job_name(info)
    try:
        out_path, job_id = find_job(args.output, name, args.exercise, os.getcwd())
    except Refused as e:
        print(f"kit: error: {e}", file=sys.stderr)
        return 2
    job = read_job(out_path, job_id, name)
    node_gpus, source = course_node_gpus(info)
    shape = (f"{len(job.nodes)} node(s) x {job.gpus} GPU(s)" if job.nodes else
             "it stopped before its step")
    shown = os.path.relpath(out_path)
    shown = out_path if shown.startswith(os.pardir) else shown
    print(f"check {args.exercise} --job-output: job {job.id} ({shown}; "
          f"{shape}), judged by what it left (no Slurm needed)", flush=True)
    v = judge(labels, job, None, node_gpus,
              node_source=f" (the course's nodes: {os.path.basename(source)})",
              again=f": ./kit check {args.exercise[:2]} --job runs that on a test cluster")
    report(v, args.exercise)
    return 1 if v.failed() else 0
