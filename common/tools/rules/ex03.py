"""Exercise 03 (ZeRO-1, ZeRO-2, ZeRO-3): which run, which TODO is which, and the formula.

The program trains one model four times on the same batches: DDP (given), then ZeRO-1, ZeRO-2
and ZeRO-3. Rank 0 prints "NAME step K loss L" for every step, every rank
"rank R: NAME holds params P grads G optimizer O gathered X bytes", and rank 0 first
"parameters P in units u1 u2 ... on N ranks". A stage passes when

  * its loss at every step is DDP's (printed with 6 decimals; a reduce-scatter may sum in another
    order than an all-reduce, so equal to a few units of the last digit), and
  * every rank holds exactly what the formula says, fp32 with AdamW, padded to N equal shards:
        DDP     params 4P        grads 4P        optimizer 8P
        ZeRO-1  params 4P        grads 4P        optimizer 8 ceil(P/N)
        ZeRO-2  params 4P        grads 4 ceil(P/N)  optimizer 8 ceil(P/N)
        ZeRO-3  params 4 S3      grads 4 S3      optimizer 8 S3,   S3 = sum over units of ceil(u/N)
    (ZeRO-3 shards each unit on its own) and ZeRO-3's gathered peak is one unit, not the model.
The formula is computed here from the unit sizes, not read from the program."""
import math
import re

from checklib import compare
from checklib.runs import read

RUN_FLAGS = ["--steps", "3"]
NODES_FLAGS = None
RUN_ENV = {"KIT_TIMEOUT": "30"}
LABELS = {"include": "1", "zero12": "2", "zero3": "3"}
STAGES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")
LOSS = re.compile(r"^(DDP|ZeRO-[123]) step (\d+) loss ([-0-9.e+]+)\s*$", re.M)
HELD = re.compile(r"^rank (\d+): (DDP|ZeRO-[123]) holds params (\d+) grads (\d+) optimizer (\d+) "
                  r"gathered (\d+) bytes\s*$", re.M)
UNITS = re.compile(r"^parameters (\d+) in units([ 0-9]+) on (\d+) ranks\s*$", re.M)
RESULT_LINES = (LOSS,)
LOSS_TOL = 5e-6  # a few units of the 6th decimal


def data_key():
    return RUN_FLAGS


def prepare_data(check, directory):
    return None  # random tokens, made by the program


def formula(stage, units, n):
    """(params, grads, optimizer) bytes per rank at `stage` for these unit sizes on n ranks."""
    P = sum(units)
    S = math.ceil(P / n)
    S3 = sum(math.ceil(u / n) for u in units)
    return {"DDP": (4 * P, 4 * P, 8 * P), "ZeRO-1": (4 * P, 4 * P, 8 * S),
            "ZeRO-2": (4 * P, 4 * S, 8 * S), "ZeRO-3": (4 * S3, 4 * S3, 8 * S3)}[stage]


def losses(log):
    """{stage: [loss of step 1, 2, ...]} from rank 0's output."""
    out = {}
    for m in LOSS.finditer(log):
        out.setdefault(m.group(1), []).append(float(m.group(3)))
    return out


def held(log):
    """{stage: (params, grads, optimizer, gathered)} from one rank's output."""
    return {m.group(2): tuple(int(m.group(i)) for i in range(3, 7)) for m in HELD.finditer(log)}


def what_is_wrong(stage, run, ranks, units, ddp_losses):
    """Why `stage` does not pass on this run, or ""."""
    mine = losses(run.logs.get(0, "")).get(stage)
    stopped = " (the run stopped before it: see above)" if run.failure() else ""
    if not mine:
        return f"rank 0 printed no {stage} loss{stopped}"
    if len(mine) != len(ddp_losses):
        return f"{stage} printed {len(mine)} losses, DDP {len(ddp_losses)}"
    for k, (a, b) in enumerate(zip(mine, ddp_losses)):
        if abs(a - b) > LOSS_TOL:
            return (f"{stage}'s loss at step {k + 1} is {a:.6f}, DDP's {b:.6f}: sharding must not "
                    "change what is computed (every gradient averaged, every weight updated once)")
    want = formula(stage, units, ranks)
    for r in range(ranks):
        got = held(run.logs.get(r, "")).get(stage)
        if got is None:
            return f"rank {r} printed no line of what it holds under {stage}{stopped}"
        for name, g, w in zip(("params", "grads", "optimizer state"), got, want):
            if g != w:
                ddp = formula("DDP", units, ranks)[("params", "grads", "optimizer state").index(name)]
                still = " (DDP's figure: is it still DDP?)" if g == ddp and w != ddp else ""
                return (f"rank {r} holds {g} bytes of {name} under {stage}, the formula says "
                        f"{w} on {ranks} ranks{still}")
        if stage == "ZeRO-3" and not 0 < got[3] < 4 * sum(units):
            return (f"rank {r} gathered {got[3]} bytes of weights at once under ZeRO-3: one "
                    "unit's worth is expected, never the whole model")
    return ""


def judge(check):
    v, many, ranks = check.verdicts, check.many, check.ranks
    included = check.source is not None and all(
        re.search(rf'#\s*include\s+"kit/{h}\.h"', read(check.source)) for h in ("zero", "zero3"))
    v.add("include", bool(included), "kit/zero.h and kit/zero3.h are included",
          "" if included else "include both headers (TODO 1)")
    head = UNITS.search(many.logs.get(0, ""))
    ddp = losses(many.logs.get(0, "")).get("DDP")
    if head is None or not ddp:
        for concept in ("zero12", "zero3"):
            v.add(concept, False, "the DDP reference ran", "rank 0 printed no parameter count or no "
                  "DDP loss: the given part of the program must run first")
        return
    units = [int(x) for x in head.group(2).split()]
    why = what_is_wrong("ZeRO-1", many, ranks, units, ddp) or \
        what_is_wrong("ZeRO-2", many, ranks, units, ddp)
    v.add("zero12", not why, f"ZeRO-1 and ZeRO-2 on {ranks} ranks: DDP's losses, the formula's "
          "bytes", why)
    why = what_is_wrong("ZeRO-3", many, ranks, units, ddp)
    v.add("zero3", not why, f"ZeRO-3 on {ranks} ranks: DDP's losses, the formula's bytes", why)
    mine = losses(many.logs.get(0, ""))
    theirs = losses(check.reference.logs.get(0, ""))
    alike = set(mine) == set(theirs) and all(
        len(mine[s]) == len(theirs[s]) and all(abs(a - b) <= LOSS_TOL for a, b in zip(mine[s], theirs[s]))
        for s in mine)
    compare.judge_run(check, f"your four runs on {ranks} ranks give the solution's losses",
                      "" if alike else "the losses differ from the solution's")
