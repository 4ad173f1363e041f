"""A build that failed: the compiler's first error in the student's file, and the TODO it belongs
to (or the TODO that brings what the compiler misses). Also the TODOs judged elsewhere."""
import difflib
import json
import os
import re
import subprocess
import sys

from .runs import read
from .verdicts import CROSS

TOOLS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES_PY = os.path.join(TOOLS, "stages.py")


DIAG = re.compile(r"^(?P<path>[^:\s][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)?\s*"
                  r"(?P<kind>fatal error|error|warning|note)?:?\s*(?P<msg>.*)$")
QUOTED = re.compile(r"[\u2018'`]([A-Za-z_][A-Za-z0-9_:]*)[\u2019']")


def stages_json(*args):
    out = subprocess.run([sys.executable, STAGES_PY] + list(args), capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    return json.loads(out.stdout)


def annotated_parts(exercise, source):
    """The annotated source's parts for the file `source` is a version of (matched by name)."""
    sys.path.insert(0, TOOLS)
    import stages  # noqa: E402 (the renderer: one parser of the annotation syntax)
    info = stages_json("info", exercise)
    base = os.path.basename(source)
    for f in info.get("files", []):
        if os.path.basename(f["exercise"]) == base or os.path.basename(f["solution"]) == base:
            return stages.parse(os.path.join(stages.ROOT, f["source"]))
    files = info.get("files", [])
    return stages.parse(os.path.join(stages.ROOT, files[0]["source"])) if files else []


def norm(line):
    return " ".join(line.split())


def todo_at(parts, lines, lineno):
    """The TODO block the student's line `lineno` (1-based) belongs to, or None: the common lines
    of the annotated source are aligned with the student's file, and the line is placed in the
    gap between two of them; several TODO blocks in one gap are told apart by similarity."""
    units = []  # ("line", text) / ("block", block) in order
    for kind, item in parts:
        units.append((kind, norm(item) if kind == "line" else item))
    common = [(i, t) for i, (k, t) in enumerate(units) if k == "line" and t]
    mine = [norm(l) for l in lines]
    sm = difflib.SequenceMatcher(None, [t for _, t in common], mine, autojunk=False)
    placed = {}  # unit index -> student line (1-based)
    for a, b, size in sm.get_matching_blocks():
        for k in range(size):
            placed[common[a + k][0]] = b + k + 1
    before = max((u for u, l in placed.items() if l <= lineno), default=-1)
    if placed.get(before) == lineno:
        return None  # a line outside every TODO block
    after = min((u for u, l in placed.items() if l > lineno), default=len(units))
    blocks = [units[u][1] for u in range(before + 1, after)
              if units[u][0] == "block" and not units[u][1].get("variant")]
    if len(blocks) <= 1:
        return blocks[0] if blocks else None
    text = mine[lineno - 1] if 0 < lineno <= len(mine) else ""
    m = re.search(r"TODO\s+(\d+(?:-\d+)?)\s*:", text)
    if m:
        return next((b for b in blocks if b["label"] == m.group(1)), blocks[0])

    def score(b):
        cands = [norm(l) for l in b["solution"] + b["exercise"] + b["text"] if l.strip()]
        return max((difflib.SequenceMatcher(None, text, c).ratio() for c in cands), default=0)
    return max(blocks, key=score)


def provider(parts, identifier):
    """The first TODO block whose solution brings `identifier` (declares it, includes it)."""
    word = re.compile(r"\b" + re.escape(identifier.split("::")[-1]) + r"\b")
    for kind, item in parts:
        if kind == "block" and not item.get("variant") and any(word.search(l) for l in item["solution"]):
            return item
    return None


def explain_build(exercise, log_path, source):
    log = read(log_path)
    lines = log.splitlines()
    src = os.path.realpath(source)

    def is_mine(path):
        try:
            return os.path.realpath(path) == src or os.path.samefile(path, src)
        except OSError:
            return False
    errors = [i for i, l in enumerate(lines)
              if (m := DIAG.match(l)) and m.group("kind") in ("error", "fatal error")]
    # The first error in the student's file; else the first at all (a template instantiated from
    # their file reports in a header, with a "required from here" line pointing back at them).
    first = next((i for i in errors if is_mine(DIAG.match(lines[i]).group("path"))),
                 errors[0] if errors else None)
    print(f"check {exercise}: {source} does not compile")
    if first is None:
        shown = [l for l in lines if "rror" in l][:15] or lines[-15:]
        print("\n".join("    " + l for l in shown))
        print(f"  {CROSS} the build failed, but not with a compiler error in {source}")
        print("passed: -")
        print("failed: build")
        return 1
    # The first error with its context lines (the code and the caret below it).
    start = first - 1 if first > 0 and ("In function" in lines[first - 1] or
                                        "In member function" in lines[first - 1]) else first
    end = first + 1
    while end < len(lines) and end - first < 12 and lines[end][:1].isspace():
        end += 1
    print("\n".join("    " + l for l in lines[start:end]))
    # Where in the student's file: the error itself, or the "required from here" of its group.
    where, msg = None, DIAG.match(lines[first]).group("msg")
    for l in lines[start:] if is_mine(DIAG.match(lines[first]).group("path")) else \
            lines[max(0, start - 30):first + 30]:
        m = DIAG.match(l)
        if m and is_mine(m.group("path")):
            where = int(m.group("line"))
            break
    try:
        parts = annotated_parts(exercise, source)
    except Exception as e:  # noqa: BLE001 (a missing annotated source must not hide the error)
        parts = []
        sys.stderr.write(f"check: cannot read the annotated source: {e}\n")
    mine = read(source).splitlines()
    block = todo_at(parts, mine, where) if where and parts else None
    why = f"line {where}: {msg}" if where else msg
    named = None
    ident = [i for i in QUOTED.findall(msg) if i not in ("kit", "torch", "std")]
    # GCC's and Clang's words for "this name is unknown here".
    if re.search(r"not declared|not a member|does not name a type|no such file|was not found|"
                 r"undeclared|has no member|no member named|unknown type name|file not found",
                 msg, re.I) and ident:
        giver = provider(parts, ident[0])
        if giver is not None and (block is None or giver["first"] <= block["first"]):
            named = giver
            if block is not None and block is not giver:
                why += f" (in TODO {block['label']}); {ident[0]} comes with TODO {giver['label']}"
            else:
                why += f"; {ident[0]} comes with TODO {giver['label']}"
    if named is None:
        named = block
    if named is not None:
        print(f"  {CROSS} TODO {named['label']:<5} does not compile: {why}")
    elif where is None:
        print(f"  {CROSS} the build failed in {DIAG.match(lines[first]).group('path')}, not in "
              f"{source}: {msg}")
    else:
        print(f"  {CROSS} does not compile: {why} (not inside a TODO block: look at the TODO you "
              "changed last)")
    print("passed: -")
    print(f"failed: {named['label'] if named is not None else 'build'}")
    return 1


def not_judged_note(exercise):
    """A line about the TODOs of the exercise's other files (job scripts), judged elsewhere."""
    try:
        rows = stages_json("todos", exercise, "--json")
    except Exception:  # noqa: BLE001 (only a note)
        return None
    other = sorted({(r["file"], r["first"], r["last"]) for r in rows if r.get("lang", "cpp") != "cpp"},
                   key=lambda t: t[1])
    if not other:
        return None
    files = sorted({f for f, _, _ in other})
    lo, hi = min(a for _, a, _ in other), max(b for _, _, b in other)
    todos, are = (f"TODO {lo}", "is") if lo == hi else (f"TODOs {lo}-{hi}", "are")
    return (f"  \u00b7 {todos} ({', '.join(files)}) {are} not judged here: "
            f"./kit check {exercise[:2]} --job runs the job script on a test Slurm")
