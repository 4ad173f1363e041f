"""For rules that judge a TODO across several runs of the student's build (exercises 04 and 05):
what one run shows of each TODO, and where a run that failed stopped.

Evidence: per concept of the rules' LABELS, "ok", a failure (its text, prefixed with the run's
description) or "unreached" (why), the first failure kept; `numbers` marks the concepts whose
failure is a number (a loss), not a structure, for rules that report a number only where no
earlier TODO explains it. Placer: the TODO of a call site (stops.place) and of a failed run
(stops.explain, cached per run: several judgments ask about one run); a rules file may refine
`explain` (exercise 05 places torch's own errors by their symptom)."""
from . import stops


class Evidence:
    def __init__(self, name, describe):
        self.name, self.describe, self.state = name, describe, {}
        self.numbers = set()  # concepts whose failure is a number (a loss), not a structure

    def fail(self, concept, text, numbers=False):
        if self.state.get(concept, ("", ""))[0] != "fail":
            self.state[concept] = ("fail", f"in {self.describe(self.name)} {text}")
            if numbers:
                self.numbers.add(concept)

    def unreached(self, concept, text):
        if concept not in self.state:
            self.state[concept] = ("unreached", text)

    def ok(self, concept):
        if concept not in self.state:
            self.state[concept] = ("ok", "")

    def good(self, concept):
        return self.state.get(concept, ("ok",))[0] == "ok"


def needs(e, concepts):
    """The first of `concepts` this run does not show right (its TODO must be fixed first)."""
    return next((c for c in concepts if not e.good(c)), None)


class Placer:
    """The places of the student's lines (a call site -> its TODO) and of failed runs."""

    def __init__(self, check, collective_files):
        self.check, self.v, self.files = check, check.verdicts, collective_files
        self.stops = {}

    def todo_of(self, site):
        c = self.check
        return stops.place(site, c.source, c.args.exercise, self.files, self.v)[0]

    def stop(self, run):
        """(todo, text) of a run that failed: the TODO whose line it stopped in, or None."""
        if run.dir not in self.stops:
            self.stops[run.dir] = self.explain(run)
        return self.stops[run.dir]

    def placed(self, run):
        """stops.explain's Stop of a failed run."""
        c = self.check
        return stops.explain(run, c.source, c.args.exercise, self.files, self.v)

    def explain(self, run, s=None):
        """(todo, text) of the Stop `s` (placed(run) when not given)."""
        s = s or self.placed(run)
        # Only a line the error names is the TODO's: a rank's last collective before a crash
        # elsewhere (a loss of mismatched shapes) is where it was, not what went wrong.
        named = s.todo if s.todo and not (s.where or "").startswith("its last") else None
        return named, s.how + (f" ({s.where})" if s.where else "")


def verdicts(v, found, what, needed, describe, after=None):
    """One verdict per concept of `what` from every run's Evidence (`found`: name -> Evidence):
    ✘ with the first failure; else "not reached" where a run `needed(concept)` names did not
    show it ok; else ✔. `after` (concept -> earlier concepts): a failure by numbers alone of a
    concept one of whose earlier concepts failed by its structure is "not reached" instead (the
    same mistake seen again in the losses)."""
    broken = [c for c in what if any(e.state.get(c, ("",))[0] == "fail" and c not in e.numbers
                                     for e in found.values())]
    for concept, text in what.items():
        states = {name: e.state[concept] for name, e in found.items() if concept in e.state}
        failed = [t for state, t in states.values() if state == "fail"]
        earlier = [c for c in (after or {}).get(concept, ()) if c in broken]
        if failed and earlier and all(concept in e.numbers for e in found.values()
                                      if e.state.get(concept, ("",))[0] == "fail"):
            v.unreached(concept, text, f"its losses need TODO {v.labels[earlier[0]]} first")
            continue
        missing = [states[n][1] if n in states else f"{describe(n)} did not show it"
                   for n in needed(concept) if states.get(n, ("",))[0] != "ok"]
        if failed:
            v.add(concept, False, text, failed[0])
        elif missing:
            v.unreached(concept, text, missing[0])
        else:
            v.add(concept, True, text)
