"""Running a trainer for the check: one launch (alone, on the ranks of one node, or one rank per
node), its exit code, per-rank logs and per-rank run traces (KIT_TRACE_DIR, common/kit/check/trace.h),
and small readers of those traces."""
import ctypes
import ctypes.util
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import time

RUN_TIMEOUT = 300
# The dynamic loader's warning for an LD_PRELOAD it could not load ("ERROR: ld.so: object '...'
# from LD_PRELOAD cannot be preloaded (...): ignored."): the run goes on without it, and does
# something else than the check asked (a stop of the test hooks that never comes).
PRELOAD_IGNORED = re.compile(r"object '([^']*)' from LD_PRELOAD cannot be preloaded[^\n]*")
# Where the runs train inside a Slurm allocation (checklib/allocation.py; set by the engine):
# the environment they get, and one GPU per rank or None (the CPU).
PLACEMENT = None
# Collectives of these tiny runs take milliseconds; a rank that waits this long waits for a rank
# that will never come (e.g. save0 called on rank 0 only). Long enough for slow process starts.
COLLECTIVE_TIMEOUT = "30"


# The trainer's refusal of a rendezvous port another process holds (kit/runtime/process.cpp).
PORT_TAKEN = re.compile(r"MASTER_PORT \d+ on \S+ is already in use")


class Run:
    """One launch of a trainer: its exit code, per-rank logs and per-rank traces.

    layout: "alone" (one process, no launcher), "node" (ddprun: all ranks on this node) or
    "nodes" (every rank alone on a simulated node of its own: RANK=r, LOCAL_RANK=0)."""

    def __init__(self, directory, ranks):
        self.dir, self.ranks = directory, ranks
        self.code, self.stdout, self.stderr = None, "", ""
        self.startup = ""  # why the run did not start as asked (a preload ignored), or ""

    def paths(self):
        return (os.path.join(self.dir, d) for d in ("trace", "log", "out"))

    def launch(self, binary, layout, data, ddprun, flags, env_extra=None):
        shutil.rmtree(self.dir, ignore_errors=True)
        trace_dir, log_dir, out_dir = self.paths()
        for d in (trace_dir, log_dir, out_dir):
            os.makedirs(d)
        env = dict(os.environ, KIT_TRACE_DIR=trace_dir, KIT_TIMEOUT=COLLECTIVE_TIMEOUT,
                   OMP_NUM_THREADS="1")
        env.update(PLACEMENT.env if PLACEMENT else {})
        env.update(env_extra or {})  # the rules' RUN_ENV may shorten KIT_TIMEOUT, say
        preload = env.get("LD_PRELOAD", "")
        if preload and not os.path.isfile(preload):
            return self.not_started(f"the run needs {preload} preloaded, and it is not built")
        for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                    "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                    "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
            env.pop(var, None)
        cmd = [binary] + (["--data-dir", data] if data else []) + ["--out-dir", out_dir] + flags
        # The kernel, not the trainer, tells who wrote which file of the out-dir (check_save0).
        watch = DirWatch(out_dir)
        if layout == "nodes":
            self.code, self.stdout, self.stderr = run_nodes(cmd, env, self.ranks, log_dir, self.dir)
        else:
            if layout == "node":
                cmd = [ddprun, "--nproc-per-node", str(self.ranks), "--log-dir", log_dir, "--"] + cmd
            for attempt in range(3):
                try:
                    p = subprocess.run(cmd, env=env, cwd=self.dir, capture_output=True, text=True,
                                       timeout=RUN_TIMEOUT)
                    self.code, self.stdout, self.stderr = p.returncode, p.stdout, p.stderr
                except subprocess.TimeoutExpired:
                    self.code, self.stdout, self.stderr = -1, "", f"timed out after {RUN_TIMEOUT} s"
                # ddprun picks a free port and the ranks bind it a moment later: another run
                # started at the same time (a check launches several) may take it in between.
                # The trainer then refuses it at setup, before it writes anything to its out-dir;
                # the run starts again with fresh traces and logs.
                if layout != "node" or self.code == 0 or not PORT_TAKEN.search(self.stderr):
                    break
                for d in (trace_dir, log_dir):
                    shutil.rmtree(d, ignore_errors=True)
                    os.makedirs(d)
            if layout == "alone":
                with open(os.path.join(log_dir, "rank0.log"), "w") as f:
                    f.write(self.stdout + self.stderr)
                for p in os.listdir(trace_dir):  # no launcher, no RANK: named after the pid
                    os.rename(os.path.join(trace_dir, p), os.path.join(trace_dir, "rank0.trace"))
        files = watch.finish()
        logs = "".join(read(os.path.join(log_dir, f"rank{r}.log")) for r in range(self.ranks))
        ignored = PRELOAD_IGNORED.search(self.stdout + self.stderr + logs) if preload else None
        if ignored:
            reason = re.search(r"\(([^)]*)\)", ignored.group(0))
            self.startup = (f"the loader could not preload {ignored.group(1)}"
                            + (f" ({reason.group(1)})" if reason else "")
                            + " and ran the program without it")
            self.code = self.code or 127
        self.save(files)
        return self.load()

    def not_started(self, why):
        """A run that could not start as asked: no process, one line saying why."""
        self.code, self.stdout, self.stderr, self.startup = 127, "", "", why
        self.save([])
        return self.load()

    def save(self, files):
        with open(os.path.join(self.dir, "result.json"), "w") as f:
            json.dump({"code": self.code, "stdout": self.stdout, "stderr": self.stderr,
                       "files": files, "startup": self.startup}, f)

    def load(self):
        trace_dir, log_dir, self.out_dir = self.paths()
        with open(os.path.join(self.dir, "result.json")) as f:
            r = json.load(f)
        self.code, self.stdout, self.stderr = r["code"], r["stdout"], r["stderr"]
        self.files = r.get("files", [])
        self.startup = r.get("startup", "")
        self.logs = {r: read(os.path.join(log_dir, f"rank{r}.log")) for r in range(self.ranks)}
        self.traces = {r: parse_trace(os.path.join(trace_dir, f"rank{r}.trace"))
                       for r in range(self.ranks)}
        return self

    def events(self, rank, kind):
        return [fields for k, fields in self.traces[rank] if k == kind]

    def pids(self):
        """{pid: rank} of the processes that traced (each trace starts with "process pid=N")."""
        out = {}
        for r in range(self.ranks):
            for fields in self.events(r, "process"):
                if "pid" in kv(fields):
                    out[int(kv(fields)["pid"])] = r
        return out

    def writes(self, name):
        """Every complete write of the out-dir's file `name` the kernel saw, in order: the pid of
        the writer when it wrote a temporary file <name>.tmp.<pid> and renamed it to `name` (the
        kit's atomic write, kit/runtime/files.h), None when a process wrote `name` directly (see DirWatch:
        direct writes at the same moment may show as one)."""
        out = []
        for event, file, pid in self.files:
            if file == name:
                out.append(pid if event == "renamed" else None)
        return out

    def failure(self):
        """One line about a crash, or None."""
        if self.code == 0:
            return None
        if self.startup:
            return f"the run did not start as the check asked: {self.startup}"
        why = last_line(self.stderr + self.stdout)
        for r in range(self.ranks):  # the rank's own last words say more than the launcher's
            line = last_line(self.logs.get(r, ""))
            if line and re.search(r"error|what\(\)|terminate|abort|timed out|exception", line, re.I):
                why = line if line.startswith(f"rank {r}") else f"rank {r}: {line}"
                break
        return f"exit code {self.code}: {why or 'no output'}"

    def finished(self):
        return self.code == 0


class DirWatch:
    """Watches one folder with inotify(7) while a run writes into it, and turns the kernel's
    events into the complete writes of its files: ("written", name, None) when a process closed
    `name` after writing it directly, ("renamed", name, pid) when <name>.tmp.<pid> was renamed
    to `name`. The evidence does not depend on anything the program says about itself.

    The kernel merges an event into the previous one when both are identical and still unread:
    several processes writing `name` directly at once may show as one "written". A rename is
    never merged (each temporary name and rename cookie is unique), so the kit's atomic writes
    are counted exactly, and a direct write is seen at least once."""
    IN_CLOSE_WRITE, IN_MOVED_FROM, IN_MOVED_TO, IN_Q_OVERFLOW = 0x8, 0x40, 0x80, 0x4000
    IN_NONBLOCK = os.O_NONBLOCK
    HEADER = struct.Struct("iIII")  # wd, mask, cookie, len; then the name, NUL-padded to len

    def __init__(self, directory):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.fd = libc.inotify_init1(self.IN_NONBLOCK)
        if self.fd < 0 or libc.inotify_add_watch(
                self.fd, os.fsencode(directory),
                self.IN_CLOSE_WRITE | self.IN_MOVED_FROM | self.IN_MOVED_TO) < 0:
            raise OSError(ctypes.get_errno(), f"inotify cannot watch {directory}")
        self.raw = b""

    def drain(self):
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                return
            self.raw += chunk

    def finish(self):
        self.drain()
        os.close(self.fd)
        events, at = [], 0
        while at + self.HEADER.size <= len(self.raw):
            _, mask, cookie, length = self.HEADER.unpack_from(self.raw, at)
            at += self.HEADER.size
            name = self.raw[at:at + length].rstrip(b"\0").decode(errors="replace")
            at += length
            if mask & self.IN_Q_OVERFLOW:
                raise OSError("inotify: too many file events in the out-dir, some were lost")
            events.append((mask, cookie, name))
        moved_from = {cookie: name for mask, cookie, name in events if mask & self.IN_MOVED_FROM}
        writes = []
        for mask, cookie, name in events:
            if mask & self.IN_CLOSE_WRITE and ".tmp." not in name:
                writes.append(("written", name, None))
            elif mask & self.IN_MOVED_TO:
                source = moved_from.get(cookie, "")
                tail = source[len(name):] if source.startswith(name + ".tmp.") else ""
                pid = int(tail[5:]) if tail[5:].isdigit() else None
                writes.append(("renamed", name, pid) if pid is not None else ("written", name, None))
        return writes


def run_nodes(cmd, env, ranks, log_dir, cwd):
    """Starts `ranks` processes as a job of `ranks` nodes with one rank each (what ddprun cannot
    do): rank r has local rank 0. Stops them all when one fails. Returns (code, stdout, stderr)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(ranks):
        e = dict(env, RANK=str(r), LOCAL_RANK="0", WORLD_SIZE=str(ranks), LOCAL_WORLD_SIZE="1",
                 GROUP_RANK=str(r), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        if PLACEMENT and PLACEMENT.gpus:  # a node of its own: it sees its own GPU alone
            e["CUDA_VISIBLE_DEVICES"] = PLACEMENT.gpus[r]
        log = open(os.path.join(log_dir, f"rank{r}.log"), "w")
        procs.append((subprocess.Popen(cmd, env=e, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True), log))
    deadline, code, why = time.time() + RUN_TIMEOUT, 0, ""
    while any(p.poll() is None for p, _ in procs):
        failed = [(r, p.returncode) for r, (p, _) in enumerate(procs) if p.returncode not in (None, 0)]
        if failed or time.time() > deadline:
            code = failed[0][1] if failed else -1
            why = f"rank {failed[0][0]} exited with status {code}" if failed else \
                f"timed out after {RUN_TIMEOUT} s"
            break
        time.sleep(0.1)
    for p, log in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        log.close()
    if not code:
        bad = [(r, p.returncode) for r, (p, _) in enumerate(procs) if p.returncode != 0]
        if bad:
            code, why = bad[0][1], f"rank {bad[0][0]} exited with status {bad[0][1]}"
    return code, "", why


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def last_line(text):
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    return lines[-1] if lines else ""


def parse_trace(path):
    events = []
    for line in read(path).splitlines():
        kind, _, fields = line.partition(" ")
        events.append((kind, fields))
    return events


def kv(fields):
    return dict(part.split("=", 1) for part in fields.split() if "=" in part)


def epochs_of(run, rank, split):
    """The indices of `split` that `rank` read, one list per pass over the split (a pass is a
    run of consecutive batches of that split: training and evaluation alternate)."""
    passes, current = [], None
    for kind, fields in run.traces[rank]:
        if kind != "batch":
            continue
        name, _, idx = fields.partition(" ")
        if name != split:
            current = None
            continue
        if current is None:
            current = []
            passes.append(current)
        current.extend(int(i) for i in idx.split(",") if i)
    return passes


def first_pass(run, rank, split):
    passes = epochs_of(run, rank, split)
    return passes[0] if passes else []


def same_device(a, b):
    norm = lambda d: "cpu" if d in ("cpu", "cpu:0") else d  # noqa: E731 (cpu:0 is the cpu)
    return norm(a) == norm(b)


class Locked:
    def __init__(self, directory):
        os.makedirs(directory, exist_ok=True)
        self.f = open(os.path.join(directory, ".lock"), "w")

    def __enter__(self):
        fcntl.flock(self.f, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()
