#!/usr/bin/env python3
"""One annotated source per exercise file -> exercise, solution and every stage checkpoint.

An exercise is described by exercises/<name>/info.toml. Each of its [[files]] has one annotated
source, written once, from which this tool renders:

  * the exercise   (stage 0): every TODO block shows its TODO comment and its exercise lines;
  * stage k        (1 <= k):  blocks numbered <= k show their solution lines instead;
  * the solution   (last stage): every block solved, no TODO comments left.

Annotation syntax (the comment leader is `//` in C++ and `#` in shell scripts):

    //@ todo 8                      a block for TODO 8 ("2-3" for a pair done in one go)
    //@ | Wrap the model in ...     the TODO text shown in the exercise (one or more lines)
    <lines>                         kept in the exercise and in stages < 8
    //@ solution
    <lines>                         replace them in stages >= 8 and in the solution
    //@ end

A TODO may have several blocks (TODO 10 averages three losses at three places). Everything outside
blocks is common to all renderings. A block labelled "a-b" counts as done from stage a on, so
every stage compiles.

A file may also hold variant blocks: lines that differ between the solution FILE and all the
others (exercise and stage checkpoints) but belong to no TODO, e.g. which build a job script runs:

    #@ variant
    <lines>                         in the exercise and in every stage checkpoint
    #@ solution
    <lines>                         in the solution file only
    #@ end

Variant blocks are not TODOs: `todos` and `count` do not list them.

Commands:
  stages.py check                     committed exercise/solution files equal the rendering
  stages.py write                     re-render the committed exercise/solution files
  stages.py stage EX K OUTDIR         write every file of stage K of EX into OUTDIR, by file name
  stages.py count EX [FILE]           print the number of the last stage (of FILE's TODOs)
  stages.py todos EX [--json]         each TODO block: number, file, line in the exercise, code
  stages.py info EX                   the exercise's metadata as JSON
  stages.py program EX                the program's exercise, solution and annotated files (its
                                      first C++ file), relative to the repository
"""
import difflib
import json
import os
import re
import sys
import kit_toml  # tomllib where the Python has it (3.11+), a fallback on 3.9-3.10

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARK = re.compile(r"^(\s*)(//|#)@\s?(.*)$")


class AnnotationError(Exception):
    pass


def load_info(ex):
    path = os.path.join(ROOT, "exercises", ex, "info.toml")
    if not os.path.isfile(path):
        known = ", ".join(list_exercises()) or "none"
        raise AnnotationError(f"unknown exercise '{ex}' (known: {known})")
    with open(path, "rb") as f:
        info = kit_toml.load(f)
    info.setdefault("name", ex)
    return info


def list_exercises():
    base = os.path.join(ROOT, "exercises")
    names = [d for d in sorted(os.listdir(base))
             if os.path.isfile(os.path.join(base, d, "info.toml"))] if os.path.isdir(base) else []
    return names


def parse(path):
    """Split an annotated source into common lines and TODO blocks, in order."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    parts, block, where = [], None, None
    for n, line in enumerate(lines, 1):
        m = MARK.match(line)
        if not m:
            if block is None:
                parts.append(("line", line))
            else:
                block[where].append(line)
            continue
        indent, leader, body = m.groups()
        word = body.split()[0] if body.split() else ""
        if word in ("todo", "variant"):
            if block is not None:
                raise AnnotationError(f"{path}:{n}: TODO block opened inside another")
            label = body.split()[1] if word == "todo" else "variant"
            lo, _, hi = label.partition("-") if word == "todo" else ("0", "", "")
            block = {"label": label, "first": int(lo), "last": int(hi or lo), "indent": indent,
                     "leader": leader, "text": [], "exercise": [], "solution": [], "line": n,
                     "variant": word == "variant"}
            where = "exercise"
        elif body.startswith("|"):
            if block is None or where != "exercise" or block["exercise"]:
                raise AnnotationError(f"{path}:{n}: TODO text belongs right after '@ todo'")
            block["text"].append(body[1:].strip())
        elif word == "solution":
            if block is None:
                raise AnnotationError(f"{path}:{n}: '@ solution' outside a TODO block")
            where = "solution"
        elif word == "end":
            if block is None:
                raise AnnotationError(f"{path}:{n}: '@ end' without a TODO block")
            parts.append(("block", block))
            block = None
        else:
            raise AnnotationError(f"{path}:{n}: unknown annotation '{body}'")
    if block is not None:
        raise AnnotationError(f"{path}: TODO {block['label']} (line {block['line']}) has no '@ end'")
    return parts


def todo_comment(block):
    """The TODO comment a student reads: the text, wrapped under 'TODO n:'."""
    ind, lead = block["indent"], block["leader"]
    head = f"{lead} TODO {block['label']}: "
    out = []
    for i, text in enumerate(block["text"] or [""]):
        out.append(ind + (head if i == 0 else lead + " " * (len(head) - len(lead))) + text)
    return [l.rstrip() for l in out]


def render(parts, stage, solution_file=False):
    """The file as it is at `stage` (0 = exercise). Returns (lines, {block index: first line}).
    solution_file: render the solution file (the last stage, with the variant blocks' solution)."""
    out, where = [], {}
    for kind, item in parts:
        if kind == "line":
            out.append(item)
            continue
        if item["variant"]:
            out.extend(item["solution"] if solution_file else item["exercise"])
            continue
        if stage >= item["first"]:
            where[id(item)] = len(out) + 1
            out.extend(item["solution"])
        else:
            where[id(item)] = len(out) + 1
            out.extend(todo_comment(item))
            out.extend(item["exercise"])
    return out, where


def last_stage(info, only=None):
    """The number of the last TODO (of the file whose name is `only`, if given)."""
    last = 0
    for f in info["files"]:
        if only and os.path.basename(f["exercise"]) != only:
            continue
        for kind, item in parse(os.path.join(ROOT, f["source"])):
            if kind == "block" and not item["variant"]:
                last = max(last, item["last"])
    return last


def lint(info):
    """Rules the build relies on. Stages 1..last-1 are compiled together, each in a namespace of
    its own after every header the exercise and solution include (common/cmake/unity.cmake), so
    a stage that uses a header only a later TODO includes would compile there and fail on its
    own. Hence: #include lines may only be in blocks of the file's first TODO."""
    for f in info["files"]:
        if f.get("lang", "cpp") != "cpp":
            continue
        parts = parse(os.path.join(ROOT, f["source"]))
        blocks = [b for k, b in parts if k == "block" and not b["variant"]]
        first = min((b["first"] for b in blocks), default=0)
        for b in blocks:
            if b["first"] != first and any(re.match(r"\s*#\s*include", l)
                                           for l in b["exercise"] + b["solution"]):
                raise AnnotationError(
                    f"{f['source']}:{b['line']}: TODO {b['label']} has an #include line; only "
                    f"TODO {first} may (see lint() in common/tools/stages.py)")


def program_file(info):
    """The [[files]] entry of the exercise's program: its first C++ file."""
    for f in info["files"]:
        if f.get("lang", "cpp") == "cpp":
            return f
    raise AnnotationError(f"{info['name']}: info.toml lists no C++ file")


def rendered_files(ex, stage, solution_file=False):
    info = load_info(ex)
    final = last_stage(info)
    if not 0 <= stage <= final:
        raise AnnotationError(f"stage {stage} is out of range for {ex}: stages are 0..{final}")
    result = []
    for f in info["files"]:
        lines, _ = render(parse(os.path.join(ROOT, f["source"])), stage, solution_file)
        result.append((f, "\n".join(lines) + "\n"))
    return result


def todos(ex):
    info = load_info(ex)
    rows = []
    for f in info["files"]:
        parts = parse(os.path.join(ROOT, f["source"]))
        _, where = render(parts, 0)
        for kind, item in parts:
            if kind != "block" or item["variant"]:
                continue
            code = item["solution"]
            pad = min((len(l) - len(l.lstrip()) for l in code if l.strip()), default=0)
            rows.append({
                "todo": item["label"], "first": item["first"], "last": item["last"],
                "text": " ".join(item["text"]),
                "file": f["exercise"], "line": where[id(item)],
                "lang": f.get("lang", "cpp"),
                "code": "\n".join(l[pad:] for l in code),
                "removed": "\n".join(item["exercise"]),
            })
    return rows


def cmd_check_or_write(write):
    stale = []
    for ex in list_exercises():
        info = load_info(ex)
        lint(info)
        final = last_stage(info)
        for stage, key in ((0, "exercise"), (final, "solution")):
            for f, text in rendered_files(ex, stage, key == "solution"):
                path = os.path.join(ROOT, f[key])
                old = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
                if old == text:
                    continue
                if write:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    with open(path, "w", encoding="utf-8") as out:
                        out.write(text)
                    if f.get("executable"):
                        os.chmod(path, 0o755)
                    print(f"wrote {f[key]}")
                else:
                    stale.append(f[key])
                    diff = difflib.unified_diff(old.splitlines(), text.splitlines(),
                                                f[key] + " (committed)", f[key] + " (generated)",
                                                lineterm="", n=1)
                    sys.stderr.write("\n".join(list(diff)[:40]) + "\n")
    if stale:
        sys.stderr.write("stages.py: generated files differ from their annotated source: "
                         + ", ".join(stale) + " (edit the .annotated source, then run "
                         "`common/tools/stages.py write`)\n")
        return 1
    return 0


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) >= 2 else 2
    cmd, args = argv[1], argv[2:]
    if cmd == "check":
        return cmd_check_or_write(False)
    if cmd == "write":
        return cmd_check_or_write(True)
    if cmd == "stage" and len(args) == 3:
        ex, k, outdir = args[0], int(args[1]), args[2]
        for f, text in rendered_files(ex, k):
            path = os.path.join(outdir, os.path.basename(f["exercise"]))
            os.makedirs(outdir, exist_ok=True)
            old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
            if old != text:   # keep timestamps, so that make rebuilds only what changed
                with open(path, "w", encoding="utf-8") as out:
                    out.write(text)
        return 0
    if cmd == "count" and len(args) in (1, 2):
        info = load_info(args[0])
        lint(info)
        print(last_stage(info, args[1] if len(args) == 2 else None))
        return 0
    if cmd == "todos" and len(args) in (1, 2):
        rows = todos(args[0])
        if "--json" in args:
            print(json.dumps(rows, indent=1))
        else:
            for r in rows:
                print(f"TODO {r['todo']:>5}  {r['file']}:{r['line']}  {r['text'][:60]}")
        return 0
    if cmd == "program" and len(args) == 1:
        f = program_file(load_info(args[0]))
        print(f["exercise"], f["solution"], f["source"])
        return 0
    if cmd == "info" and len(args) == 1:
        print(json.dumps(load_info(args[0]), indent=1))
        return 0
    sys.stderr.write(f"stages.py: bad command line: {' '.join(argv[1:])} (see --help)\n")
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except (AnnotationError, ValueError, OSError) as e:
        sys.stderr.write(f"stages.py: {e}\n")
        sys.exit(2)
