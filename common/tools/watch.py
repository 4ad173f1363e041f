#!/usr/bin/env python3
"""`./kit watch EXERCISE`: run the check again every time the student saves the exercise's
trainer, as rustlings does; Ctrl-C ends it.

It polls the file once a second (modification time, size and inode, so that an editor that saves
by writing a new file and renaming it over the old one is seen too) with nothing but the standard
library: no inotify package to install on a course machine. A save while a check runs is not
lost: the check runs again as soon as the current one has finished.

usage: watch.py --file FILE [--interval S] -- COMMAND...
  FILE     the file to watch (the exercise's trainer)
  COMMAND  the check to run (./kit check EXERCISE); its exit status is reported, never ours
Exit status: 0 when ended with Ctrl-C (SIGINT) or SIGTERM, 2 for a usage error.
"""
import argparse
import os
import signal
import subprocess
import sys
import time


class Stop(Exception):
    """Ctrl-C or SIGTERM: leave the loop and end cleanly."""


def stamp(path):
    """What changes when the file is saved; None while it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def run_check(command):
    """Runs the check in the foreground; on Ctrl-C/SIGTERM stops it too and re-raises Stop."""
    child = subprocess.Popen(command)
    try:
        return child.wait()
    except Stop:
        # In a terminal, Ctrl-C reached the check as well (same process group); a SIGINT or
        # SIGTERM sent to this process alone did not. Either way the check must not outlive us.
        if child.poll() is None:
            child.send_signal(signal.SIGINT)
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        raise


def main(argv):
    ap = argparse.ArgumentParser(prog="kit watch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", required=True)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("command", nargs="+")
    a = ap.parse_args(argv)
    if not os.path.isfile(a.file):
        sys.stderr.write(f"kit: error: {a.file} does not exist: nothing to watch "
                         "(./kit reset brings back the exercise as shipped)\n")
        return 2

    def stop(signum, frame):
        raise Stop()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    name = os.path.relpath(a.file)
    try:
        seen = stamp(a.file)
        runs = 0
        while True:
            runs += 1
            print(f"kit watch: check #{runs} of {name} ({time.strftime('%H:%M:%S')})", flush=True)
            rc = run_check(a.command)
            verdict = "every TODO passes" if rc == 0 else f"exit {rc}"
            print(f"kit watch: {verdict}; waiting for you to save {name} (Ctrl-C ends)",
                  flush=True)
            # A save during the check counts: compare with the stamp from before it ran.
            while stamp(a.file) == seen:
                time.sleep(a.interval)
            seen = stamp(a.file)
            print(f"kit watch: {name} changed", flush=True)
    except Stop:
        print("\nkit watch: stopped", flush=True)
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
