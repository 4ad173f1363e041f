"""copy_checkout(): the repository's files copied elsewhere, as git sees them: no build folders,
no virtual environments, nothing git ignores. Used where a test or tool works on a copy of the
kit (tests/mutations/mutate_kit.py, tests/cluster/login_node.py).

    sys.path.insert(0, <tests/support>); from checkout import copy_checkout
"""
import os
import shutil
import subprocess


def copy_checkout(root, dst, untracked=False):
    """The tracked files of the checkout at root, into dst; with untracked=True also the untracked
    ones git does not ignore (work in progress, as a clone of it would have it once committed).
    A file deleted in the work tree is left out; a symbolic link is copied as a link."""
    cmd = ["git", "-C", root, "ls-files", "-z"] + (["-co", "--exclude-standard"] if untracked else [])
    names = subprocess.run(cmd, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, names):
        src = os.path.join(root, os.fsdecode(name))
        if not (os.path.islink(src) or os.path.isfile(src)):  # deleted, or a folder (submodule)
            continue
        out = os.path.join(dst, os.fsdecode(name))
        os.makedirs(os.path.dirname(out), exist_ok=True)
        shutil.copy2(src, out, follow_symlinks=False)
