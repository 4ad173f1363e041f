#!/usr/bin/env python3
"""cluster.login_node_scene: the login node's scene (scene.py) on its own, cheap enough for every
CI run. The whole login-node test takes minutes and needs the CUDA torch; its scene broke twice
where that test alone would show it late: on a machine that never had /usr/include/gloo (the
probe's lines shifted by an `ls` error) and from a clone below a mode-700 folder (the user could
not reach its home, nor the torch given to it).

Without root: the probe's parsing only. As root, also the scene itself: a "clone" with a site
folder of Python packages below a fresh mode-700 folder, the user's home and the site reached as
`nobody`, the Gloo headers hidden (absent or empty), no network, and the scene's folder removed.
"""
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "support"))
sys.path.insert(0, HERE)
from scene import GLOO, PROBE, Scene, judge_probe, parse_probe  # noqa: E402
from verdict import expect, finish  # noqa: E402

NET_ERROR = "OSError: [Errno 101] Network is unreachable"


def parsing():
    """The parser on what the probe prints on each kind of machine."""
    def verdicts(out):
        return [holds for holds, _ in judge_probe(parse_probe(out))]

    fresh = f"uid=65534\nls: cannot access '{GLOO}': No such file or directory\ngloo=hidden\nnet={NET_ERROR}\n"
    expect(verdicts(fresh) == [True, True, True],
           "a stray error line among the probe's lines shifts nothing", fresh)
    expect(verdicts(f"uid=65534\ngloo=visible\nnet={NET_ERROR}\n") == [True, False, True],
           "visible Gloo headers fail that promise alone")
    expect(verdicts("uid=0\ngloo=hidden\nnet=connected\n") == [False, True, False],
           "root and a reachable network fail theirs")
    expect(verdicts("sh: 1: cd: can't cd to /x\n") == [False, False, False],
           "a probe that printed nothing of its own keeps no promise")


def the_scene():
    """The scene as login_node.py sets it, from a clone below a mode-700 folder."""
    private = tempfile.mkdtemp(prefix="kit-scene-clone.")   # mode 700, as mktemp -d makes it
    expect(os.stat(private).st_mode & 0o777 == 0o700, "the clone's folder is mode 700")
    site = os.path.join(private, "clone", ".venv-cuda", "lib", "python3", "site-packages")
    os.makedirs(site)
    with open(os.path.join(site, "site_module_probe.py"), "w") as f:
        f.write("WHERE = 'the site module'\n")
    scene = Scene()
    work = scene.work
    try:
        expect(not work.startswith(private), "the scene's folder is not below the clone's")
        os.makedirs(os.path.join(scene.home, "kit"))
        scene.give_to_user()
        rc, out = scene.as_user(site, PROBE + "; cd ~/kit && echo home=ok; "
                                "python3 -c 'import site_module_probe as m; print(\"site=\" + m.WHERE)'",
                                timeout=60)
        facts = parse_probe(out)
        for holds, what in judge_probe(facts):
            expect(rc == 0 and holds, what, out)
        expect(rc == 0 and "home=ok" in out, "the user can cd into its home", out)
        expect(rc == 0 and "site=the site module" in out,
               "the user imports from the site folder given to it", out)
        print(f"     (here {GLOO} is " + ("absent" if not os.path.isdir(GLOO) else
              "present, hidden behind an empty folder") + ")")
    finally:
        scene.remove()
        shutil.rmtree(private, ignore_errors=True)
    expect(not os.path.exists(work), "the scene's folder is removed afterwards")


def main():
    parsing()
    if os.geteuid() == 0:
        the_scene()
    else:
        print("the scene itself needs root (a user, namespaces): parsing only")
    return finish()


if __name__ == "__main__":
    sys.exit(main())
