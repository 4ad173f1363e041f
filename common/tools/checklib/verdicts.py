"""The verdicts of a check: one row per TODO (or per requirement), printed as ✔/✘ lines in TODO
order and recorded for `kit list`.

A row is ✔ (ok True), ✘ (ok False) or "not reached" (ok None: the run stopped before anything
this TODO does could be seen, so there is no evidence either way). A ✘ may name its cause, the
TODO whose own mistake it is a consequence of ("needs setup() first"): the one "fix this first"
line names the earliest TODO that failed on its own evidence, never a symptom."""
import hashlib
import json
import os
import re
import sys
import time

CHECK = "\u2714"
CROSS = "\u2718"
UNREACHED = "\u2013"


def order(label):
    """Sort key of a TODO label: "2-3" by 2, then 3; names that are not TODOs ("all") last."""
    numbers = [int(n) for n in re.findall(r"\d+", label)] if re.fullmatch(r"\d+(-\d+)?", label) \
        else []
    return (0, numbers) if numbers else (1, [])


class Verdicts:
    """labels: concept -> the exercise's TODO label ("ddp" -> "8"); a name that is not a concept
    (a TODO label, "all") stands for itself."""

    def __init__(self, labels=None):
        self.rows = []   # (todo, ok, what, why), in the order they were judged
        self.causes = {}  # row index -> the TODO label whose mistake this ✘ follows from
        self.notes = []  # what this check could not judge here, and why (printed, not counted)
        self.labels = labels or {}

    def todo(self, concept):
        return self.labels.get(concept, concept)

    def add(self, concept, ok, what, why="", cause=None, first=False):
        """cause: the concept (or TODO label) whose mistake explains this ✘, when it is not this
        TODO's own evidence that failed. first: shown first among its TODO's rows (where the run
        broke, before what was judged from the part of it that ran)."""
        if first:
            self.causes = {i + 1: c for i, c in self.causes.items()}
        at = 0 if first else len(self.rows)
        if not ok and cause is not None and self.todo(cause) != self.todo(concept):
            self.causes[at] = self.todo(cause)
        self.rows.insert(at, (self.todo(concept), ok, what, why))

    def unreached(self, concept, what, why):
        """The run stopped before this TODO's work could be seen: no verdict, and no advice."""
        self.rows.append((self.todo(concept), None, what, why))

    def ordered(self):
        """The rows in TODO order (a TODO's rows in the order they were judged), "all" last."""
        return [row for _, row in sorted(enumerate(self.rows),
                                         key=lambda ir: (order(ir[1][0]), ir[0]))]

    def print(self, out=sys.stdout):
        for todo, ok, what, why in self.ordered():
            if ok is None:
                out.write(f"  {UNREACHED} TODO {todo:<5} {what}: not reached" +
                          (f" ({why})" if why else "") + "\n")
                continue
            mark = CHECK if ok else CROSS
            out.write(f"  {mark} TODO {todo:<5} {what}" + (f": {why}" if why else "") + "\n")
        for todo, text in self.notes:
            out.write(f"  \u00b7 TODO {todo:<5} not judged here ({text})\n")

    def note(self, concept, text):
        """Something this machine cannot show: said, never silently passed."""
        self.notes.append((self.todo(concept), text))

    def labels_in_order(self, keep):
        seen = []
        for t, ok, _, _ in self.ordered():
            if keep(t, ok) and t not in seen:
                seen.append(t)
        return seen

    def failed(self):
        """Each TODO with a ✘ row, once, in TODO order."""
        return self.labels_in_order(lambda t, ok: ok is False)

    def passed(self):
        """Each TODO whose every row is ✔, once, in TODO order."""
        bad = {t for t, ok, _, _ in self.rows if ok is not True}
        return self.labels_in_order(lambda t, ok: t not in bad)

    def not_reached(self):
        bad = set(self.failed())
        return self.labels_in_order(lambda t, ok: ok is None and t not in bad)

    def first_to_fix(self):
        """The earliest TODO that failed on its own evidence (a ✘ with no cause); else the
        earliest cause named; else the earliest ✘. None when nothing failed."""
        failed = [t for t in self.failed() if order(t)[0] == 0]  # TODO labels only
        own = {t for i, (t, ok, _, _) in enumerate(self.rows) if ok is False and i not in self.causes}
        for t in failed:
            if t in own:
                return t
        causes = sorted(set(self.causes.values()), key=order)
        return causes[0] if causes else (failed[0] if failed else None)


def record(path, exercise, source, verdicts):
    """What `kit list` reads: the result of this check, for this exact content of the source."""
    digest = hashlib.sha256(open(source, "rb").read()).hexdigest() if source else ""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    rec = {"exercise": exercise, "source": os.path.abspath(source) if source else "",
           "sha256": digest, "time": time.strftime("%Y-%m-%d %H:%M"),
           "passed": verdicts.passed(), "failed": verdicts.failed()}
    # `kit check --job` keeps the job script's verdicts in the same file (common/tools/checklib/
    # job.py): a new check of the trainer must not forget them.
    try:
        with open(path) as f:
            job = json.load(f).get("job")
        if job:
            rec["job"] = job
    except (OSError, ValueError, AttributeError):
        pass
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(rec, f)
    os.replace(tmp, path)
