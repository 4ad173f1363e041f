#!/usr/bin/env python3
"""The CTest labels the README promises are real: each one selects at least one test, and
every label of the build is in the README's list. A label without tests makes `ctest -L LABEL`
run nothing and report success, which looks exactly like a passing area.

usage: check_labels.py README BUILD_DIR CTEST
"""
import re
import subprocess
import sys


def readme_labels(path):
    text = " ".join(open(path, encoding="utf-8").read().split())
    m = re.search(r"reruns one area: ([a-z_, ()]+)\.", text)
    if not m:
        sys.exit(f"check_labels.py: {path} has no sentence 'reruns one area: <labels>.'")
    return [re.sub(r"\(.*\)", "", label).strip() for label in m.group(1).split(",")]


def count(ctest, build, label):
    out = subprocess.run([ctest, "--test-dir", build, "-N", "-L", f"^{label}$"],
                         capture_output=True, text=True).stdout
    return len(re.findall(r"^\s*Test\s+#\d+:", out, re.M))


def main(readme, build, ctest):
    listed = readme_labels(readme)
    out = subprocess.run([ctest, "--test-dir", build, "--print-labels"], capture_output=True,
                         text=True).stdout
    existing = re.findall(r"^\s+(\S+)$", out.split("All Labels:")[-1], re.M)
    failures = []
    for label in listed:
        n = count(ctest, build, label)
        print(f"{'ok  ' if n else 'FAIL'} ctest -L {label}: {n} test(s)")
        if not n:
            failures.append(label)
    unlisted = sorted(set(existing) - set(listed))
    for label in unlisted:
        print(f"FAIL label {label} is used by tests but not listed in the README")
    return 1 if failures or unlisted else 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
