"""expect() and finish(): the "ok"/"FAIL" lines of the kit's Python test scripts, and their exit
code, in one place.

    sys.path.insert(0, <tests/support>); from verdict import expect, failures, finish
    expect(rc == 0, "the run succeeds", detail=output)   # detail is printed only on failure
    return finish()                                      # 1 if any expect failed, else 0
"""
failures = []


def expect(cond, what, detail=""):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)
        if detail:
            print("     " + str(detail).rstrip("\n").replace("\n", "\n     "), flush=True)
    return bool(cond)


def finish():
    print(f"{len(failures)} failed" if failures else "all checks passed", flush=True)
    return 1 if failures else 0


def root_test_args(*flags, why):
    """The arguments of a test that needs root (a test cluster, a user, namespaces): each flag is
    a required --option with a value. Without root it says why and exits 77, which CTest's
    SKIP_RETURN_CODE reports as a skip."""
    import argparse
    import os
    import sys
    ap = argparse.ArgumentParser()
    for flag in flags:
        ap.add_argument(flag, required=True)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print(f"skipped: {why}")
        sys.exit(77)
    return args
