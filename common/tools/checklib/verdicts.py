"""The verdicts of a check: one row per TODO (or per requirement), printed as ✔/✘ lines and
recorded for `kit list`."""
import hashlib
import json
import os
import sys
import time

CHECK = "\u2714"
CROSS = "\u2718"


class Verdicts:
    """labels: concept -> the exercise's TODO label ("ddp" -> "8"); a name that is not a concept
    (a TODO label, "all") stands for itself."""

    def __init__(self, labels=None):
        self.rows = []
        self.notes = []  # what this check could not judge here, and why (printed, not counted)
        self.labels = labels or {}

    def todo(self, concept):
        return self.labels.get(concept, concept)

    def add(self, concept, ok, what, why=""):
        self.rows.append((self.todo(concept), ok, what, why))

    def print(self, out=sys.stdout):
        for todo, ok, what, why in self.rows:
            mark = CHECK if ok else CROSS
            out.write(f"  {mark} TODO {todo:<5} {what}" + (f": {why}" if why else "") + "\n")
        for todo, text in self.notes:
            out.write(f"  \u00b7 TODO {todo:<5} not judged here ({text})\n")

    def note(self, concept, text):
        """Something this machine cannot show: said, never silently passed."""
        self.notes.append((self.todo(concept), text))


    def failed(self):
        return [t for t, ok, _, _ in self.rows if not ok]

    def passed(self):
        return [t for t, ok, _, _ in self.rows if ok]


def record(path, exercise, source, verdicts):
    """What `kit list` reads: the result of this check, for this exact content of the source."""
    digest = hashlib.sha256(open(source, "rb").read()).hexdigest() if source else ""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    rec = {"exercise": exercise, "source": os.path.abspath(source) if source else "",
           "sha256": digest, "time": time.strftime("%Y-%m-%d %H:%M"),
           "passed": [t for t, ok, _, _ in verdicts.rows if ok],
           "failed": [t for t, ok, _, _ in verdicts.rows if not ok]}
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
