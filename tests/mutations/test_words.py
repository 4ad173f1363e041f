#!/usr/bin/env python3
"""Every name a message of the checker or of the kit gives a student exists.

A message that tells a student to use a class, include a header or run a command that is not
there sends them looking for nothing (exercise 03's "FullyShardedLM" for FullyShardedModel). So
this test reads the text of every message: the string literals of the check's rules and engine
(common/tools/rules/*.py, common/tools/checklib/*.py, with ast) and of the kit's sources
(common/kit/**/*.cpp and *.h), and asserts that
  * every kit::Name and every CamelCase name in them is declared in a header of common/kit/
    (class, struct, enum, using, TORCH_MODULE, a function), or is a word of the KNOWN list;
  * every header named as kit/<file>.h is a file of common/kit/;
  * every `./kit <command>` is a command of ./kit.

usage: test_words.py    (exit 1 with one line per unknown name)
"""
import ast
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Names that are not the kit's and are right as they are: units, products, papers' terms, and
# the standard library's and Python's own types the engine's code quotes.
KNOWN = {"GiB", "MiB", "KiB", "LibTorch", "PyTorch", "ReLU", "WikiText", "ZeRO", "InfiniBand",
         "ValueError", "TypeError", "RuntimeError", "SystemExit", "TimeoutExpired",
         "AttributeError", "BlockingIOError", "SequenceMatcher", "ThreadPoolExecutor",
         "DictReader", "ArgumentParser", "DirWatch", "NodeList", "TresPerNode", "MailProg",
         "JobState", "JobName", "JobHeld", "CommError", "GitHub", "DataError", "SetupError",
         # exercise 06: torch.profiler's step marks ("ProfilerStep#3"), the .npy format's
         # library, the model's family (a Vision Transformer)
         "ProfilerStep", "NumPy", "ViT"}
CAMEL = re.compile(r"(?<![\w/.])(?:kit::)?([A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+)\b")
KIT_NAME = re.compile(r"\bkit::([A-Za-z_]\w*)")
HEADER = re.compile(r"\bkit/((?:[a-z0-9_]+/)?[a-z0-9_]+\.h)\b")
COMMAND = re.compile(r"\./kit ([a-z][a-z-]*)")
CPP_LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"')


def declared():
    names = set()
    for h in glob.glob(os.path.join(ROOT, "common/kit/**/*.h"), recursive=True):
        text = open(h, encoding="utf-8").read()
        names |= set(re.findall(r"\b(?:class|struct|enum class|enum|using|namespace)\s+([A-Za-z_]\w*)",
                                text))
        names |= set(re.findall(r"TORCH_MODULE\((\w+)\)", text))
        names |= set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", text))  # functions, constructors
        names |= set(re.findall(r"\b([A-Za-z_]\w*)\s*(?:=|,|\}|;)", text))  # enumerators, members
    return names


def commands():
    text = open(os.path.join(ROOT, "kit"), encoding="utf-8").read()
    case = text[text.rindex('case "${1:-}" in'):]
    return {c.strip() for group in re.findall(r"^\s*([a-z][a-z| -]*)\)", case, re.M)
            for c in group.split("|")}


def docstrings(tree):
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body and \
                isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            out.add(id(node.body[0].value))
    return out


def messages():
    """(file, line, text) of every message literal (not docstrings, not comments)."""
    for path in sorted(glob.glob(os.path.join(ROOT, "common/tools/rules/*.py")) +
                       glob.glob(os.path.join(ROOT, "common/tools/checklib/*.py"))):
        tree = ast.parse(open(path, encoding="utf-8").read(), path)
        skip = docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                yield path, node.lineno, node.value
    for path in sorted(glob.glob(os.path.join(ROOT, "common/kit/**/*.cpp"), recursive=True) +
                       glob.glob(os.path.join(ROOT, "common/kit/**/*.h"), recursive=True)):
        for n, line in enumerate(open(path, encoding="utf-8"), 1):
            code = line.split("//")[0] if '"' not in line.split("//")[0] else line
            if line.lstrip().startswith(("//", "#include")):
                continue
            for text in CPP_LITERAL.findall(code):
                yield path, n, text


def main():
    names, cmds = declared(), commands()
    headers = {os.path.relpath(h, os.path.join(ROOT, "common/kit"))
               for h in glob.glob(os.path.join(ROOT, "common/kit/**/*.h"), recursive=True)}
    errors = []
    for path, line, text in messages():
        where = f"{os.path.relpath(path, ROOT)}:{line}"
        for name in set(KIT_NAME.findall(text)) | set(CAMEL.findall(text)):
            if name not in names and name not in KNOWN:
                errors.append(f"{where}: a message names '{name}', which no header of "
                              "common/kit/ declares")
        for header in HEADER.findall(text):
            if header not in headers:
                errors.append(f"{where}: a message names kit/{header}, which common/kit/ lacks")
        for cmd in COMMAND.findall(text):
            if cmd not in cmds:
                errors.append(f"{where}: a message names './kit {cmd}', which ./kit does not have")
    for e in errors:
        print("FAIL " + e)
    if not errors:
        print(f"OK: every name in the messages of the checker and the kit exists "
              f"({len(names)} declared names, {len(cmds)} ./kit commands)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
