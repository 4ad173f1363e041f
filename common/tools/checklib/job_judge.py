"""The verdicts on an exercise's job script, from what its jobs did: one piece of judging for both
ways of getting there.

  * `kit check EXERCISE --job` (job.py) runs two jobs on the throw-away test cluster, as written
    and reshaped to 2 nodes x 2 GPUs, with probes that note what each task got;
  * `kit check EXERCISE --job-output DIR|JOBID` (job_output.py) reads what one job of a real
    cluster left: its .out/.err files and its run folder.

Both fill the same record (Job) and call judge(). With one job there is no reshaped twin: the
halves of a verdict that need it are said to be "not judged from one job" (Verdicts.note), never
passed silently.
"""
import hashlib
import json
import os
import re
import sys
import time

from .verdicts import Verdicts

TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(os.path.dirname(TOOLS))


def job_labels(exercise):
    """info.toml's [check.job]: which TODO is which. stages.py reads info.toml (one TOML reader
    for the tools, with its fallback for Pythons without tomllib)."""
    sys.path.insert(0, TOOLS)
    import stages  # noqa: E402 (common/tools/stages.py)
    info = stages.load_info(exercise)
    job = info.get("check", {}).get("job")
    if not job:
        raise SystemExit(f"kit: error: exercise {exercise} has no job script to check "
                         "(no [check.job] in its info.toml)")
    return job, info


class Job:
    """What one job did, whoever found it out. tasks: one dict per task with the SLURM_* and
    MASTER_* values it saw; sruns: what the script handed to its step (CUDA_VISIBLE_DEVICES,
    and SLURM_JOB_GPUS when known)."""

    def __init__(self, name, opts, label=None):
        self.name, self.opts = name, opts
        self.id = None
        self.state = "NOT_SUBMITTED"
        self.info = {}
        self.nodes = []
        self.gpus = 0
        self.out = self.err = ""
        self.tasks, self.sruns = [], []
        self.submit_error = ""
        self.stuck = ""  # the daemons' logs when the job did not end in time
        # Addresses of the first node other than its name that rank 0 may listen on: the site
        # profile's kit_site_master_addr (an InfiniBand name or address).
        self.master_addrs = set()
        self._label = label

    def label(self):
        if self._label:
            return self._label
        return "as written" if not self.opts else "with sbatch " + " ".join(self.opts)

    def why_failed(self):
        if self.submit_error:
            return f"sbatch refused the script: {self.submit_error}"
        last = [l for l in self.err.splitlines() if l.strip()]
        return f"ended {self.state}" + (f": {last[-1]}" if last else "")


def gpus_of(tres):
    """4 from "gres:gpu:4" (a job's TresPerNode) or "gpu:4" (a node's Gres); 0 when none."""
    for part in tres.split(","):
        bits = part.replace("/", ":").replace("=", ":").split(":")
        if "gpu" in bits and bits[-1].isdigit():
            return int(bits[-1])
    return 0


# --- the judgments ------------------------------------------------------------------------------
def judge_gpus(written, reshaped, node_gpus, node_source=""):
    why = []
    if written.gpus != node_gpus:
        why.append(f"the job asks for {written.gpus} GPU(s) per node (--gres=gpu:{written.gpus}), "
                   f"a node has {node_gpus}{node_source}: request all of them")
    for job in (written, reshaped):
        if job is None:
            continue
        if not job.sruns:
            why.append(f"{job.label()}: the script started no srun step, so no GPU list reached "
                       "the trainer")
            continue
        seen = job.sruns[0].get("CUDA_VISIBLE_DEVICES", "(unset)")
        mine = job.sruns[0].get("SLURM_JOB_GPUS", "(unset)")
        want = mine if mine != "(unset)" and len(mine.split(",")) == job.gpus else \
            ",".join(str(i) for i in range(job.gpus))
        if sorted(seen.split(",")) != sorted(want.split(",")):
            why.append(f"{job.label()}: the script shows the trainer CUDA_VISIBLE_DEVICES={seen}, "
                       f"the job's {job.gpus} GPU(s) are {want}"
                       + (" (a fixed list does not follow --gres: kit_gpu_ids does)"
                          if job is reshaped and seen != "(unset)" else ""))
    return why


def judge_rendezvous(jobs):
    why = []
    for job in jobs:
        if not job.tasks:
            why.append(f"{job.label()}: no task started, so no rank could be told where to meet")
            continue
        addr = job.nodes[0] if job.nodes else "?"
        port = str(20000 + int(job.id) % 10000)
        good = {addr} | job.master_addrs
        got = {(t.get("MASTER_ADDR"), t.get("MASTER_PORT")) for t in job.tasks}
        bad = sorted(g for g in got if g[0] not in good or g[1] != port)
        if bad:
            a, p = bad[0]
            hint = (" (export both)" if "(unset)" in (a, p) else
                    " (a fixed port clashes with other jobs on the node: kit_job_port)"
                    if a in good else " (kit_master_addr: the job's first node)")
            why.append(f"{job.label()}: the ranks got MASTER_ADDR={a} MASTER_PORT={p}, expected "
                       f"{addr} and the job's port {port}{hint}")
            break  # the other job would only say the same
    return why


def judge_tasks(jobs):
    why = []
    for job in jobs:
        g, nodes = job.gpus, job.nodes
        per_node = {n: sorted(int(t.get("SLURM_LOCALID", "-1")) for t in job.tasks
                              if t.get("SLURMD_NODENAME") == n) for n in nodes}
        counts = ", ".join(f"{len(v)} on {n}" for n, v in per_node.items()) or "none"
        ntasks = {t.get("SLURM_NTASKS") for t in job.tasks}
        ok = g > 0 and all(v == list(range(g)) for v in per_node.values()) and \
            ntasks == {str(g * len(nodes))}
        if not ok:
            why.append(f"{job.label()}: {len(nodes)} node(s) x {g} GPU(s), and the job started "
                       f"{len(job.tasks)} task(s) ({counts}): start one task per GPU on every node")
    return why


def judge_nodes(written, want):
    if len(written.nodes) == want:
        return []
    return [f"the job ran on {len(written.nodes)} node(s) ({', '.join(written.nodes) or 'none'}): "
            f"ask for {want} (#SBATCH --nodes)"]


# A rank's line of kit::Mesh::describe(), which exercise 04 prints (rules/ex04.py reads it too).
MESH_LINE = re.compile(r"^rank (\d+) of (\d+): tp (\d+) of (\d+), cp (\d+) of (\d+), dp (\d+) of "
                       r"(\d+) \(order ([a-z-]+)\)\s*$", re.M)


# Exercise 05's line, with its pp coordinate (kit::Mesh::describe() with pp; rules/ex05.py reads it).
PP_MESH_LINE = re.compile(r"^rank (\d+) of (\d+): tp (\d+) of (\d+), cp (\d+) of (\d+), dp (\d+) "
                          r"of (\d+), pp (\d+) of (\d+) \(order ([a-z-]+)\)\s*$", re.M)


def mesh_lines(jobs, pattern, missing, why):
    """(job, node of each rank, each rank's mesh line's groups) of every finished job whose ranks
    printed `pattern`'s line. A job the mesh refused (its flags) and a job without the lines (the
    sentence `missing`) go to `why`; a job that failed otherwise is judge_all's."""
    for job in jobs:
        if job.state != "COMPLETED":
            if "kit::Mesh" in job.err:  # the mesh refused the flags
                why.append(f"{job.label()}: {job.why_failed()}")
            continue
        node = {int(t.get("SLURM_PROCID", -1)): t.get("SLURMD_NODENAME", "?") for t in job.tasks}
        lines = {int(m.group(1)): m.groups() for m in pattern.finditer(job.out)}
        if not lines:
            why.append(f"{job.label()}: {missing}")
            continue
        yield job, node, lines


def judge_pp(jobs):
    """Exercise 05's job TODO: --pp is the nodes of the job, so that each node holds one stage
    (its GPUs the copies of that stage). From each rank's mesh line and the node Slurm started
    it on: the ranks of one node are all of one stage, and there are as many stages as nodes."""
    why = []
    for job, node, lines in mesh_lines(jobs, PP_MESH_LINE, "no rank printed a mesh line with its "
                                       "stage (\"rank R of W: ..., pp s of P (order O)\"): the "
                                       "trainer ran without --pp", why):
        pp = int(next(iter(lines.values()))[9])
        stages = {}
        for r, g in lines.items():
            stages.setdefault(node.get(r, "?"), set()).add(int(g[8]))
        mixed = sorted(n for n, s in stages.items() if len(s) > 1)
        if mixed:
            why.append(f"{job.label()}: node {mixed[0]} holds ranks of stages "
                       f"{', '.join(map(str, sorted(stages[mixed[0]])))}: activations would cross "
                       "inside a node while the stages' copies average their gradients across nodes")
        elif pp != len(stages):
            why.append(f"{job.label()}: --pp {pp} on {len(stages)} node(s): a stage per node is "
                       "--pp \"$SLURM_JOB_NUM_NODES\"")
    return why


def judge_tp(jobs):
    """Exercise 04's job TODO: --tp is the GPUs (tasks) of a node, so that each tp group is one
    node's ranks. From each rank's mesh line ("rank R of W: tp a of T, ...", kit::Mesh::describe)
    and the node Slurm started that rank on: the tp groups' members (same cp and dp coordinates)
    must each sit on one node, and a tp group must fill its node (T = the job's GPUs per node)."""
    why = []
    for job, node, lines in mesh_lines(jobs, MESH_LINE, "no rank printed its mesh line (\"rank R "
                                       "of W: tp a of T, ...\")", why):
        tp = int(next(iter(lines.values()))[3])
        groups = {}
        for r, g in lines.items():
            groups.setdefault((g[4], g[6]), []).append(r)
        spans = [sorted(m) for m in groups.values() if len({node.get(r) for r in m}) > 1]
        if spans:
            m = spans[0]
            why.append(f"{job.label()}: the tp group of ranks {', '.join(map(str, m))} spans the "
                       f"nodes {', '.join(sorted({node.get(r, '?') for r in m}))}: every "
                       "all-reduce of a layer would cross the network")
        elif tp != job.gpus:
            why.append(f"{job.label()}: --tp {tp} with {job.gpus} GPU(s) per node: a tp group "
                       f"is a node's ranks, --tp \"$KIT_TASKS_PER_NODE\" ({job.gpus} here)")
    return why


def judge_all(jobs):
    why = []
    for job in jobs:
        if job.state != "COMPLETED":
            why.append(f"{job.label()}: {job.why_failed()}")
        elif sum(l.startswith("final test loss ") for l in job.out.splitlines()) != 1:
            why.append(f"{job.label()}: the job did not print one final test loss")
    return why


def judge(labels, written, reshaped, node_gpus, node_source="", again=""):
    """The verdicts, one row per TODO of [check.job]. reshaped None: one job was all there is
    (a real cluster's); what only a second shape shows is a note, not a row. again: the command
    that judges those too."""
    v = Verdicts(labels)
    jobs = [j for j in (written, reshaped) if j is not None]
    one = reshaped is None
    # Exercises 04 and 05: the rest of their job scripts is ready-made, not their TODOs.
    for key, judge_it, what in (("pp", judge_pp, "--pp is the nodes of the job: each node holds "
                                 "one stage"),
                                ("tp", judge_tp, "--tp is the GPUs of a node: each tp group is "
                                 "one node's ranks")):
        if key in labels:
            v.add(key, not (why := judge_it(jobs)), what, "; ".join(why))
            v.add("all", not (why := judge_all(jobs)),
                  "the job completes and prints the final test loss" if one else
                  "both jobs complete and print the final test loss", "; ".join(why))
            return v
    v.add("gpus", not (why := judge_gpus(written, reshaped, node_gpus, node_source)),
          "the job requests every GPU of a node and makes the job's GPUs visible", "; ".join(why))
    if one:
        v.note("gpus", "in part: whether the GPU list follows another --gres (a fixed list "
                       f"does not) needs a second job of another shape{again}")
    v.add("rendezvous", not (why := judge_rendezvous(jobs)),
          "every rank gets MASTER_ADDR and the job's MASTER_PORT", "; ".join(why))
    if one and written.gpus * max(len(written.nodes), 1) <= 1 and len(written.tasks) == 1:
        # One GPU on one node: one task is right, whether srun starts one task or one per GPU.
        v.note("tasks", f"{written.label()} had 1 GPU on 1 node, where one task per GPU is one "
                        "task: a job with more GPUs tells (TODOs "
                        f"{labels.get('gpus', 'gpus')}, {labels.get('nodes', 'nodes')})"
                        f"{again}")
    else:
        v.add("tasks", not (why := judge_tasks(jobs)), "one task per GPU on every node (srun)",
              "; ".join(why))
    v.add("nodes", not (why := judge_nodes(written, 2)), "the job spans two nodes",
          "; ".join(why))
    v.add("all", not (why := judge_all(jobs)),
          "the job completes and prints the final test loss" if one else
          "both jobs complete and print the final test loss",
          "; ".join(why))
    return v


def report(v, exercise):
    """The verdicts, then the lines that tests and scripts read (passed:, failed:, not judged:)."""
    v.print()
    print(f"passed: {','.join(v.passed()) or '-'}")
    print(f"failed: {','.join(v.failed()) or '-'}")
    if v.notes:
        print(f"not judged: {','.join(dict.fromkeys(t for t, _ in v.notes))}")
    if not v.failed():
        print(("every job-script TODO judged here passes" if v.notes else
               "every job-script TODO passes") +
              f": compare with the solution: ./kit diff {exercise[:2]} --solution")


def record_job(path, exercise, script, verdicts):
    """Adds this check's verdicts to .kit/check/<exercise>.json under "job", for `kit list`; the
    trainer's record in the same file stays."""
    try:
        with open(path) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        rec = {"exercise": exercise}
    with open(script, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    rec["job"] = {"source": os.path.abspath(script), "sha256": digest,
                  "time": time.strftime("%Y-%m-%d %H:%M"),
                  "passed": verdicts.passed(), "failed": verdicts.failed()}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(rec, f)
    os.replace(tmp, path)
