#!/usr/bin/env python3
"""./kit check inside a Slurm allocation (common/tools/checklib/allocation.py), without Slurm:
where the check's runs go for the environment of `salloc` and `srun --pty`.

  * outside a job, or in a job without GPUs here: nothing changes, nothing is said;
  * a CUDA build with as many GPUs as ranks: one GPU per rank (the first ones visible), NCCL;
  * a CUDA build with fewer GPUs than ranks: the CPU with Gloo, KIT_ALLOW_CPU=1 and no GPU
    shown, never two ranks on one GPU, and one line saying so and what to ask for;
  * a CPU build in a job with GPUs: the CPU, KIT_ALLOW_CPU=1, one line saying the build has no
    CUDA;
  * the GPU ids come from CUDA_VISIBLE_DEVICES in a step, else from Slurm's job variables
    (renumbered from 0, as CUDA numbers what it sees).

usage: test_allocation.py
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "common", "tools"))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
from checklib.allocation import allocated_gpus, place  # noqa: E402
from verdict import expect, finish  # noqa: E402

STEP = {"SLURM_JOB_ID": "4711", "SLURM_STEP_GPUS": "4,5,6,7", "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "SLURM_GPUS_ON_NODE": "4"}


def main():
    expect(place({}, 2, True).line is None and place({}, 2, True).env == {},
           "outside a job: nothing changes, nothing is said")
    expect(place({"SLURM_JOB_ID": "1"}, 2, False).line is None,
           "a job without GPUs here (salloc's shell, a CPU partition): nothing changes")

    p = place(STEP, 2, True)
    expect(p.gpus == ["0", "1"] and p.env == {"CUDA_VISIBLE_DEVICES": "0,1"}
           and "GPUs 0,1 with NCCL" in p.line, "CUDA build, 4 GPUs, 2 ranks: a GPU per rank", p)

    one = dict(STEP, CUDA_VISIBLE_DEVICES="0", SLURM_STEP_GPUS="2", SLURM_GPUS_ON_NODE="1")
    p = place(one, 2, True)
    expect(p.gpus is None and p.env == {"KIT_ALLOW_CPU": "1", "CUDA_VISIBLE_DEVICES": ""}
           and "CPU with Gloo" in p.line and "--gres=gpu:2" in p.line and "\n" not in p.line,
           "CUDA build, 1 GPU, 2 ranks: the CPU, not both ranks on cuda:0, in one line", p)

    p = place(STEP, 2, False)
    expect(p.gpus is None and p.env == {"KIT_ALLOW_CPU": "1"} and "has no CUDA" in p.line
           and "\n" not in p.line, "CPU build in a job with GPUs: the CPU, said in one line", p)

    expect(allocated_gpus({"SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "5,7"}) == ["0", "1"],
           "salloc on a node: the job's GPUs, numbered from 0")
    expect(allocated_gpus({"SLURM_JOB_ID": "1", "SLURM_GPUS_ON_NODE": "3"}) == ["0", "1", "2"],
           "only a count: 0..n-1")
    expect(allocated_gpus({"SLURM_JOB_ID": "1", "CUDA_VISIBLE_DEVICES": "",
                           "SLURM_STEP_GPUS": "1"}) == ["0"],
           "CUDA_VISIBLE_DEVICES empty: Slurm's variables say what the job has")
    expect(allocated_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}) is None,
           "GPUs but no Slurm job (a workstation): not an allocation")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
