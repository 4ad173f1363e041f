"""The capstone (the news summariser on XSum): which runs, which data, which TODO is which.

The data is a generated corpus in XSum's raw format, prepared as a participant prepares the real
one (`./kit data xsum generate`, then `prepare`: a SentencePiece tokenizer and one HDF5 file), so
the check needs the Python that `./kit data xsum prepare` finds (sentencepiece, h5py, numpy).

The engine runs the build alone, on 2 ranks, with one rank per node, with --strategy zero2,
zero3 and tp (--tp 2) on 2 ranks (FLAG_RUNS) and under the device check; this file adds a run
on 4 ranks (RANKS4), where 4 does not divide the training batches and one rank gets no
evaluation batch. The solution runs with the same flags. A TODO passes when:
  1  every rank joins with kit::setup() on its own device (exercise 01's judge), and the process
     group is closed at the end;
  2  in every epoch the ranks train on disjoint examples, take the same number of steps, and
     together cover as many examples as the solution's run; the validation examples are read
     once each, by one rank;
  3  the copies of the model start every step with the same weights and the gradients were
     averaged by DistributedDataParallel (--strategy ddp);
  4  every reported number is the mean over the ranks (training) or a ratio of sums added up
     over the ranks (evaluation loss and ROUGE), rank 0 alone prints them, rank 0 alone writes
     the model files;
  5  --strategy zero2 runs without DDP, its gradients reduce-scattered (each rank keeps a shard),
     every rank's copy of the weights the same at every step, every step's loss the solution's
     with the same flags; --strategy zero3 the same, its weights all-gathered too (each rank
     keeps only a shard of them);
  6  --strategy tp: the layers' activations all-reduced over the tp group (the model split, not
     copied), the ranks of one split model reading the same batches, every step's loss and every
     printed number (evaluation runs on the gathered whole model) the solution's with the same
     flags;
and the closing row: the run on 2 and on 4 ranks reaches the solution's losses and ROUGE."""
import contextlib
import math
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor

from checklib import compare, engine, judges
from checklib.runs import Locked, kv

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
KIT = os.path.join(ROOT, "kit")

# A small model on few examples: the check looks at behaviour, not at quality. 200 training
# examples in batches of 8 are 25 batches: 2 ranks take 12 steps each and leave one batch out, 4
# ranks take 6 each and leave one out. 20 evaluation examples in batches of 8 are 3 batches: on 2
# ranks 2 and 1, on 4 ranks one rank has none. The learning rate is high enough that the greedy
# summaries hold some of the reference's words after 2 epochs (ROUGE 0.05 and 0.025 rather than
# 0, measured 2026-11-28 on 2 ranks), so that a ROUGE left unreduced shows. Every flag a TODO
# reads differs from its default (kit/train/summariser_args.h). A run on 2 ranks: under 2 s.
RUN_FLAGS = ["--epochs", "2", "--batch-size", "8", "--eval-batch-size", "8",
             "--train-examples", "200", "--eval-examples", "20", "--max-document-len", "48",
             "--max-summary-len", "12", "--d-model", "32", "--heads", "2",
             "--encoder-layers", "1", "--decoder-layers", "1", "--feedforward", "64",
             "--dropout", "0", "--seed", "7", "--show", "2", "--lr", "0.01"]
EPOCHS = 2
BATCH = int(RUN_FLAGS[RUN_FLAGS.index("--batch-size") + 1])
NODES_FLAGS = list(RUN_FLAGS)
NODES_FLAGS[NODES_FLAGS.index("--epochs") + 1] = "1"
NODES_FLAGS += ["--max-steps", "2"]
SHARDED = ("zero2", "zero3")  # TODO 5's strategies, a run and a row each
TP = 2  # TODO 6's run: --strategy tp --tp 2 on 2 ranks (one copy of the model, split in two)
FLAG_RUNS = {k: RUN_FLAGS + ["--strategy", k] for k in SHARDED}
FLAG_RUNS["tp"] = RUN_FLAGS + ["--strategy", "tp", "--tp", str(TP)]
D_MODEL = int(RUN_FLAGS[RUN_FLAGS.index("--d-model") + 1])
RANKS4 = 4
RUN_ENV = {"KIT_TIMEOUT": "15"}
# The generated corpus (common/data/XSUM.md): the summary copies the names of the first sentence.
CORPUS = ["--train", "200", "--validation", "40", "--test", "40", "--seed", "3"]
VOCAB = ["--vocab-size", "1000"]

NUM = r"([0-9.]+|nan|inf)"
LOSS_LINE = re.compile(rf"train loss {NUM}, validation loss {NUM}, ROUGE-1 {NUM}, "
                       rf"ROUGE-2 {NUM}, ROUGE-L {NUM}")
TEST_LINE = re.compile(rf"test loss {NUM}, ROUGE-1 {NUM}, ROUGE-2 {NUM}, ROUGE-L {NUM}")
REPORTED = ("training loss", "validation loss", "validation ROUGE-1", "validation ROUGE-2",
            "validation ROUGE-L")
# Per epoch: the training mean, the validation [loss sum, tokens] and [ROUGE sums, examples];
# then the test's two.
REDUCED = 3 * EPOCHS + 2
LOSS_TOL = 2e-5
# Per-step losses (the trace's, 9 digits) of two runs with the same flags and ranks: the same
# operations in the same order, equal digit for digit here; the tolerance is for another
# machine's summation order.
STEP_TOL = 1e-5
SAVED_FILES = ("model-best.pt", "model-final.pt")
COLLECTIVE_FILES = {"ddp.cpp": "ddp", "zero.cpp": "zero2", "zero3.cpp": "zero3"}
RESULT_LINES = (LOSS_LINE, TEST_LINE)
ALL_REDUCE_WHAT = ("reported numbers cover all ranks (the training mean averaged; the evaluation's "
                   "loss sum and token count, ROUGE sums and example count added up)")
PLACES = {"init": ("kit::Seq2Seq model(", "the line that creates the model"),
          "forward": ("kit::Seq2Seq model(", "the model's options (dropout, sizes)"),
          "update": ("torch::optim::AdamW adamw(", "the line that creates the optimizer"),
          "checkpoint": ("kit::save0(model, args.out_dir + \"/model-best.pt\")", "the best model's save"),
          "final": ("evaluate(model, test,", "the final evaluation")}
LABELS = {"include": "1", "setup": "1", "destroy": "1", "data": "2", "eval-data": "2",
          "ddp": "3", "all_reduce": "4", "print0": "4", "save0": "4", "zero2": "5",
          "zero3": "5", "tp": "6"}


def data_key():
    return CORPUS + VOCAB


def prepare_data(check, directory):
    """The generated corpus, prepared by `./kit data xsum`, as a participant would (made once)."""
    data = os.path.join(directory, "xsum")
    q = lambda s: "'" + s.replace("'", "'\\''") + "'"  # noqa: E731
    script = (f"{q(KIT)} data xsum generate {q(data)} {' '.join(CORPUS)} && "
              f"{q(KIT)} data xsum prepare {q(data)} {' '.join(VOCAB)}")
    try:
        return engine.generated_data(data, ["sh", "-c", script], "xsum.h5")
    except Exception as e:  # one line: what the check could not make, and how to make it
        out = getattr(e, "stderr", b"") or b""
        sys.stderr.write(f"check: the generated XSum corpus could not be prepared: "
                         f"{out.decode(errors='replace').strip().splitlines()[-1:] or e}\n")
        raise SystemExit(2)


def losses(run):
    """Rank 0's printed numbers, in order (each epoch's five, then the test's four)."""
    log = run.logs.get(0, "")
    out = [float(x) for m in LOSS_LINE.finditer(log) for x in m.groups()]
    return out + [float(x) for m in TEST_LINE.finditer(log) for x in m.groups()]


def passes(run, rank, split):
    """The example indices `rank` read of `split`, one list per pass (a pass: consecutive reads
    of that split; training and evaluation alternate)."""
    out, current = [], None
    for kind, fields in run.traces.get(rank, []):
        if kind != "sample":
            continue
        name = fields.split(" ", 1)[0]
        if name != split:
            current = None
            continue
        if current is None:
            current = []
            out.append(current)
        current.append(int(kv(fields)["index"]))
    return out


def train_epochs(run, rank):
    """The training example indices `rank` read, one list per epoch: an epoch ends at the rank's
    epoch report (Metrics::end_epoch). Not by passes: a rank with no evaluation batch reads the
    training split of two epochs one after the other."""
    out, current = [], []
    for kind, fields in run.traces.get(rank, []):
        if kind == "epoch_report":
            out.append(current)
            current = []
        elif kind == "sample" and fields.split(" ", 1)[0] == "train":
            current.append(int(kv(fields)["index"]))
    return out + ([current] if current else [])


def steps_begun(run, rank):
    """The training steps `rank` began in each epoch: the batches it read (its training examples
    over the batch size, rounded up: only the list's last batch is shorter), between its epoch
    reports. A step that hangs in a collective (DDP's broadcast before the forward, its all-reduce
    in the backward) has read its batch, so it counts here though it never ended."""
    return [-(-len(indices) // BATCH) for indices in train_epochs(run, rank)]


def judge_data(v, run, reference, ranks, label):
    """TODO 2 on one run: training batches and evaluation batches shared out."""
    what = f"each rank trains on its own batches, all ranks as many steps ({label})"
    train = [train_epochs(run, r) for r in range(ranks)]
    ref_train = [train_epochs(reference, r) for r in range(reference.ranks)]
    if not any(train):
        if run.finished():
            v.add("data", False, what, "no training example was read")
        else:
            v.unreached("data", what, "the run stopped before the first batch")
        return
    epochs = min(len(t) for t in train)
    problem = ""
    for e in range(epochs):
        sets = [set(t[e]) for t in train]
        union = set().union(*sets)
        total = sum(len(s) for s in sets)
        if ranks > 1 and all(s == union for s in sets):
            problem = (f"all {ranks} ranks read the same {len(union)} training examples in epoch "
                       f"{e + 1}: every rank trains on every batch")
            break
        if total > len(union):
            problem = (f"in epoch {e + 1} {total - len(union)} training example(s) were read by "
                       "more than one rank: the ranks' batches overlap")
            break
        want = len(set().union(*(set(t[e]) for t in ref_train if len(t) > e)))
        ended = all(len(run.events(r, "epoch_report")) > e for r in range(ranks))
        if ended and len(union) < want:
            problem = (f"in epoch {e + 1} the ranks read {len(union)} training examples together, "
                       f"the solution's {want}: batches were left out that every rank could take")
            break
    begun = [steps_begun(run, r) for r in range(ranks)]
    for e in range(min(map(len, begun)) if not problem else 0):
        counts = [b[e] for b in begun]
        if len(set(counts)) > 1:
            problem = (f"in epoch {e + 1} the ranks began different numbers of training steps "
                       f"({', '.join(map(str, counts))}): a rank with a step more waits in its "
                       "gradients' collective for ranks that have gone on (every rank must take "
                       "as many steps as the others)")
            break
    v.add("data", not problem, what, problem)

    what = f"each validation example is evaluated once, by one rank ({label})"
    valid = [passes(run, r, "validation") for r in range(ranks)]
    ref_valid = set().union(*(set(p[0]) for r in range(reference.ranks)
                              for p in [passes(reference, r, "validation")] if p))
    firsts = [p[0] if p else [] for p in valid]
    if not any(firsts):
        if run.finished():
            v.add("eval-data", False, what, "no validation example was read")
        else:
            v.unreached("eval-data", what, "the run stopped before the first evaluation")
        return
    union = set().union(*map(set, firsts))
    total = sum(map(len, firsts))
    if ranks > 1 and all(set(f) == union for f in firsts):
        why = f"all {ranks} ranks evaluated all {len(union)} validation examples"
    elif total > len(union):
        why = f"{total - len(union)} validation example(s) were evaluated by more than one rank"
    elif union != ref_valid:
        why = (f"together the ranks evaluated {len(union)} of the {len(ref_valid)} validation "
               "examples")
    else:
        why = ""
    v.add("eval-data", not why, what, why)


def judge_sharded(v, check, data_ok, strategy):
    """TODO 5 on the run with --strategy `strategy` (zero2 or zero3): a row of its own."""
    what = {"zero2": "--strategy zero2: no DDP, the gradients reduce-scattered, every rank's "
                     "weights the same at every step, the solution's losses",
            "zero3": "--strategy zero3: no DDP, the weights all-gathered and the gradients "
                     "reduce-scattered, the solution's losses"}[strategy]
    mine, theirs = check.flag_runs.get(strategy, (None, None))
    if mine is None:
        v.unreached(strategy, what, "the runs before it did not finish")
        return
    if not mine.finished():
        v.add(strategy, False, what, f"the run with --strategy {strategy} fails: {mine.failure()}")
        return
    ranks = mine.ranks
    kinds = [[kv(f).get("kind") for f in mine.events(r, "coll")] for r in range(ranks)]
    problem = ""
    if any(mine.events(r, "ddp") for r in range(ranks)):
        problem = (f"the model is still wrapped in DistributedDataParallel: ZeRO-{strategy[-1]} "
                   "averages the gradients itself (twice over, with DDP)")
    elif not all("reduce_scatter" in k for k in kinds):
        problem = ("no gradient was reduce-scattered: every rank still keeps every averaged "
                   "gradient and all of AdamW's state")
    elif strategy == "zero3" and not all("all_gather" in k for k in kinds):
        problem = ("no weight was all-gathered: every rank still keeps the whole model (ZeRO-2's "
                   "sharding, not ZeRO-3's)")
    else:
        fps = [{kv(f)["step"]: kv(f)["params"] for f in mine.events(r, "forward")}
               for r in range(ranks)]
        differ = [s for s in sorted(set.intersection(*map(set, fps)), key=int)
                  if len({f[s] for f in fps}) > 1]
        if differ:
            problem = f"the ranks start step {differ[0]} with different weights"
        else:
            # Every step's loss on every rank (the trace's, before any report is reduced: what
            # TODO 4 does to the printed numbers is judged on its own).
            problem = step_problem(mine, theirs, strategy)
            if problem and not data_ok:  # other batches give other losses: TODO 2's ✘ says why
                v.unreached(strategy, what, f"its losses follow TODO {v.todo('data')}'s "
                            "batches, which fail above")
                return
    v.add(strategy, not problem, what, problem)


def step_problem(mine, theirs, strategy):
    """The first step loss of `mine` on any rank that is not the solution's run's with the same
    flags, in words; "" when every one is."""
    for r in range(mine.ranks):
        a, b = step_losses(mine, r), step_losses(theirs, r)
        k = next((i for i, (x, y) in enumerate(zip(a, b))
                  if not math.isclose(x, y, rel_tol=STEP_TOL, abs_tol=0)), None)
        if k is None and len(a) == len(b):
            continue
        k = min(len(a), len(b)) if k is None else k
        return (f"rank {r}'s step {k + 1} loss is {a[k] if k < len(a) else 'missing'}, the "
                f"solution's {b[k] if k < len(b) else 'missing'} (the same flags with "
                f"--strategy {strategy})")
    return ""


def judge_split(v, check, data_ok):
    """TODO 6 on the run with --strategy tp --tp TP on TP ranks: one model split over them."""
    what = (f"--strategy tp: the layers split over the {TP} ranks (their activations all-reduced "
            "over the tp group), which read the same batches; the solution's losses and scores")
    mine, theirs = check.flag_runs.get("tp", (None, None))
    if mine is None:
        v.unreached("tp", what, "the runs before it did not finish")
        return
    ranks = mine.ranks
    epochs = [train_epochs(mine, r) for r in range(ranks)]
    # The examples each rank read first, as far as every rank got (a run whose tp ranks read
    # batches of other lengths stops in the first all-reduce, whose sizes differ).
    firsts = [[i for e in ep for i in e] for ep in epochs]
    seen = min(map(len, firsts))
    differ = ranks > 1 and seen > 0 and any(f[:seen] != firsts[0][:seen] for f in firsts[1:])
    data_problem = (f"the {ranks} ranks of one split model read different training batches: each "
                    "computes its slice of every layer, so they must read the same ones (the "
                    "batches are shared out over the copies of the model, mesh.dp_rank())")
    if not mine.finished():
        why = (f"{data_problem}; the run stops: {mine.failure()}" if differ
               else f"the run with --strategy tp fails: {mine.failure()}")
        v.add("tp", False, what, why)
        return
    group = ",".join(str(r) for r in range(ranks))
    # An activation all-reduced over the tp group: [batch, length, d_model] (the row layers' sums).
    split = [[f for f in map(kv, mine.events(r, "coll")) if f.get("kind") == "all_reduce"
              and f.get("group") == group and f.get("shape", "").count(",") == 2
              and f.get("shape", "").endswith(f",{D_MODEL}]")] for r in range(ranks)]
    problem = ""
    if not all(split):
        problem = ("no activation was all-reduced over the tp group: every rank computes the whole "
                   "model (nothing is split)")
    elif any(e != epochs[0] for e in epochs[1:]):
        problem = data_problem
    else:
        problem = step_problem(mine, theirs, "tp")
        if problem and not data_ok:  # other batches give other losses: TODO 2's ✘ says why
            v.unreached("tp", what, f"its losses follow TODO {v.todo('data')}'s batches, which "
                        "fail above")
            return
        if not problem:
            ok, a, b = same_numbers(mine, theirs)
            reports_ok = not any(t == v.todo("all_reduce") and ok_ is False
                                 for t, ok_, _, _ in v.rows)
            if not ok and not reports_ok:  # TODO 4's reports are wrong: its ✘ says why
                v.unreached("tp", what, f"its printed numbers follow TODO "
                            f"{v.todo('all_reduce')}'s reports, which fail above")
                return
            if not ok:
                problem = (f"the printed losses and ROUGE scores {a[-4:]} differ from the "
                           f"solution's {b[-4:]} with the same flags: evaluation and saving run "
                           "on the whole model, which must hold the trained weights")
    v.add("tp", not problem, what, problem)


def step_losses(run, rank):
    return [float(kv(f)["loss"]) for f in run.events(rank, "step") if "loss" in kv(f)]


def run4(check):
    """The student's build and the solution on RANKS4 ranks, at once."""
    a = check.args
    with ThreadPoolExecutor(1) as pool:
        mine = pool.submit(check.launch, a.binary, f"ranks{RANKS4}", RANKS4, "node", check.data,
                           RUN_FLAGS)
        # One solution run at a time per flag set, shared between checks (--reference-dir).
        with Locked(a.reference_dir) if a.reference_dir else contextlib.nullcontext():
            theirs = engine.reference_run(check, a.reference_dir or check.workdir, check.data,
                                          "four", RUN_FLAGS, ranks=RANKS4)
        return mine.result(), theirs


def same_numbers(mine, theirs):
    a, b = losses(mine), losses(theirs)
    ok = bool(a) and len(a) == len(b) and all(
        math.isclose(x, y, rel_tol=1e-4, abs_tol=LOSS_TOL) for x, y in zip(a, b))
    return ok, a, b


def judge(check):
    v, many, ranks = check.verdicts, check.many, check.ranks
    joined = judges.check_setup(v, many, check.nodes, check.source, ranks)
    four = four_ref = None
    if joined:
        judge_data(v, many, check.reference, ranks, f"{ranks} ranks")
        if many.finished():
            four, four_ref = run4(check)
            if four.finished():
                judge_data(v, four, four_ref, RANKS4, f"{RANKS4} ranks")
            else:
                v.add("data", False, f"the run on {RANKS4} ranks gets to its end",
                      four.failure() or "it did not finish")
        judges.check_ddp(v, many, ranks)
    else:
        for concept in ("data", "ddp"):
            v.add(concept, False, "needs setup()", "without it every process is rank 0 of 1",
                  cause="setup")
    judges.check_all_reduce(v, many, ranks, check.rules)
    judges.check_print0(v, many, ranks, check.rules)
    judges.check_save0(v, many, ranks, check.rules)
    judges.check_destroy(v, many, ranks)
    for strategy in SHARDED:
        if joined and many.finished():
            data_ok = not any(t == v.todo("data") and ok is False for t, ok, _, _ in v.rows)
            judge_sharded(v, check, data_ok, strategy)
        elif joined:
            v.unreached(strategy, f"--strategy {strategy} shards the state", "the run on several "
                        "ranks did not get to its end")
        else:
            v.add(strategy, False, "needs setup()", "without it every process is rank 0 of 1",
                  cause="setup")
    if joined and many.finished():
        data_ok = not any(t == v.todo("data") and ok is False for t, ok, _, _ in v.rows)
        judge_split(v, check, data_ok)
    elif joined:
        v.unreached("tp", "--strategy tp splits the model", "the run on several ranks did not get "
                    "to its end")
    else:
        v.add("tp", False, "needs setup()", "without it every process is rank 0 of 1", cause="setup")
    ok, a, b = same_numbers(many, check.reference)
    differs = "" if ok else f"your numbers {a[-4:]} vs the solution's {b[-4:]}"
    if ok and four is not None:
        ok4, a4, b4 = same_numbers(four, four_ref)
        if not ok4:
            differs = f"on {RANKS4} ranks your numbers {a4[-4:]} vs the solution's {b4[-4:]}"
    compare.judge_run(check, f"your runs on {ranks} and {RANKS4} ranks reach the solution's "
                      "losses and ROUGE scores", differs)
