"""The login node's scene, shared by login_node.py (the whole morning) and test_scene.py (the
scene alone, cheap enough for every CI run): where the unprivileged user's home is, how a script
runs there as that user, and what the scene's probe found.

The user's home is never under the clone: a clone may sit below a folder only root can enter (a
`mktemp -d` folder has mode 700), and then the user could not even `cd` into its own home. The
scene gets its own folder under /tmp instead, mode 755, which Scene.remove() takes away again.
The torch that plays the site's module (the clone's .venv-cuda, below that same folder) is bound
into the scene's folder (scene/site) inside the scene's mount namespace, as a module's software
tree is mounted on a cluster, and PYTHONPATH names it there.
"""
import os
import pwd
import shutil
import subprocess
import tempfile

USER = "nobody"
GLOO = "/usr/include/gloo"   # the system's Gloo headers: hidden in the scene, when they exist

# The probe prints one "key=value" line per fact, so that a stray line (an error message of a
# command that has nothing to list) can never shift the others.
PROBE = (
    "echo uid=$(id -u); "
    f"if [ -n \"$(ls -A {GLOO} 2>/dev/null)\" ]; then echo gloo=visible; else echo gloo=hidden; fi; "
    "echo net=$(python3 -c 'import socket; socket.create_connection((\"pypi.org\", 443), 3)' "
    "2>&1 | tail -n 1 | tr -d '\\n' | sed 's/^$/connected/')"
)


def parse_probe(out):
    """PROBE's output as {key: value}; lines that are not key=value are ignored."""
    facts = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ("uid", "gloo", "net"):
            facts[key] = value.strip()
    return facts


def judge_probe(facts):
    """[(holds, what)] for the scene's three promises."""
    return [
        (facts.get("uid", "0") not in ("", "0"), "the steps run as a user, not root"),
        # "Hidden" means absent or empty: a fresh machine has no /usr/include/gloo at all.
        (facts.get("gloo") == "hidden", "the system's Gloo headers are hidden"),
        ("rror" in facts.get("net", ""), "the network cannot be reached"),
    ]


class Scene:
    """A home for USER under its own folder in /tmp (mode 755), with an empty folder to hide the
    Gloo headers behind."""

    def __init__(self, prefix="kit-login-node."):
        self.work = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
        os.chmod(self.work, 0o755)
        self.home = os.path.join(self.work, "home")
        self.empty = os.path.join(self.work, "empty")
        self.site = os.path.join(self.work, "site")
        for d in (self.home, self.empty, self.site):
            os.makedirs(d)

    def give_to_user(self):
        """Everything under the home belongs to USER."""
        user = pwd.getpwnam(USER)
        for d, _, names in os.walk(self.home):
            for p in [d] + [os.path.join(d, n) for n in names]:
                os.lchown(p, user.pw_uid, user.pw_gid)

    def as_user(self, site, script, timeout=1500):
        """Run a shell script as USER in the scene: a new mount and network namespace with
        loopback only, the Gloo headers (if any) behind an empty folder, and, when site is given,
        that folder of Python packages bound at scene/site and named by PYTHONPATH. (exit code,
        stdout and stderr together)."""
        path = "/usr/local/bin:/usr/bin:/bin"
        scene = f"""set -e
ip link set lo up
if [ -d {GLOO} ]; then mount --bind {self.empty} {GLOO}; fi
if [ -n "$site" ]; then mount --bind "$site" {self.site}; site={self.site}; fi
cd /
exec setpriv --reuid={USER} --regid=$(id -g {USER}) --clear-groups \\
  env -i HOME={self.home} PATH={path} ${{site:+PYTHONPATH=$site}} LANG=C.UTF-8 KIT_JOBS=2 sh -c "$1"
"""
        run = subprocess.run(["unshare", "--mount", "--net", "env", f"site={site}", "sh", "-c",
                              scene, "scene", script],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=timeout)
        return run.returncode, run.stdout

    def remove(self):
        shutil.rmtree(self.work, ignore_errors=True)
