#!/usr/bin/env python3
"""Build the course decks: slides/*.md -> reveal.js HTML (offline), single-file HTML, and the data
the PDF step needs. The PDF itself is printed by slides/tools/browser.mjs (headless Chromium).

  build.py assets BUILD               reveal.js, theme and images into BUILD/html/
  build.py deck DECK.md BUILD         one deck: BUILD/md/NAME.md (references expanded),
                                      BUILD/html/NAME.html, BUILD/standalone/NAME.html
Options: --repo ROOT (default: this checkout), --node-modules DIR (default: slides/node_modules).

Any Pandoc warning is an error: the deck is not written and the build fails.
"""
import argparse
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import refs  # noqa: E402

SLIDES = os.path.dirname(HERE)
ROOT = os.path.dirname(SLIDES)

PANDOC_COMMON = [
    "--from=markdown", "--to=revealjs", "--standalone", "--slide-level=2",
    "--highlight-style=tango",
    "-V", "theme=white", "-V", "width=1280", "-V", "height=720", "-V", "margin=0.04",
    "-V", "hash=true", "-V", "slideNumber=true", "-V", "transition=none",
    "-V", "controlsTutorial=false", "-V", "center=false",
    "--fail-if-warnings", "--columns=1000",  # no relative widths for long table rows
]


def copy_tree(src, dst):
    if os.path.isdir(dst):
        shutil.rmtree(dst)
    shutil.copytree(src, dst)


def assets(build, node_modules, repo):
    html = os.path.join(build, "html")
    os.makedirs(html, exist_ok=True)
    reveal = os.path.join(node_modules, "reveal.js")
    if not os.path.isfile(os.path.join(reveal, "dist", "reveal.js")):
        sys.stderr.write(f"slides: reveal.js not found in {node_modules}: run slides/setup.sh\n")
        return 1
    for part in ("dist", "plugin"):
        copy_tree(os.path.join(reveal, part), os.path.join(html, "reveal.js", part))
    shutil.copy(os.path.join(reveal, "LICENSE"), os.path.join(html, "reveal.js", "LICENSE"))
    shutil.copy(os.path.join(SLIDES, "theme", "kit.css"), os.path.join(html, "kit.css"))
    dst = os.path.join(html, "images")
    if os.path.isdir(dst):
        shutil.rmtree(dst)
    shutil.copytree(os.path.join(repo, "images"), dst,
                    ignore=shutil.ignore_patterns("*.py", "__pycache__", "*.md"))
    return 0


def pandoc(args, cwd):
    run = subprocess.run(["pandoc"] + args, cwd=cwd, capture_output=True, text=True)
    if run.returncode != 0 or run.stderr.strip():
        sys.stderr.write(f"slides: pandoc {' '.join(args[-3:])} failed or warned:\n{run.stderr}")
        return 1
    return 0


def deck(path, build, repo):
    name = os.path.splitext(os.path.basename(path))[0]
    html = os.path.join(build, "html")
    md = os.path.join(build, "md", name + ".md")
    if not os.path.isfile(os.path.join(html, "reveal.js", "dist", "reveal.js")):
        sys.stderr.write("slides: run `build.py assets` first\n")
        return 1
    # Images resolve against the HTML folder (a copy of images/) and the repository.
    rc = refs.main(["refs.py", "expand", path, md, "--repo", repo,
                    "--resource-path", html, "--resource-path", repo])
    if rc != 0:
        return rc
    out = os.path.join(html, name + ".html")
    rc = pandoc(PANDOC_COMMON + ["-V", "revealjs-url=reveal.js", "--css=kit.css",
                                f"--resource-path={html}", md, "-o", out], cwd=html)
    if rc != 0:
        return rc
    standalone = os.path.join(build, "standalone")
    os.makedirs(standalone, exist_ok=True)
    return pandoc(PANDOC_COMMON + ["--self-contained", "-V", "revealjs-url=reveal.js",
                                   "--css=kit.css", f"--resource-path={html}", md,
                                   "-o", os.path.join(standalone, name + ".html")], cwd=html)


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["assets", "deck"])
    p.add_argument("args", nargs="+")
    p.add_argument("--repo", default=ROOT)
    p.add_argument("--node-modules", default=os.path.join(SLIDES, "node_modules"))
    a = p.parse_args(argv[1:])
    if a.command == "assets" and len(a.args) == 1:
        return assets(os.path.abspath(a.args[0]), a.node_modules, os.path.abspath(a.repo))
    if a.command == "deck" and len(a.args) == 2:
        return deck(os.path.abspath(a.args[0]), os.path.abspath(a.args[1]), os.path.abspath(a.repo))
    p.error("bad arguments")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
