#!/usr/bin/env python3
"""Expand the source references of a deck, so that code and line numbers on slides come from the
sources and can never drift from them.

References, each written inside double square brackets:

  [[todo EX N]]             block: the solution code of TODO N of exercise EX (every block of it),
                            with the file and the line where the TODO sits in the unmodified
                            exercise. N is the TODO's label: 8, 2-3, 14 ...
  [[todo EX N replaces]]    the same, and the exercise lines the solution replaces
  [[where EX N]]            inline: "train.cpp, line 101" (every block of TODO N, joined)
  [[todos EX]]              block: a table of every TODO of EX with its file and line
  [[todos EX FILE]]         the same, only the TODOs in the file named FILE (train.cpp)
  [[file PATH "A" "B"]]     block: the lines of PATH (relative to the repository) from the first
                            line that contains A through the next line that contains B, with the
                            line numbers they have now
  [[file PATH "A"]]         the same, one line
  [[include PATH]]          block: the Markdown file PATH (relative to the repository) as it is,
                            e.g. the table of numbers that slides/tools/plot_metrics.py writes

EX is an exercise folder name (01-transformer-lm-ddp). The data come from
`common/tools/stages.py todos EX --json`. A reference that does not resolve, a malformed one, and
an image that does not exist are errors: the build fails with file:line and the reason.

Usage: refs.py expand DECK.md OUT.md [--repo ROOT] [--resource-path DIR ...]
       refs.py list DECK.md [--repo ROOT]     print each reference and what it resolves to
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_ROOT = os.path.dirname(os.path.dirname(HERE))
REF = re.compile(r"\[\[([^\[\]]*)\]\]")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(`{3,}|~{3,})")
BLOCK_KINDS = ("todo", "todos", "file", "include")
INLINE_KINDS = ("where",)


class RefError(Exception):
    pass


class Resolver:
    def __init__(self, root):
        self.root = root
        self.cache = {}

    def blocks(self, ex):
        if ex not in self.cache:
            tool = os.path.join(self.root, "common", "tools", "stages.py")
            run = subprocess.run([sys.executable, tool, "todos", ex, "--json"],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                raise RefError(f"stages.py todos {ex}: {run.stderr.strip() or 'failed'}")
            self.cache[ex] = json.loads(run.stdout)
        return self.cache[ex]

    def todo(self, ex, label):
        found = [b for b in self.blocks(ex) if b["todo"] == label]
        if not found:
            known = ", ".join(dict.fromkeys(b["todo"] for b in self.blocks(ex)))
            raise RefError(f"exercise {ex} has no TODO {label} (its TODOs: {known})")
        return found


def fence_for(code):
    longest = max((len(m) for m in re.findall(r"`+", code)), default=0)
    return "`" * max(3, longest + 1)


def code_block(code, lang, extra=""):
    """A fenced block; long lines get a smaller font (class .wide or .wider) instead of a scrollbar."""
    width = max((len(l) for l in code.split("\n")), default=0)
    size = " .wider" if width > 108 else " .wide" if width > 88 else ""
    f = fence_for(code)
    return f"{f} {{.{lang}{size}{extra}}}\n{code}\n{f}"


def dedent(text):
    lines = text.split("\n")
    pad = min((len(l) - len(l.lstrip()) for l in lines if l.strip()), default=0)
    return "\n".join(l[pad:] for l in lines)


def location(block):
    return f"`{block['file']}`, line {block['line']} of the unmodified exercise"


def expand_block(args, res):
    kind = args[0]
    if kind == "todo":
        if len(args) not in (3, 4) or (len(args) == 4 and args[3] != "replaces"):
            raise RefError("expected [[todo EXERCISE N]] or [[todo EXERCISE N replaces]]")
        ex, label = args[1], args[2]
        out = []
        for b in res.todo(ex, label):
            out.append(f"::: {{.coderef}}\n[TODO {b['todo']}: {location(b)}]{{.where}}\n")
            if len(args) == 4 and b["removed"].strip():
                out.append("[replace]{.what}\n\n" + code_block(dedent(b["removed"]), b["lang"], " .removed")
                           + "\n\n[with]{.what}\n")
            elif len(args) == 4:
                out.append("[insert]{.what}\n")
            out.append(code_block(b["code"], b["lang"]) + "\n:::")
        return "\n\n".join(out)
    if kind == "todos":
        if len(args) not in (2, 3):
            raise RefError("expected [[todos EXERCISE]] or [[todos EXERCISE FILENAME]]")
        blocks = [b for b in res.blocks(args[1])
                  if len(args) == 2 or os.path.basename(b["file"]) == args[2]]
        if not blocks:
            raise RefError(f"exercise {args[1]} has no TODO in a file named {args[2]}")
        rows = ["| TODO | file | line | task |", "|---:|---|---:|---|"]
        for b in sorted(blocks, key=lambda b: (b["file"], b["line"])):
            task = b["text"].split(". ")[0].rstrip(".").replace("|", "\\|")
            if len(task) > 70:
                task = task[:67].rsplit(" ", 1)[0] + " ..."
            rows.append(f"| {b['todo']} | `{os.path.basename(b['file'])}` | {b['line']} | {task} |")
        return "::: {.todotable}\n" + "\n".join(rows) + "\n:::"
    if kind == "file":
        if len(args) not in (3, 4):
            raise RefError('expected [[file PATH "FIRST"]] or [[file PATH "FIRST" "LAST"]]')
        path = os.path.join(res.root, args[1])
        if not os.path.isfile(path):
            raise RefError(f"no file {args[1]}")
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        start = next((i for i, l in enumerate(lines) if args[2] in l), None)
        if start is None:
            raise RefError(f"{args[1]} has no line containing {args[2]!r}")
        end = start
        if len(args) == 4:
            end = next((i for i in range(start, len(lines)) if args[3] in lines[i]), None)
            if end is None:
                raise RefError(f"{args[1]} has no line containing {args[3]!r} after line {start + 1}")
        lang = {".cpp": "cpp", ".h": "cpp", ".sh": "bash", ".sbatch": "bash", ".py": "python",
                ".toml": "toml", ".txt": "cmake"}.get(os.path.splitext(path)[1], "bash")
        span = f"line {start + 1}" if end == start else f"lines {start + 1}–{end + 1}"
        return (f"::: {{.coderef}}\n[`{args[1]}`, {span}]{{.where}}\n\n"
                + code_block(dedent("\n".join(lines[start:end + 1])), lang) + "\n:::")
    if kind == "include":
        if len(args) != 2:
            raise RefError("expected [[include PATH]]")
        path = os.path.join(res.root, args[1])
        if not os.path.isfile(path):
            raise RefError(f"no file {args[1]}")
        with open(path, encoding="utf-8") as f:
            return f.read().rstrip("\n")
    raise RefError(f"unknown reference kind '{kind}' (block kinds: {', '.join(BLOCK_KINDS)})")


def expand_inline(args, res):
    if args[0] == "where" and len(args) == 3:
        blocks = res.todo(args[1], args[2])
        return ", ".join(f"`{os.path.basename(b['file'])}` line {b['line']}" for b in blocks)
    raise RefError(f"unknown inline reference (inline kinds: {', '.join(INLINE_KINDS)}: "
                   "[[where EXERCISE N]])")


def expand(text, source_name, res, resource_path):
    out, errors, refs = [], [], []
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line.strip())
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and line.strip() == m.group(1):
                fence = None
            out.append(line)
            continue
        if m:
            fence = m.group(1)
            out.append(line)
            continue
        for img in IMAGE.findall(line):
            if re.match(r"^[a-z]+:", img):
                errors.append(f"{source_name}:{n}: image {img}: decks must work offline, use a local file")
            elif not any(os.path.isfile(os.path.join(d, img)) for d in resource_path):
                errors.append(f"{source_name}:{n}: image {img} not found in {os.pathsep.join(resource_path)}")
        whole = REF.fullmatch(line.strip())
        try:
            if whole:
                args = shlex.split(whole.group(1))
                if not args:
                    raise RefError("empty reference")
                result = expand_block(args, res) if args[0] in BLOCK_KINDS else expand_inline(args, res)
                refs.append((n, whole.group(0), result))
                out.append(result)
                continue

            def inline(m):
                args = shlex.split(m.group(1))
                if not args or args[0] in BLOCK_KINDS:
                    raise RefError(f"{m.group(0)} must stand alone on its line (it makes a block)")
                result = expand_inline(args, res)
                refs.append((n, m.group(0), result))
                return result
            out.append(REF.sub(inline, line))
        except (RefError, ValueError) as e:
            errors.append(f"{source_name}:{n}: {line.strip()}: {e}")
            out.append(line)
    if errors:
        raise RefError("\n".join(errors))
    return "\n".join(out), refs


def slide_count(markdown):
    """Slides of a deck: the title slide plus one per level-2 heading (outside code)."""
    count, fence = 1, None
    for line in markdown.split("\n"):
        m = FENCE.match(line.strip())
        if fence is not None:
            if m and line.strip() == m.group(1) and m.group(1)[0] == fence[0]:
                fence = None
            continue
        if m:
            fence = m.group(1)
        elif re.match(r"^## ", line):
            count += 1
        elif re.match(r"^# ", line):
            raise RefError("level-1 headings make section slides: use one '##' per slide only")
    return count


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("command", choices=["expand", "list"])
    p.add_argument("deck")
    p.add_argument("out", nargs="?")
    p.add_argument("--repo", default=DEFAULT_ROOT)
    p.add_argument("--resource-path", action="append", default=[])
    a = p.parse_args(argv[1:])
    res = Resolver(os.path.abspath(a.repo))
    rpath = a.resource_path or [res.root]
    with open(a.deck, encoding="utf-8") as f:
        text = f.read()
    try:
        result, refs = expand(text, os.path.relpath(a.deck), res, rpath)
        count = slide_count(result)
    except RefError as e:
        sys.stderr.write(f"{e}\n")
        return 1
    if a.command == "list":
        for n, ref, expansion in refs:
            print(f"{os.path.relpath(a.deck)}:{n}: {ref}\n  " + expansion.replace("\n", "\n  "))
        return 0
    if not a.out:
        p.error("expand needs OUT")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(result)
    with open(a.out + ".slides", "w", encoding="utf-8") as f:
        f.write(f"{count}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
