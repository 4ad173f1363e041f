#!/usr/bin/env python3
"""Checks of the course decks that need no browser (CTest label `slides`).

  check_slides.py refs          every reference and image of every deck resolves; a reference
                                that does not resolve, or a missing image, fails the expansion
  check_slides.py follow TMP    edit the annotated source of exercise 01 in a copy of the
                                repository (in TMP) and see the TODO slides follow: new line
                                numbers, new code. The checkout itself is never touched.
  check_slides.py pages BUILD   each PDF in BUILD/pdf has one page per slide (pdfinfo)
"""
import glob
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(ROOT, "slides", "tools")
sys.path.insert(0, TOOLS)
import refs  # noqa: E402

EX = "01-transformer-lm-ddp"
failures = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        failures.append(what)


def decks(root=ROOT):
    return sorted(glob.glob(os.path.join(root, "slides", "*.md")))


def expand(deck, root, out):
    return subprocess.run([sys.executable, os.path.join(root, "slides", "tools", "refs.py"), "expand",
                           deck, out, "--repo", root, "--resource-path", root],
                          capture_output=True, text=True)


def cmd_refs(tmp):
    os.makedirs(tmp, exist_ok=True)
    res = refs.Resolver(ROOT)
    blocks = res.blocks(EX)
    todos = {b["todo"] for b in blocks}
    for deck in decks():
        name = os.path.basename(deck)
        run = expand(deck, ROOT, os.path.join(tmp, name))
        check(run.returncode == 0, f"{name}: every reference and image resolves {run.stderr.strip()}")
        if run.returncode != 0:
            continue
        text = open(os.path.join(tmp, name), encoding="utf-8").read()
        check("[[" not in text, f"{name}: no reference left unexpanded")
        src = open(deck, encoding="utf-8").read()
        # No hand-typed line numbers of the exercise.
        typed = re.findall(r"line \d+ of the unmodified", src)
        check(not typed, f"{name}: no hand-typed 'line N of the unmodified exercise' ({typed})")
    # One slide per TODO, with every block of it: the trainer's TODOs in the exercise deck, the
    # job script's in the sbatch deck.
    expanded = {n: open(os.path.join(tmp, n), encoding="utf-8").read()
                for n in ("02-exercise-01.md", "03-sbatch.md")}
    for t in sorted(todos, key=lambda t: int(t.split("-")[0])):
        mine = [b for b in blocks if b["todo"] == t]
        name = "03-sbatch.md" if mine[0]["file"].startswith("sbatch/") else "02-exercise-01.md"
        text = expanded[name]
        label = t.replace("-", "[–-]")
        check(re.search(rf"^## TODOs? {label} ", text, re.M) is not None, f"{name}: a slide for TODO {t}")
        for b in mine:
            check(f"TODO {t}: `{b['file']}`, line {b['line']} of the unmodified exercise" in text,
                  f"{name}: TODO {t} at line {b['line']} is shown")
            check(b["code"] in text, f"{name}: TODO {t}'s code (line {b['line']}) is shown")
    # References that do not resolve fail, with the place and the reason.
    bad = {
        f"[[todo {EX} 99]]": "has no TODO 99",
        "[[todo no-such-exercise 1]]": "unknown exercise",
        f"[[todo {EX}]]": "expected",
        '[[file common/kit/distributed.h "no such text here"]]': "has no line containing",
        "[[file no/such/file.h \"x\"]]": "no file",
        "[[frobnicate 1]]": "unknown",
        "![a diagram](images/no-such-image.svg)": "not found",
        "![a remote picture](https://example.org/x.png)": "offline",
    }
    for line, reason in bad.items():
        path = os.path.join(tmp, "bad.md")
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"---\ntitle: t\n---\n\n## A slide\n\n{line}\n")
        run = expand(path, ROOT, os.path.join(tmp, "bad.out.md"))
        check(run.returncode != 0 and reason in run.stderr and "bad.md:7" in run.stderr,
              f"{line} fails the build: {run.stderr.strip()[:120]}")
    return report()


def cmd_follow(tmp):
    """A copy of what the slides read: stages.py, the exercise, its annotated source, the decks."""
    copy = os.path.join(tmp, "repo")
    shutil.rmtree(copy, ignore_errors=True)
    for part in ("common/tools", "exercises", "solutions", "slides", "images", "common/kit", "sbatch"):
        src = os.path.join(ROOT, part)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(copy, part),
                            ignore=shutil.ignore_patterns("node_modules", "__pycache__"))
    deck = os.path.join(copy, "slides", "02-exercise-01.md")
    before = os.path.join(tmp, "before.md")
    after = os.path.join(tmp, "after.md")
    check(expand(deck, copy, before).returncode == 0, "the exercise deck expands in the copy")
    old = {b["todo"] + "@" + str(i): b for i, b in enumerate(refs.Resolver(copy).blocks(EX))}
    old8 = next(b for b in old.values() if b["todo"] == "8")

    # The edit: two new lines in the common part before TODO 8 (shifting every later TODO), and
    # a different solution line for TODO 8.
    info = open(os.path.join(copy, "exercises", EX, "info.toml"), encoding="utf-8").read()
    source = re.search(r'source\s*=\s*"([^"]+)"', info).group(1)
    path = os.path.join(copy, source)
    lines = open(path, encoding="utf-8").read().split("\n")
    at = next(i for i, l in enumerate(lines) if re.match(r"\s*//@ todo 8\b", l))
    sol = next(i for i in range(at, len(lines)) if lines[i].strip() == "//@ solution")
    lines[sol + 1] = "  kit::DistributedDataParallel ddp(model);  // edited by the follow test"
    lines[at:at] = ["  // a line added by the follow test", "  // and another one"]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    check(expand(deck, copy, after).returncode == 0, "the deck still expands after the edit")
    new = refs.Resolver(copy).blocks(EX)
    new8 = next(b for b in new if b["todo"] == "8")
    text = open(after, encoding="utf-8").read()
    check(new8["line"] == old8["line"] + 2, f"TODO 8 moved from line {old8['line']} to {new8['line']}")
    check(f"TODO 8: `{new8['file']}`, line {new8['line']} of the unmodified exercise" in text,
          f"the slide says TODO 8 is at line {new8['line']} now")
    check(f"line {old8['line']} of the unmodified" not in text.split("## TODO 8")[1].split("## ")[0],
          "the TODO 8 slide no longer shows the old line")
    check("// edited by the follow test" in text, "the TODO 8 slide shows the edited code")
    later = [b for b in new if b["line"] > new8["line"]]
    check(all(f"line {b['line']} of the unmodified" in text for b in later),
          f"the {len(later)} blocks after TODO 8 moved with it")
    # Through Pandoc to the HTML slide, as the slides target builds it.
    build = os.path.join(tmp, "build")
    nm = ["--node-modules", os.path.join(ROOT, "slides", "node_modules"), "--repo", copy]
    run = subprocess.run([sys.executable, os.path.join(copy, "slides", "tools", "build.py"), "assets",
                          build] + nm, capture_output=True, text=True)
    if run.returncode == 0:
        run = subprocess.run([sys.executable, os.path.join(copy, "slides", "tools", "build.py"), "deck",
                              deck, build] + nm, capture_output=True, text=True)
    check(run.returncode == 0, f"the edited deck builds to HTML {run.stderr.strip()[:300]}")
    if run.returncode == 0:
        html = open(os.path.join(build, "html", "02-exercise-01.html"), encoding="utf-8").read()
        slide8 = html.split(">TODO 8 ")[1].split("</section>")[0]
        check(f"line {new8['line']} of the unmodified exercise" in slide8,
              f"the HTML slide of TODO 8 says line {new8['line']}")
        check("edited by the follow test" in slide8, "the HTML slide of TODO 8 shows the edited code")
    # And the original checkout is untouched.
    orig = open(os.path.join(ROOT, source), encoding="utf-8").read()
    check("follow test" not in orig, "the checkout's annotated source is unchanged")
    shutil.rmtree(copy, ignore_errors=True)
    return report()


def cmd_pages(build):
    pdfs = sorted(glob.glob(os.path.join(build, "pdf", "*.pdf")))
    check(len(pdfs) == len(decks()), f"one PDF per deck ({len(pdfs)} of {len(decks())})")
    for pdf in pdfs:
        name = os.path.splitext(os.path.basename(pdf))[0]
        info = subprocess.run(["pdfinfo", pdf], capture_output=True, text=True)
        m = re.search(r"^Pages:\s+(\d+)", info.stdout, re.M)
        pages = int(m.group(1)) if m else -1
        slides = int(open(os.path.join(build, "md", name + ".md.slides")).read())
        check(pages == slides, f"{name}.pdf: {pages} pages for {slides} slides")
    return report()


def report():
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("refs", "follow", "pages"):
        print(__doc__)
        sys.exit(2)
    sys.exit({"refs": cmd_refs, "follow": cmd_follow, "pages": cmd_pages}[sys.argv[1]](sys.argv[2]))
