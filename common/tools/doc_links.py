#!/usr/bin/env python3
"""Every relative link of the kit's Markdown pages leads somewhere: the file or folder exists, and
a #fragment names a heading of the page it points to (GitHub's anchors) or, on a source file,
a line (#L42) that the file has.

usage: doc_links.py [--root DIR] [PAGE.md ...]

Without pages: every Markdown file git knows in DIR (tracked, and untracked but not ignored),
outside node_modules, except the decks slides/NN-*.md, whose references the slides' own test
resolves (slides.refs; their paths are relative to the build's deck folder). Links inside code
(fenced blocks and `spans`) are text, not links, and are skipped; so are absolute URLs. One line
per broken link, "page:line: ...", and exit 1; exit 0 when every link resolves.
"""
import os
import re
import subprocess
import sys

LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
DECK = re.compile(r"^slides/\d\d-[^/]*\.md$")


def pages(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "-co", "--exclude-standard", "-z",
                          "--", "*.md"], capture_output=True, check=True).stdout
    names = [os.fsdecode(n) for n in out.split(b"\0") if n]
    return sorted(n for n in names if "node_modules/" not in n and not DECK.match(n)
                  and os.path.isfile(os.path.join(root, n)))


def slug(text):
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to '-'."""
    text = re.sub(r"`([^`]*)`", r"\1", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def prose_lines(text):
    """(line number, line) outside fenced code blocks, with `code spans` blanked."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = re.match(r"^\s*(```+|~~~+)", line)
        if m:
            if fence is None:
                fence = m.group(1)[:3]
            elif m.group(1).startswith(fence):
                fence = None
            continue
        if fence is None:
            yield n, re.sub(r"(`+)(.+?)\1", lambda c: " " * len(c.group(0)), line)


def paragraphs(text):
    """(first line number, text) of each run of prose lines: a link's text may wrap."""
    block, first, last = [], None, None
    for n, line in prose_lines(text):
        if line.strip() and last == n - 1 and block:
            block.append(line)
        else:
            if block:
                yield first, "\n".join(block)
            block, first = ([line], n) if line.strip() else ([], None)
        last = n
    if block:
        yield first, "\n".join(block)


def anchors(path, cache={}):
    """The anchors of a page's headings; a repeated heading gets -1, -2, ... as on GitHub."""
    if path not in cache:
        seen, found = {}, set()
        for _, heading in raw_headings(path):
            base = slug(heading)
            k = seen.get(base, 0)
            seen[base] = k + 1
            found.add(base if k == 0 else f"{base}-{k}")
        cache[path] = found
    return cache[path]


def raw_headings(path):
    """(line number, heading text) of every heading outside fenced code."""
    text = open(path, encoding="utf-8").read()
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = re.match(r"^\s*(```+|~~~+)", line)
        if m:
            fence = m.group(1)[:3] if fence is None else (None if m.group(1).startswith(fence)
                                                           else fence)
            continue
        h = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line) if fence is None else None
        if h:
            yield n, h.group(1)


def check_page(root, page):
    problems = []
    full = os.path.join(root, page)
    for n, line in paragraphs(open(full, encoding="utf-8").read()):
        for m in LINK.finditer(line):
            n_at = n + line.count("\n", 0, m.start())
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                continue
            path, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(full), path)) if path else full
            where = f"{page}:{n_at}"
            if not os.path.exists(dest):
                problems.append(f"{where}: link to {target}: {os.path.relpath(dest, root)} "
                                "does not exist")
                continue
            if not frag:
                continue
            if dest.endswith(".md"):
                if frag not in anchors(dest):
                    problems.append(f"{where}: link to {target}: {os.path.relpath(dest, root)} "
                                    f"has no heading whose anchor is #{frag}")
            elif re.fullmatch(r"L\d+", frag) and os.path.isfile(dest):
                lines = open(dest, encoding="utf-8", errors="replace").read().count("\n")
                if int(frag[1:]) > lines:
                    problems.append(f"{where}: link to {target}: "
                                    f"{os.path.relpath(dest, root)} has {lines} lines")
    return problems


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = argv[1:]
    if args[:1] == ["--root"] and len(args) >= 2:
        root, args = os.path.abspath(args[1]), args[2:]
    if any(a.startswith("-") for a in args):
        sys.stderr.write(__doc__)
        return 2
    todo = args or pages(root)
    problems = []
    for page in todo:
        if not os.path.isfile(os.path.join(root, page)):
            problems.append(f"{page}: no such page")
            continue
        problems += check_page(root, page)
    for p in problems:
        print(p)
    print(f"doc_links.py: {len(todo)} pages, {len(problems)} broken links", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
