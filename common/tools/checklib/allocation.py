"""./kit check inside a Slurm allocation (`salloc`, `srun --pty`): where the check's runs go.

Outside a Slurm job nothing changes: the runs use what the machine has (a CPU build: Gloo on the
CPU). Inside one with GPUs the check's runs must not all land on one GPU, nor train on the CPU
without a word:
  * a CUDA build with at least as many of the allocation's GPUs as ranks: every rank gets a GPU
    of its own, with NCCL (ddprun gives rank r cuda:r of the visible GPUs; in the run with one
    rank per node each rank sees only its own GPU), and the rows that need a GPU are judged;
  * a CUDA build with fewer GPUs than ranks, or a CPU build: the runs go to the CPU with Gloo
    (KIT_ALLOW_CPU=1, which the trainers need in a job with GPUs, kit/runtime/env.h; a CUDA
    build is shown no GPU), and one line says so and what to ask for instead.
"""
import os
import subprocess
from collections import namedtuple

# gpus: the GPU ids the runs use, one per rank (None: the CPU); env: what the runs' environment
# gets; line: what to tell the student (None: nothing to tell).
Placement = namedtuple("Placement", "gpus env line")
NOWHERE = Placement(None, {}, None)


def allocated_gpus(env):
    """The GPUs this process may use in its Slurm job, as CUDA numbers them (a list of ids), or
    None when it is not in a job or Slurm gave the job no GPU here. Inside a step Slurm sets
    CUDA_VISIBLE_DEVICES (and SLURM_STEP_GPUS); in salloc's own shell only the job's
    variables say so."""
    if not env.get("SLURM_JOB_ID"):
        return None
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip():
        return [g for g in visible.split(",") if g.strip()]
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        ids = [g for g in env.get(var, "").split(",") if g.strip()]
        if ids:
            return [str(i) for i in range(len(ids))]  # CUDA numbers what it sees from 0
    count = env.get("SLURM_GPUS_ON_NODE", "")
    if count.isdigit() and int(count) > 0:
        return [str(i) for i in range(int(count))]
    return None


def cuda_build(binary):
    """Whether the trainer was linked against a CUDA build of LibTorch: its libraries (ldd)
    include c10's CUDA library. False when ldd cannot tell."""
    try:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "libc10_cuda" in out or "libtorch_cuda" in out


def place(env, ranks, has_cuda):
    """Where the check's runs of `ranks` ranks go (a Placement)."""
    gpus = allocated_gpus(env)
    if gpus is None:
        return NOWHERE
    job = f"Slurm job {env.get('SLURM_JOB_ID')} with {len(gpus)} GPU(s) here ({','.join(gpus)})"
    cpu = {"KIT_ALLOW_CPU": "1"}
    if not has_cuda:
        return Placement(None, cpu, f"check: {job}, but this build's LibTorch has no CUDA: the "
                         "runs train on the CPU with Gloo (for NCCL on the GPUs, build against "
                         "the site's CUDA PyTorch module)")
    if len(gpus) < ranks:
        return Placement(None, dict(cpu, CUDA_VISIBLE_DEVICES=""),
                         f"check: {job} for {ranks} ranks: the runs train on the CPU with Gloo, "
                         f"not {ranks} ranks on one GPU (ask for --gres=gpu:{ranks} to run them "
                         "on GPUs with NCCL)")
    mine = gpus[:ranks]
    return Placement(mine, {"CUDA_VISIBLE_DEVICES": ",".join(mine)},
                     f"check: {job}: the runs train on GPUs {','.join(mine)} with NCCL, one rank "
                     "per GPU")


def here(binary, ranks):
    """The placement for this process's environment."""
    if allocated_gpus(os.environ) is None:
        return NOWHERE
    return place(os.environ, ranks, cuda_build(binary))
