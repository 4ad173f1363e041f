#!/usr/bin/env python3
"""kit.docs_bite: the two documentation checks fail when they should.

common/tools/exercise_pages.py check (kit.exercise_pages) and common/tools/doc_links.py
(kit.doc_links) pass on the repository; this test shows that they are not passing whatever the
pages say. On a copy of the checkout it requires:

  * the README's course table has one row per exercises/*/info.toml, linking its page, which
    exists (read from the README itself, not from the generator);
  * the copy passes both checks as it is; the hand-written part of a page may change freely;
  * `check` fails, naming the stale files, when an info.toml's title changes, when a line is
    added to an annotated source above its TODOs (the page's line numbers move), and when the
    README's table loses a row; `write` repairs each and keeps the hand-written part;
  * a TODO label without a [todos] line, or a [todos] line of no TODO, stops it with one line
    naming the exercise and the label (exit 2);
  * doc_links fails, naming page and line, on a link to a missing file (also one whose text
    wraps to the next line) and on an anchor that no heading has, and ignores a link in code.

usage: test_docs.py SOURCE_DIR WORK_DIR
"""
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from checkout import copy_checkout  # noqa: E402
from verdict import expect, finish  # noqa: E402

TOP = re.compile(r"(: |, )README\.md[ ,]")  # the top-level README in the list of stale files


def run(root, tool, *args):
    p = subprocess.run([sys.executable, os.path.join(root, "common", "tools", tool), *args],
                       capture_output=True, text=True, cwd=root)
    return p.returncode, p.stdout + p.stderr


def edit(root, path, old, new):
    full = os.path.join(root, path)
    if not os.path.isfile(full):
        raise SystemExit(f"FAIL {path} does not exist")
    text = open(full, encoding="utf-8").read()
    if old not in text:
        raise SystemExit(f"test_docs.py: {path} no longer holds {old!r}: update this test")
    with open(full, "w", encoding="utf-8") as f:
        f.write(text.replace(old, new, 1))
    return text


def restore(root, path, text):
    with open(os.path.join(root, path), "w", encoding="utf-8") as f:
        f.write(text)


def table_rows(readme):
    text = open(readme, encoding="utf-8").read()
    m = re.search(r"<!-- course table:.*?-->\n(.*?)<!-- end of the course table -->", text, re.S)
    if not m:
        return None
    return re.findall(r"^\| \[[^\]]*\]\(exercises/([^/)]+)/README\.md\)", m.group(1), re.M)


def main(src, work):
    exercises = sorted(d for d in os.listdir(os.path.join(src, "exercises"))
                       if os.path.isfile(os.path.join(src, "exercises", d, "info.toml")))
    rows = table_rows(os.path.join(src, "README.md"))
    expect(rows == exercises, f"the README's course table lists every exercise, in order: "
           f"{rows} against {exercises}")
    expect(all(os.path.isfile(os.path.join(src, "exercises", e, "README.md")) for e in exercises),
           "every exercise has its page")

    shutil.rmtree(work, ignore_errors=True)
    copy_checkout(src, work, untracked=True)
    subprocess.run(["git", "init", "-q", work], check=True)  # doc_links lists pages with git
    ex = "01-transformer-lm-ddp"
    page = f"exercises/{ex}/README.md"
    toml = f"exercises/{ex}/info.toml"

    rc, out = run(work, "exercise_pages.py", "check")
    expect(rc == 0, f"the copy's pages are in step (exit {rc}) {out.strip()[-200:]}")
    rc, out = run(work, "doc_links.py")
    expect(rc == 0, f"the copy's links resolve (exit {rc}) {out.strip()[-200:]}")

    # The hand-written part is the page's own: editing it is no difference.
    edit(work, page, "## What it is, and what the check judges\n",
         "## What it is, and what the check judges\n\nA note of the instructor's.\n")
    rc, out = run(work, "exercise_pages.py", "check")
    expect(rc == 0, "a change below the end marker passes the check")

    # A changed title: the page and the README are stale.
    old = edit(work, toml, 'title = "A Transformer', 'title = "A changed Transformer')
    rc, out = run(work, "exercise_pages.py", "check")
    expect(rc == 1 and page in out and TOP.search(out),
           f"a changed title makes the page and the README stale (exit {rc})")
    rc, _ = run(work, "exercise_pages.py", "write")
    text = open(os.path.join(work, page), encoding="utf-8").read()
    expect(rc == 0 and "# Exercise 01: A changed Transformer" in text
           and "A note of the instructor's." in text,
           "write renders the new title and keeps the hand-written part")
    restore(work, toml, old)
    run(work, "exercise_pages.py", "write")

    # A line added to the annotated source above every TODO moves every line of the page.
    src_file = f"solutions/{ex}/train.annotated.cpp"
    body = open(os.path.join(work, src_file), encoding="utf-8").read()
    restore(work, src_file, "// one more line\n" + body)
    rc, out = run(work, "exercise_pages.py", "check")
    expect(rc == 1 and page in out, f"moved TODO lines make the page stale (exit {rc})")
    restore(work, src_file, body)

    # A lost table row.
    readme = open(os.path.join(work, "README.md"), encoding="utf-8").read()
    restore(work, "README.md", re.sub(r"^\| \[02:.*\n", "", readme, flags=re.M))
    rc, out = run(work, "exercise_pages.py", "check")
    expect(rc == 1 and TOP.search(out), f"a row missing from the course table fails (exit {rc})")
    restore(work, "README.md", readme)

    # [todos] must match the annotated source's labels exactly.
    old = edit(work, toml, '"13" = "kit::destroy', '"99" = "kit::destroy')
    rc, out = run(work, "exercise_pages.py", "check")
    lines = out.strip().splitlines()
    expect(rc == 2 and len(lines) == 1 and "TODO 13" in out and toml in out,
           f"a TODO without a [todos] line stops with one line naming it: {out.strip()}")
    restore(work, toml, old)
    old = edit(work, toml, "[todos]\n", '[todos]\n"42" = "no such TODO"\n')
    rc, out = run(work, "exercise_pages.py", "check")
    expect(rc == 2 and "42" in out, f"a [todos] line of no TODO is refused: {out.strip()}")
    restore(work, toml, old)
    rc, _ = run(work, "exercise_pages.py", "check")
    expect(rc == 0, "restored, the copy passes again")

    # Links.
    old = edit(work, "exercises/README.md", "# For students: working on an exercise\n",
               "# For students: working on an exercise\n\nSee [the guide](no-such-guide.md), "
               "[a section](../sbatch/README.md#no-such-section) and `[code](not-a-link.md)`; a link\n"
               "[that\nwraps](no-such-page.md).\n")
    rc, out = run(work, "doc_links.py")
    expect(rc == 1 and "exercises/README.md:3: link to no-such-guide.md" in out
           and "no-such-section" in out and "not-a-link" not in out
           and "exercises/README.md:4: link to no-such-page.md" in out,
           f"doc_links names a missing file, a missing anchor and a wrapped link's target, "
           f"not code: {out.strip()}")
    restore(work, "exercises/README.md", old)
    return finish()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])))
