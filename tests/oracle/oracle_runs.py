"""What the oracles that start the kit's programs and PyTorch's under ddprun share: a clean
environment (no rank variables of an outer launcher, one thread a rank), a run that stops the
oracle with the program's output when it fails, and the collectives of a kit run trace."""
import os
import subprocess
import sys


def clean_env():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "KIT_TRACE_DIR", "KIT_TRACE_WEIGHTS"):
        env.pop(var, None)
    return env


def run(cmd, env):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])} ... failed (exit {p.returncode}):\n{p.stdout}\n{p.stderr}")


def collectives(trace_file):
    """The trace's collective lines as dicts (kit/check/observe.cpp: 'coll seq=.. kind=.. ...')."""
    out = []
    with open(trace_file) as f:
        for line in f:
            if line.startswith("coll "):
                out.append(dict(field.split("=", 1) for field in line.split()[1:]))
    return out
