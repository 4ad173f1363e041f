#!/usr/bin/env python3
"""Checks of the course decks that need no browser (CTest label `slides`).

  check_slides.py refs          every reference and image of every deck resolves; a reference
                                that does not resolve, or a missing image, fails the expansion
  check_slides.py follow TMP    edit the annotated source of exercise 01 in a copy of the
                                repository (in TMP) and see the TODO slides follow: new line
                                numbers, new code. The checkout itself is never touched.
  check_slides.py pages BUILD   each PDF in BUILD/pdf has one page per slide (pdfinfo)
  check_slides.py build BUILD -- COMMAND...
                                run COMMAND (the `slides` target), then check what it made in
                                BUILD: for every deck the expanded Markdown (no reference left),
                                the HTML (every slide, images that resolve offline), the
                                self-contained HTML and the PDF
  check_slides.py plots BUILD -- COMMAND...
                                empty BUILD/runs and BUILD/plots, run COMMAND (the `slides-plots`
                                target), then check the runs of 1, 2 and 4 ranks and the plots
                                drawn from them
"""
import glob
import math
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from html import unescape

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
    back_to_python(decks())
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
        '[[file common/kit/runtime/distributed.h "no such text here"]]': "has no line containing",
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


# The deck that teaches each exercise, whose "Back to Python" slide maps its kit calls.
EXERCISE_DECK = {"00-collectives": "00-collectives.md", "01-transformer-lm-ddp": "02-exercise-01.md",
                 "02-resnet-cifar10-ddp": "06-exercise-02.md", "03-transformer-lm-zero": "05-beyond-ddp.md",
                 "04-transformer-lm-tp": "09-exercise-04.md",
                 "05-transformer-lm-pp": "10-exercise-05.md",
                 "07-xsum-summariser": "11-capstone.md"}


def kit_names_of_solutions(exercise):
    """The kit:: names the solution of an exercise writes into its TODOs (the `//@ solution`
    parts of its annotated sources): what a participant must find again in PyTorch."""
    names = set()
    for path in glob.glob(os.path.join(ROOT, "solutions", exercise, "*.annotated.*")):
        inside = False
        for line in open(path, encoding="utf-8"):
            if "//@ solution" in line or "#@ solution" in line:
                inside = True
            elif "//@ end" in line or "#@ end" in line or "//@ todo" in line:
                inside = False
            elif inside and not line.lstrip().startswith("//"):
                names.update(re.findall(r"kit::(\w+)", line.split("//")[0]))
    return names


def back_to_python(paths):
    """Every deck ends (before its references) with a "Back to Python" slide: a table of the kit's
    names beside PyTorch's; an exercise's deck names every kit:: call of the exercise's TODOs."""
    for deck in paths:
        name = os.path.basename(deck)
        slides = re.split(r"^## ", open(deck, encoding="utf-8").read(), flags=re.M)[1:]
        titles = [s.split("\n", 1)[0] for s in slides if not s.startswith("References")]
        check(titles and titles[-1].startswith("Back to Python"),
              f"{name}: its last slide (before the references) is 'Back to Python' ({titles[-1:]})")
        back = next((s for s in slides if s.startswith("Back to Python")), "")
        table = [r for r in back.splitlines() if r.startswith("|") and "---" not in r]
        check(len(table) >= 4 and re.search(r"PyTorch|torch", table[0].split("|")[-2]) and
              all(c.strip() for r in table[1:] for c in r.strip().strip("|").split(" | ")),
              f"{name}: 'Back to Python' is a table, each row the kit's beside PyTorch's")
        for exercise, deck_name in EXERCISE_DECK.items():
            if deck_name != name:
                continue
            missing = sorted(n for n in kit_names_of_solutions(exercise)
                             if not re.search(rf"\b{n}\b", back))
            check(not missing, f"{name}: 'Back to Python' names every kit call of {exercise}'s "
                  f"TODOs (missing: {missing})")


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


def run_command(command):
    """The build step of a test; its output is shown as it comes."""
    print("$ " + " ".join(command), flush=True)
    code = subprocess.run(command).returncode
    check(code == 0, f"{' '.join(command[-2:])} exits 0 (exit {code})")
    return code == 0


def nonempty_file(path):
    return os.path.isfile(path) and os.path.getsize(path) > 0


def cmd_build(build, command):
    if not run_command(command):
        return report()
    for deck in decks():
        name = os.path.splitext(os.path.basename(deck))[0]
        outputs = {kind: os.path.join(build, kind, name + ext) for kind, ext in
                   (("md", ".md"), ("html", ".html"), ("standalone", ".html"), ("pdf", ".pdf"))}
        for kind, path in outputs.items():
            fresh = nonempty_file(path) and os.path.getmtime(path) >= os.path.getmtime(deck)
            check(fresh, f"{name}: {kind}/{os.path.basename(path)} exists, is not empty and is "
                  "newer than the deck")
        if not all(nonempty_file(p) for p in outputs.values()):
            continue
        source = open(deck, encoding="utf-8").read()
        md = open(outputs["md"], encoding="utf-8").read()
        refs_in_source = len(re.findall(r"\[\[", source))
        check("[[" not in md, f"{name}: all {refs_in_source} source references are expanded")
        slides = int(open(outputs["md"] + ".slides", encoding="utf-8").read())
        titles = re.findall(r"^## (.+)$", md, re.M)
        html = open(outputs["html"], encoding="utf-8").read()
        sections = len(re.findall(r"<section[ >]", html))
        # The title slide plus one per "##": refs.py refuses level-1 headings.
        check(slides == len(titles) + 1 and sections == slides,
              f"{name}: the HTML has all {slides} slides ({sections} sections, {len(titles)} "
              "'##' titles + the title slide)")
        # Each title's words, in order, in the HTML's text: letters and digits only, since
        # Pandoc makes quotes and dashes typographic and escapes them.
        words = lambda text: re.sub(r"[^a-z0-9]", "", text.lower())  # noqa: E731
        text = words(unescape(re.sub(r"<[^>]+>", "", html)))
        missing = [t for t in titles if words(t)[:30] not in text]
        check(not missing, f"{name}: every slide title is in the HTML (missing: {missing[:3]})")
        images = sorted(set(re.findall(r'(?:src|data-src)="((?!https?:|data:)[^"#]+)"', html)))
        gone = [i for i in images if not os.path.isfile(os.path.join(build, "html", i))]
        check(not gone, f"{name}: the {len(images)} local files the HTML loads are beside it "
              f"(missing: {gone[:3]})")
        standalone = open(outputs["standalone"], encoding="utf-8").read()
        # The attributes of the page's elements, not the text inside inlined scripts.
        tags = re.sub(r"(<script\b[^>]*>).*?(</script>)", r"\1\2", standalone, flags=re.S)
        outside = re.findall(r'(?:src|href)="((?!https?:|data:|#)[^"]+)"', tags)
        check(not outside and "Reveal.initialize" in standalone,
              f"{name}: the standalone HTML loads nothing from beside it ({outside[:3]})")
        with open(outputs["pdf"], "rb") as f:
            check(f.read(5) == b"%PDF-", f"{name}: pdf/{name}.pdf is a PDF")
    return report()


def cmd_plots(build, command, ranks=(1, 2, 4)):
    runs, plots = os.path.join(build, "runs"), os.path.join(build, "plots")
    # What an earlier build left there must not pass for this build's output.
    for d in (runs, plots):
        shutil.rmtree(d, ignore_errors=True)
    if not run_command(command):
        return report()
    sys.path.insert(0, TOOLS)
    import plot_metrics  # noqa: E402 (slides/tools)
    folders = []
    for n in ranks:
        folder = os.path.join(runs, f"ranks-{n}")
        check(nonempty_file(os.path.join(folder, "stdout.log")), f"ranks-{n}: the run's output is kept")
        try:
            run = plot_metrics.Run(os.path.join(folder, "metrics.csv"))
        except (OSError, ValueError) as e:
            check(False, f"ranks-{n}: metrics.csv is readable: {e}")
            continue
        check(run.ranks == n, f"ranks-{n}: metrics.csv says {run.ranks} rank(s)")
        check(len(run.loss) > 0 and all(math.isfinite(x) for x in run.loss),
              f"ranks-{n}: {len(run.loss)} training steps with finite losses")
        check(len(run.epochs) >= 1, f"ranks-{n}: epochs {run.epochs}")
        folders.append(folder)
    for name, marks in (("loss-vs-step.svg", "polyline"), ("loss-vs-epoch.svg", "polyline"),
                        ("throughput.svg", "circle"), ("epoch-time.svg", "circle")):
        path = os.path.join(plots, name)
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as e:
            check(False, f"{name}: written, and valid SVG: {e}")
            continue
        found = [el for el in root.iter() if el.tag.split("}")[-1] == marks]
        # The loss plots draw each rank count twice (raw and smoothed); the scaling plots mark
        # each rank count with a dot.
        want = 2 * len(ranks) if marks == "polyline" else len(ranks)
        check(root.tag.split("}")[-1] == "svg" and len(found) >= want,
              f"{name}: an SVG with {len(found)} {marks}s (at least {want}: {len(ranks)} rank counts)")
    summary = os.path.join(plots, "summary.md")
    rows = re.findall(r"^\| (\d+) \|", open(summary, encoding="utf-8").read(), re.M) \
        if os.path.isfile(summary) else []
    check(sorted(map(int, rows)) == list(ranks), f"summary.md: one row per rank count ({rows})")
    # And the plots are what these runs give, not merely files with the right names.
    if len(folders) == len(ranks):
        again = subprocess.run([sys.executable, os.path.join(TOOLS, "plot_metrics.py"), "--check",
                                "--out", plots] + folders, capture_output=True, text=True)
        check(again.returncode == 0, f"the plots match the runs' metrics.csv {again.stderr.strip()}")
    return report()


def report():
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) == 2 and args[0] in ("refs", "follow", "pages"):
        sys.exit({"refs": cmd_refs, "follow": cmd_follow, "pages": cmd_pages}[args[0]](args[1]))
    if len(args) > 3 and args[0] in ("build", "plots") and args[2] == "--":
        sys.exit({"build": cmd_build, "plots": cmd_plots}[args[0]](args[1], args[3:]))
    print(__doc__)
    sys.exit(2)
