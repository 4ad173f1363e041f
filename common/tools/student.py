#!/usr/bin/env python3
"""The student's files of each exercise: what `./kit list, hint, diff, stage, reset, restore,
backups` do. (`./kit check` is common/tools/check.py.)

The files are the [[files]] of exercises/<name>/info.toml (their "exercise" paths: the trainer,
the job script). Stages come from common/tools/stages.py. Before `stage`, `reset` or `restore`
overwrite a file, the student's version of every file of the exercise is saved to
.kit/backups/<name>/<N>/ (contents and file modes; nothing is ever deleted there).

How many TODOs are done:
  * by behaviour, when `./kit check` (the trainer) or `./kit check --job` (the job script) has
    judged this very content of the file (both record their verdicts with the file's SHA-256
    in .kit/check/<name>.json, the job script's under "job");
  * otherwise estimated from the source: a TODO counts as done when its solution's code lines
    are in the file, or when its `TODO n:` comment is gone and the lines it replaces are gone
    too (students often leave the comments, so the comments alone would under-count).

usage: student.py list
       student.py hint EX TODO
       student.py diff EX [K | --solution]
       student.py stage EX K
       student.py reset EX
       student.py restore EX [N]
       student.py backups EX
Errors (unknown exercise, stage or backup out of range, unknown TODO) change nothing and exit 2.
"""
import difflib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(TOOLS))
STATE = os.path.join(ROOT, ".kit")


class Refused(Exception):
    """A usage error: reported as one line, nothing changed, exit 2."""


def stages(*args):
    p = subprocess.run([sys.executable, os.path.join(TOOLS, "stages.py")] + list(args),
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise Refused(p.stderr.strip().removeprefix("stages.py: ") or f"stages.py {args[0]} failed")
    return p.stdout


def exercises():
    base = os.path.join(ROOT, "exercises")
    return sorted(d for d in os.listdir(base) if os.path.isfile(os.path.join(base, d, "info.toml")))


def info(ex):
    if ex not in exercises():
        raise Refused(f"unknown exercise '{ex}' (./kit list shows them)")
    return json.loads(stages("info", ex))


def todos(ex):
    return json.loads(stages("todos", ex, "--json"))


def last_stage(ex):
    return int(stages("count", ex).strip())


def stage_number(ex, k):
    last = last_stage(ex)
    if not re.fullmatch(r"[0-9]+", k or "") or not 0 <= int(k) <= last:
        raise Refused(f"stage '{k}' is out of range for {ex}: stages are 0 (the exercise as "
                      f"shipped) to {last} (every TODO done)")
    return int(k)


def render(ex, k):
    """{repo-relative path: text} of stage k (every file of the exercise)."""
    with tempfile.TemporaryDirectory() as tmp:
        stages("stage", ex, str(k), tmp)
        out = {}
        for f in info(ex)["files"]:
            with open(os.path.join(tmp, os.path.basename(f["exercise"])), encoding="utf-8") as g:
                out[f["exercise"]] = g.read()
        return out


def read_bytes(rel):
    try:
        with open(os.path.join(ROOT, rel), "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def sha256(data):
    return hashlib.sha256(data).hexdigest() if data is not None else None


# --- how far the student is ------------------------------------------------------------------------
def labels_of(rows, path):
    seen = []
    for r in sorted((r for r in rows if r["file"] == path), key=lambda r: r["first"]):
        if r["todo"] not in seen:
            seen.append(r["todo"])
    return seen


def width(label):
    lo, _, hi = label.partition("-")
    return int(hi or lo) - int(lo) + 1


def code_line(line, lang):
    line = line.strip()
    if lang == "cpp":
        line = re.sub(r"\s*//.*$", "", line)
    elif line.startswith("#") and not line.startswith(("#SBATCH", "#!")):
        return ""  # a shell comment
    return " ".join(line.split())


def done_in_source(text, rows, label, lang):
    mine = {code_line(l, lang) for l in text.splitlines()} - {""}
    blocks = [r for r in rows if r["todo"] == label]
    code = [code_line(l, lang) for b in blocks for l in b["code"].splitlines()]
    code = [l for l in code if l]
    if code and all(l in mine for l in code):
        return True
    comment_left = re.search(r"(//|#)\s*TODO\s+" + re.escape(label) + r":", text)
    old = [code_line(l, lang) for b in blocks for l in b["removed"].splitlines()]
    old = [l for l in old if l]
    return not comment_left and not (old and all(l in mine for l in old))


def progress(ex, rows, f):
    """(done labels, all labels, how it was judged) for one file of an exercise."""
    path, lang = f["exercise"], f.get("lang", "cpp")
    labels = labels_of(rows, path)
    data = read_bytes(path)
    text = data.decode("utf-8", "replace") if data is not None else ""
    try:
        with open(os.path.join(STATE, "check", ex + ".json")) as g:
            rec = json.load(g)
    except (OSError, ValueError):
        rec = {}
    if lang == "cpp" and rec.get("sha256") == sha256(data) and data is not None:
        # A TODO the check gave no verdict (one judged only on a GPU, one the run never reached)
        # is neither done nor undone by behaviour: the source says which, so that a finished
        # file does not ask for an exercise's lines back.
        passed, failed = rec.get("passed", []), rec.get("failed", [])
        done = [l for l in labels if l in passed or
                (l not in failed and done_in_source(text, rows, l, lang))]
        return done, labels, f"by behaviour: your last ./kit check of this file ({rec.get('time')})"
    job = rec.get("job") or {}
    if lang == "bash" and job.get("sha256") == sha256(data) and data is not None:
        done = [l for l in labels if l in job.get("passed", [])]
        return done, labels, (f"by behaviour: your last ./kit check {ex[:2]} --job of this file "
                              f"({job.get('time')})")
    done = [l for l in labels if done_in_source(text, rows, l, lang)]
    how = "estimated from the source"
    if lang == "cpp":
        how += f"; ./kit check {ex[:2]} judges by behaviour"
    elif lang == "bash":
        how += f"; ./kit check {ex[:2]} --job judges by behaviour"
    return done, labels, how


def count(labels):
    return sum(width(l) for l in labels)


def cmd_list():
    for ex in exercises():
        i = info(ex)
        print(f"{ex}  {i.get('title', '')}")
        rows = todos(ex)
        for f in i["files"]:
            done, labels, how = progress(ex, rows, f)
            if not labels:  # a file to use as it is (exercise 00's job script)
                print(f"    {f['exercise']}: no TODOs, ready to use")
                continue
            nxt = next((l for l in labels if l not in done), None)
            print(f"    {f['exercise']}: {count(done)} of {count(labels)} TODOs done"
                  + (f", next: TODO {nxt}" if nxt else "") + f"  [{how}]")


def cmd_hint(ex, todo):
    i = info(ex)
    hints = i.get("hints", {})
    label = todo if todo in hints else next(
        (l for l in hints if "-" in l and re.fullmatch(r"[0-9]+", todo or "") and
         int(l.split("-")[0]) <= int(todo) <= int(l.split("-")[1])), None)
    if label is None:
        raise Refused(f"exercise {ex} has no TODO '{todo}' (its TODOs: {', '.join(hints)})")
    print(f"TODO {label}: {hints[label]}")


# --- diff -------------------------------------------------------------------------------------------
def cmd_diff(ex, k=None):
    i = info(ex)
    rows = todos(ex)
    final = last_stage(ex)
    # --solution: the last stage, every TODO done; the same code as the solution's files (bar
    # the job script's header and binary name), so that a student who has passed everything can
    # compare their way of writing it with the course's.
    solution = k == "--solution"
    if solution:
        k = str(final)
    fixed = stage_number(ex, k) if k is not None else None
    renders = {}
    for f in i["files"]:
        path = f["exercise"]
        if fixed is None:
            done, labels, how = progress(ex, rows, f)
            if not labels:  # a file to use as it is (exercise 00's job script)
                print(f"    {f['exercise']}: no TODOs, ready to use")
                continue
            nxt = next((l for l in labels if l not in done), None)
            stage = int(nxt.split("-")[-1]) if nxt else final
            why = f"next: TODO {nxt}, {how}" if nxt else f"every TODO done, {how}"
        elif solution:
            stage, why = fixed, "the solution: every TODO done"
        else:
            stage, why = fixed, "as asked"
        if stage not in renders:
            renders[stage] = render(ex, stage)
        theirs = renders[stage][path]
        data = read_bytes(path)
        mine = data.decode("utf-8", "replace") if data is not None else ""
        print(f"== {path} against stage {stage} ({why})")
        if mine == theirs:
            print(f"   identical: this file is stage {stage}")
            continue
        print("   lines with '+' are in stage %d and missing from yours; '-' are yours only" % stage)
        sys.stdout.writelines(difflib.unified_diff(
            mine.splitlines(True), theirs.splitlines(True), f"yours: {path}", f"stage {stage}: {path}"))
        if not mine.endswith("\n") and mine:
            print()


# --- backups, stage, reset, restore ----------------------------------------------------------------
def backup_dir(ex):
    return os.path.join(STATE, "backups", ex)


def backups(ex):
    d = backup_dir(ex)
    if not os.path.isdir(d):
        return []
    return sorted((int(n) for n in os.listdir(d)
                   if n.isdigit() and os.path.isfile(os.path.join(d, n, "manifest.json"))))


def manifest(ex, n):
    with open(os.path.join(backup_dir(ex), str(n), "manifest.json")) as f:
        return json.load(f)


def snapshot(ex):
    """{path: (bytes or None, mode or None)} of the student's files now."""
    out = {}
    for f in info(ex)["files"]:
        p = os.path.join(ROOT, f["exercise"])
        data = read_bytes(f["exercise"])
        out[f["exercise"]] = (data, os.stat(p).st_mode & 0o7777 if data is not None else None)
    return out


def stored(ex, n):
    m = manifest(ex, n)
    out = {}
    for path, meta in m["files"].items():
        if meta is None:
            out[path] = (None, None)
        else:
            with open(os.path.join(backup_dir(ex), str(n), "files", path), "rb") as f:
                out[path] = (f.read(), meta["mode"])
    return out


def save_backup(ex, why):
    """Saves the student's files; returns the backup's number (an existing one if identical)."""
    now = snapshot(ex)
    have = backups(ex)
    if have and stored(ex, have[-1]) == now:
        return have[-1], False
    n = (have[-1] + 1) if have else 1
    d = os.path.join(backup_dir(ex), str(n))
    tmp = d + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    files = {}
    for path, (data, mode) in now.items():
        if data is None:
            files[path] = None
            continue
        dest = os.path.join(tmp, "files", path)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "wb") as f:
            f.write(data)
        files[path] = {"mode": mode, "sha256": sha256(data)}
    os.makedirs(tmp, exist_ok=True)
    with open(os.path.join(tmp, "manifest.json"), "w") as f:
        json.dump({"exercise": ex, "made": time.strftime("%Y-%m-%d %H:%M:%S"), "why": why,
                   "files": files}, f, indent=1)
    os.rename(tmp, d)  # complete or not there at all
    return n, True


def write_files(ex, contents):
    """contents: {path: (bytes or None, mode or None)}; None bytes removes the file."""
    for path, (data, mode) in contents.items():
        p = os.path.join(ROOT, path)
        if data is None:
            if os.path.exists(p):
                os.remove(p)
            continue
        os.makedirs(os.path.dirname(p), exist_ok=True)
        tmp = p + ".kit-tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        if mode is None:
            mode = os.stat(p).st_mode & 0o7777 if os.path.exists(p) else 0o644
        os.chmod(tmp, mode)
        os.replace(tmp, p)


def rendered_contents(ex, k):
    execs = {f["exercise"]: f.get("executable", False) for f in info(ex)["files"]}
    out = {}
    for path, text in render(ex, k).items():
        p = os.path.join(ROOT, path)
        mode = os.stat(p).st_mode & 0o7777 if os.path.exists(p) else 0o644
        if execs.get(path) and not mode & 0o111:
            mode |= 0o111
        out[path] = (text.encode("utf-8"), mode)
    return out


def replace_with(ex, contents, why, done):
    now = snapshot(ex)
    if all(now.get(p, (None,))[0] == c[0] for p, c in contents.items()):
        print(f"kit: nothing to do: your files already are {done}")
        return
    n, new = save_backup(ex, why)
    write_files(ex, contents)
    for path in contents:
        print(f"kit: {path} is now {done}")
    print(f"kit: your version is in backup {n}{'' if new else ' (saved before)'}: "
          f"./kit restore {ex[:2]} {n} brings it back")


def cmd_stage(ex, k):
    k = stage_number(ex, k)
    replace_with(ex, rendered_contents(ex, k), f"before ./kit stage {ex} {k}", f"stage {k}")


def cmd_reset(ex):
    info(ex)
    replace_with(ex, rendered_contents(ex, 0), f"before ./kit reset {ex}",
                 "the exercise as shipped (stage 0)")


def cmd_restore(ex, n=None):
    info(ex)
    have = backups(ex)
    if not have:
        raise Refused(f"no backups of {ex} yet (./kit stage and ./kit reset make them)")
    if n is None:
        n = str(have[-1])
    if not n.isdigit() or int(n) not in have:
        raise Refused(f"no backup '{n}' of {ex}: there are {', '.join(map(str, have))} "
                      f"(./kit backups {ex[:2]} lists them)")
    n = int(n)
    m = manifest(ex, n)
    replace_with(ex, stored(ex, n), f"before ./kit restore {ex} {n}",
                 f"backup {n} (made {m['made']}, {m['why']})")


def cmd_backups(ex):
    info(ex)
    have = backups(ex)
    if not have:
        print(f"no backups of {ex} yet")
    now = snapshot(ex)
    for n in have:
        m = manifest(ex, n)
        same = " = your files now" if stored(ex, n) == now else ""
        print(f"  {n:>3}  {m['made']}  {m['why']}{same}")


def main(argv):
    cmd, args = (argv[0], argv[1:]) if argv else ("", [])
    table = {"list": (cmd_list, 0, 0), "hint": (cmd_hint, 2, 2), "diff": (cmd_diff, 1, 2),
             "stage": (cmd_stage, 2, 2), "reset": (cmd_reset, 1, 1),
             "restore": (cmd_restore, 1, 2), "backups": (cmd_backups, 1, 1)}
    if cmd not in table:
        raise Refused(f"unknown command '{cmd}'")
    fn, lo, hi = table[cmd]
    if not lo <= len(args) <= hi:
        raise Refused(f"{cmd}: wrong number of arguments (./kit --help)")
    if cmd in ("list", "hint", "diff", "backups"):
        # Commands that only print: `./kit list | head` ends them quietly, as it would any Unix
        # tool, instead of a BrokenPipeError. Commands that write files keep Python's handling,
        # so that a closed pipe cannot stop them half-way without a word.
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    fn(*args)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Refused as e:
        sys.stderr.write(f"kit: error: {e}\n")
        sys.exit(2)
