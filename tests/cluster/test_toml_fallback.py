#!/usr/bin/env python3
"""common/tools/kit_toml.py's reader, used where Python has no tomllib (3.9, 3.10: login nodes):
every exercises/*/info.toml reads the same as with tomllib, and TOML it does not know is one
error naming the line, not a wrong reading."""
import glob
import os
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "common", "tools"))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
import kit_toml  # noqa: E402
from verdict import expect, finish  # noqa: E402


def main():
    paths = sorted(glob.glob(os.path.join(ROOT, "exercises", "*", "info.toml")))
    expect(len(paths) >= 4, f"info.toml files found ({len(paths)})")
    for p in paths:
        with open(p, "rb") as f:
            want = tomllib.load(f)
        with open(p, encoding="utf-8") as f:
            got = kit_toml.loads_subset(f.read())
        expect(got == want, f"{os.path.relpath(p, ROOT)}: the same as tomllib's", f"{got}\n{want}")
    sample = ('# a comment\nname = "a \\"b\\""  # after\n[check.job]\nflags = ["-x", "1"]\n'
              'n = -3\nok = true\n[[files]]\nsource = "s"\n[[files]]\nsource = "t"\n'
              '[hints]\n"1-2" = "h"\n')
    expect(kit_toml.loads_subset(sample) == tomllib.loads(sample),
           "strings with escapes, nested tables, arrays of tables, quoted keys, ints, booleans")
    for bad, what in (('x = [\n "a",\n]\n', "a multi-line array"), ("x = 1.5\n", "a float"),
                      ("x = 'lit'\n", "a literal string"), ("x = 1\nx = 2\n", "a key set twice"),
                      ("[a\n", "an unclosed header")):
        try:
            kit_toml.loads_subset(bad)
            expect(False, f"{what} is refused")
        except kit_toml.TomlError as e:
            expect("line " in str(e) and "\n" not in str(e), f"{what} is refused in one line "
                   f"naming the line ({e})")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
