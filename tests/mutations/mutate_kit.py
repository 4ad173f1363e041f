#!/usr/bin/env python3
"""mutate_kit.py -- mutation testing of the kit's library: do the tests catch realistic bugs?

    cmake --build build --target mutate-kit        every bug below, then the score
    mutate_kit.py --root . --work build/mutate-kit [--only NAME ...] [--targets T ...] [--repeat N]
                  [--list]

Each bug is a small edit of common/ (a line dropped, a wrong argument, a condition that is always
true), written as "replace this exact text by that". For each one, in a private copy of the
sources (never the checkout) with a build folder of its own: apply the edit, rebuild (make
recompiles only the changed file and relinks), run the CTest labels meant to catch it, stop at the
first failing test, and undo the edit. A bug is *caught* when some test fails, *survived* when all
of them pass. An edit whose text is no longer in the source, or that no longer compiles, is an
error of this table, not a result: the run stops and says which.

Bugs with a CAUGHT_BY entry run only that test; --repeat N runs each bug's tests N times and
counts a bug as caught only when they failed all N times (a catch by luck is not a catch).

Not part of `./kit test`: it rebuilds the kit once per bug and takes 15-30 minutes on 2 cores.
The score goes in tests/README.md ("Tests that bite").
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from checkout import copy_checkout  # noqa: E402 (tests/support)

# name, file, the exact text, its replacement, the labels that should catch it, what the bug is.
BUGS = [
    ("save0-every-rank", "common/kit/runtime/distributed.cpp",
     "  if (get_rank() == 0) {\n    torch::serialize::OutputArchive archive;",
     "  if (true) {\n    torch::serialize::OutputArchive archive;",
     ["unit", "student"], "save0 writes the file on every rank"),
    ("print0-every-rank", "common/kit/runtime/distributed.cpp",
     "  if (get_rank() != 0) return;\n  std::fputs(buffer, stdout);",
     "  std::fputs(buffer, stdout);",
     ["unit", "student"], "print0 prints on every rank"),
    ("all-reduce-ignores-op", "common/kit/runtime/distributed.cpp",
     "  g.all_reduce(tensor, op, site);",
     "  g.all_reduce(tensor, ReduceOp::SUM, site);",
     ["unit", "student"], "kit::all_reduce always sums, whatever op it is given"),
    ("finalize-stale-gradient", "common/kit/ddp/ddp.cpp",
     "      if (params[i].grad().defined()) into_bucket(i);\n      else windows[i].zero_();\n",
     "      if (params[i].grad().defined()) into_bucket(i);\n",
     ["ddp", "unit"], "a parameter without a gradient this step keeps its bucket slot's old value"),
    ("shuffle-ignores-epoch", "common/kit/data/data_loader.cpp",
     "std::mt19937_64 engine(seed_ + static_cast<uint64_t>(epoch_));",
     "std::mt19937_64 engine(seed_);",
     ["unit", "student"], "the shuffle ignores set_epoch: every epoch has the same order"),
    ("ddp-sums-gradients", "common/kit/ddp/ddp.cpp",
     "group->all_reduce_async({b.flat}, ReduceOp::AVG)",
     "group->all_reduce_async({b.flat}, ReduceOp::SUM)",
     ["ddp"], "DDP sums the ranks' gradients instead of averaging them"),
    ("ddp-no-broadcast", "common/kit/ddp/ddp.cpp",
     "    broadcast_from_rank0(*r.group, state);\n",
     "",
     ["ddp", "student"], "DDP does not copy rank 0's weights to the other ranks"),
    ("sampler-same-slice", "common/kit/data/data_loader.cpp",
     "for (size_t k = static_cast<size_t>(rank_); k < total; k += static_cast<size_t>(replicas_))",
     "for (size_t k = 0; k < total; k += static_cast<size_t>(replicas_))",
     ["unit", "ddp"], "every rank reads rank 0's slice of the data"),
    ("metrics-drops-last-row", "common/kit/train/metrics.cpp",
     "step >= 1 && step <= last) kept += line;",
     "step >= 1 && step < last) kept += line;",
     ["faults"], "a resumed run loses the metrics.csv row of the checkpoint's step"),
    ("checkpoint-checksum-ignored", "common/kit/train/checkpoint_format.cpp",
     "      else if (found.hex() != sum)\n",
     "      else if ((void)sum, false)\n",
     ["badinput", "faults"], "a damaged checkpoint whose size is right is loaded"),
    ("checkpoint-shards-unlisted", "common/kit/train/checkpoint_format.cpp",
     '  for (auto& f : files_under(dir, "zero")) files.push_back(f);\n',
     "",
     ["badinput", "faults"], "ZeRO's shards are not in the MANIFEST: a damaged one is loaded"),
    ("world-size-unchecked", "common/kit/runtime/distributed.cpp",
     "  if (theirs != env.world_size)\n",
     "  if (false)\n",
     ["badinput"], "ranks that disagree on WORLD_SIZE are not refused"),
    ("ddprun-keeps-others", "common/launcher/supervise.cpp",
     "  exit_status_ = r.exit_signal != 0 ? 128 + r.exit_signal : kExitRankFailed;\n"
     "  failed_.clear();\n  begin_stop(SIGTERM);\n}",
     "  exit_status_ = r.exit_signal != 0 ? 128 + r.exit_signal : kExitRankFailed;\n"
     "  failed_.clear();\n}",
     ["launcher", "faults", "badinput"], "ddprun does not stop the other ranks when one dies"),

    # Tests that bite, round 2: one bug per class that used to survive, each with the test that
    # must catch it (CAUGHT_BY below). No bug in zero.cpp/zero3.cpp: their insides are being
    # rewritten; ZeRO's public face is judged by ddp.ZeroExact and oracle.kit_adamw instead.
    ("adamw-decay-after-update", "common/kit/sharding/sharding.cpp",
     "      p.mul_(1 - lr * options_.weight_decay());\n      m.mul_(beta1).add_(g, 1 - beta1);\n"
     "      v.mul_(beta2).addcmul_(g, g, 1 - beta2);\n"
     "      auto denom = v.sqrt().div_(std::sqrt(bias_correction2)).add_(options_.eps());\n"
     "      p.addcdiv_(m, denom, -lr / bias_correction1);\n",
     "      m.mul_(beta1).add_(g, 1 - beta1);\n      v.mul_(beta2).addcmul_(g, g, 1 - beta2);\n"
     "      auto denom = v.sqrt().div_(std::sqrt(bias_correction2)).add_(options_.eps());\n"
     "      p.addcdiv_(m, denom, -lr / bias_correction1);\n"
     "      p.mul_(1 - lr * options_.weight_decay());\n",
     ["unit"], "ZeRO's AdamW decays the weights after the update instead of before"),
    ("sampler-other-shuffle", "common/kit/data/data_loader.cpp",
     "    for (size_t i = all.size(); i > 1; --i) {\n"
     "      size_t j = static_cast<size_t>(engine() % i);\n"
     "      std::swap(all[i - 1], all[j]);\n    }\n",
     "    std::shuffle(all.begin(), all.end(), engine);\n",
     ["oracle"], "the sampler shuffles with std::shuffle, not the documented Fisher-Yates"),
    ("flip-ignores-epoch", "common/kit/data/cifar10.cpp",
     "    const bool flip = ((r >> 32) & 1) != 0;",
     "    const bool flip = ((mix(mix(seed_) ^ index) >> 32) & 1) != 0;",
     ["oracle"], "the augmentation's flip is the same in every epoch"),
    ("lr-sqrt-of-the-rate", "common/kit/train/lr_rule.h",
     "    case LrScaling::sqrt: return lr * std::sqrt(ratio);",
     "    case LrScaling::sqrt: return std::sqrt(lr * ratio);",
     ["unit"], "the sqrt rule takes the root of the scaled rate, not of the batch ratio"),
    ("warmup-off-by-one", "common/kit/train/lr_rule.h",
     "  return static_cast<double>(step + 1) / static_cast<double>(warmup_steps);",
     "  return static_cast<double>(step) / static_cast<double>(warmup_steps);",
     ["unit"], "warm-up one step late: the first step's rate is zero"),
    ("epoch-rate-off-by-one", "common/kit/train/metrics.cpp",
     "span / static_cast<double>(epoch_steps_ - 1)",
     "span / static_cast<double>(epoch_steps_)",
     ["unit"], "an epoch's samples/s divides its time by the steps, not the intervals between them"),
    ("summary-per-rank-as-total", "common/kit/train/summary.cpp",
     "static_cast<double>(r.global_batch) / r.step_time_s",
     "static_cast<double>(r.batch_per_rank) / r.step_time_s",
     ["unit"], "the summary's images_per_s is one rank's rate, not the total"),
    ("zero-formula-state-unsharded", "common/kit/sharding/sharding.cpp",
     "  b.optimizer = 8 * (stage >= 1 ? shard : P);",
     "  b.optimizer = 8 * (stage >= 2 ? shard : P);",
     ["unit"], "the ZeRO formula keeps ZeRO-1's optimizer state whole"),
    ("write-without-fsync", "common/kit/runtime/files.cpp",
     "  if (write_error == 0 && ::fsync(fd) != 0) write_error = errno;\n",
     "",
     ["faults"], "checkpoint files are renamed into place without an fsync"),
    ("checkpoint-folder-unsynced", "common/kit/train/checkpoint.cpp",
     "    fsync_dir(dir_);\n",
     "",
     ["faults"], "a checkpoint folder's rename is never flushed (its parent folder not fsynced)"),
    ("workers-first-ready", "common/kit/data/loader_workers.cpp",
     "  changed_.wait(lock, [&] { return ready_.count(k) != 0 || failed_.count(k) != 0; });\n"
     "  if (auto bad = failed_.find(k); bad != failed_.end()) std::rethrow_exception(bad->second);\n"
     "  return ready_.at(k);",
     "  changed_.wait(lock, [&] { return !ready_.empty() || failed_.count(k) != 0; });\n"
     "  if (auto bad = failed_.find(k); bad != failed_.end()) std::rethrow_exception(bad->second);\n"
     "  return ready_.begin()->second;",
     ["unit"], "the loader hands out whichever batch is ready first"),
    ("buckets-reversed-arrival", "common/kit/ddp/ddp.cpp",
     "    std::vector<int64_t> order(arrived.begin(), arrived.end());",
     "    std::vector<int64_t> order(arrived.rbegin(), arrived.rend());",
     ["ddp"], "DDP rebuilds its buckets in the reverse of the order the gradients arrived in"),
]

# The test meant to catch each bug of round 2 (a ctest -R pattern within its labels): with it,
# a run tries only that test, and --repeat shows it fails every time. A gtest suite is one CTest
# test (kit_discover_tests), its RUN_SERIAL cases one each: the patterns match both.
CAUGHT_BY = {
    "adamw-decay-after-update": r"^unit\.ShardedAdamW(\.|$)",
    "sampler-other-shuffle": r"^oracle\.kit_sampler$",
    "flip-ignores-epoch": r"^oracle\.kit_augment$",
    "lr-sqrt-of-the-rate": r"^unit\.LrScaling(\.|$)",
    "warmup-off-by-one": r"^unit\.Warmup(\.|$)",
    "epoch-rate-off-by-one": r"^unit\.MetricsRates(\.|$)",
    "summary-per-rank-as-total": r"^unit\.Summary(\.|$)",
    "zero-formula-state-unsharded": r"^unit\.ZeroBytes(\.|$)",
    "write-without-fsync": r"^faults\.Checkpoints\.SyncsFilesAndFoldersAroundTheRename$",
    "checkpoint-folder-unsynced": r"^faults\.Checkpoints\.SyncsFilesAndFoldersAroundTheRename$",
    "workers-first-ready": r"^unit\.LoaderWorkersOrder(\.|$)",
    "buckets-reversed-arrival": r"^ddp\.DDPBuckets(\.RebuiltInRankZerosArrivalOrderAfterTheFirstStep)?$",
}


def copy_sources(root, dst):
    """The tracked files of the checkout (no build folders, no virtual environments)."""
    copy_checkout(root, dst)
    node = os.path.join(root, "slides", "node_modules")  # only if a bug's labels need the slides
    if os.path.isdir(node) and not os.path.exists(os.path.join(dst, "slides", "node_modules")):
        os.symlink(node, os.path.join(dst, "slides", "node_modules"))


def run(cmd, log, **kw):
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, **kw).returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True, help="the kit's checkout")
    ap.add_argument("--work", required=True, help="scratch folder: sources, build, logs")
    ap.add_argument("--prefix", default=os.environ.get("CMAKE_PREFIX_PATH", ""),
                    help="CMAKE_PREFIX_PATH of the LibTorch to build against")
    ap.add_argument("--torch-dir", default="", help="or Torch_DIR (what the main build found)")
    ap.add_argument("--cxx", default="", help="the C++ compiler (default: CMake's choice)")
    ap.add_argument("--jobs", default=str(os.cpu_count() or 2))
    ap.add_argument("--only", nargs="*", default=[], help="names of the bugs to try")
    ap.add_argument("--targets", nargs="*", default=[],
                    help="build only these targets (those of the tests that --only's bugs run): "
                         "minutes instead of the whole kit; default: everything")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each bug's tests this many times; caught only if they fail every time")
    ap.add_argument("--list", action="store_true", help="list the bugs and stop")
    ap.add_argument("--verify", action="store_true",
                    help="only check that every bug's text is in --root's sources, once")
    args = ap.parse_args()
    bugs = [b for b in BUGS if not args.only or b[0] in args.only]
    if args.verify:
        stale = [f"{name}: its text occurs {open(os.path.join(args.root, path)).read().count(old)} "
                 f"times in {path}" for name, path, old, *_ in BUGS
                 if open(os.path.join(args.root, path)).read().count(old) != 1]
        for line in stale:
            print("stale bug " + line)
        print(f"{len(BUGS) - len(stale)} of {len(BUGS)} bugs apply to the sources")
        return 1 if stale else 0
    if args.list or not bugs:
        for name, path, *_, labels, what in BUGS:
            print(f"{name:28} {path:32} {','.join(labels):22} {what}")
        return 0 if args.list else 2

    if args.targets and any(b[0] not in CAUGHT_BY for b in bugs):
        sys.exit("mutate_kit.py: --targets only with bugs that name their test (CAUGHT_BY): the "
                 "other tests of their labels would fail for want of a binary, not for the bug")
    src, build = os.path.join(args.work, "src"), os.path.join(args.work, "build")
    log = os.path.join(args.work, "mutate-kit.log")
    shutil.rmtree(src, ignore_errors=True)
    os.makedirs(src)
    open(log, "w").close()
    copy_sources(args.root, src)
    for name, path, old, *_ in bugs:  # a stale table stops before hours of building
        n = open(os.path.join(src, path)).read().count(old)
        if n != 1:
            sys.exit(f"mutate_kit.py: bug {name}: its text occurs {n} times in {path} (expected "
                     "once): update the table")
    configure = ["cmake", "-S", src, "-B", build, "-DCMAKE_BUILD_TYPE=Release"]
    configure += [f"-DCMAKE_PREFIX_PATH={args.prefix}"] if args.prefix else []
    configure += [f"-DTorch_DIR={args.torch_dir}"] if args.torch_dir else []
    configure += [f"-DCMAKE_CXX_COMPILER={args.cxx}"] if args.cxx else []
    print(f"mutate-kit: {len(bugs)} bugs; building the unmodified kit in {build} (log: {log})",
          flush=True)
    make = ["cmake", "--build", build, "-j", args.jobs] + (["--target"] + args.targets if args.targets else [])
    if run(configure, log) or run(make, log):
        sys.exit(f"mutate_kit.py: the unmodified kit does not build (log: {log})")

    # The named tests must pass on the unmodified kit: one that always fails catches nothing.
    named = [CAUGHT_BY[b[0]] for b in bugs if b[0] in CAUGHT_BY]
    if named:
        out = subprocess.run(["ctest", "--test-dir", build, "-R", "|".join(named), "--timeout",
                              "600", "--no-tests=error"], capture_output=True, text=True)
        with open(log, "a") as f:
            f.write(out.stdout + out.stderr)
        if out.returncode != 0:
            sys.exit(f"mutate_kit.py: the tests named in CAUGHT_BY fail on the unmodified kit "
                     f"(log: {log})")

    results = []
    for name, path, old, new, labels, what in bugs:
        file = os.path.join(src, path)
        original = open(file).read()
        start = time.time()
        try:
            with open(file, "w") as f:
                f.write(original.replace(old, new, 1))
            if run(make, log):
                sys.exit(f"mutate_kit.py: bug {name} does not compile (log: {log}): fix the table")
            regex = "^(" + "|".join(re.escape(label) for label in labels) + ")$"
            ctest = ["ctest", "--test-dir", build, "-L", regex, "--stop-on-failure", "--timeout",
                     "600", "--no-tests=error"]
            if name in CAUGHT_BY:  # only the test meant to catch it (a pattern that matches none
                ctest += ["-R", CAUGHT_BY[name]]  # is an error of the table, not a catch)
            fails, by = 0, ""
            for _ in range(args.repeat):
                out = subprocess.run(ctest, capture_output=True, text=True)
                with open(log, "a") as f:
                    f.write(out.stdout + out.stderr)
                if "No tests were found" in out.stdout + out.stderr:
                    sys.exit(f"mutate_kit.py: bug {name}: no test matches {CAUGHT_BY.get(name)} "
                             f"in labels {labels}: fix the table")
                # ctest's closing list: "	131 - ddp.Name  # GetParam() = ... (Failed)"
                failed = re.findall(
                    r"^\s+\d+ - (\S+).*\((?:Failed|Timeout|Exception|[A-Za-z ]+)\)$",
                    out.stdout, re.M)
                if out.returncode != 0:
                    fails += 1
                    by = by or (failed[0] if failed else "(ctest failed)")
            caught = fails == args.repeat  # a bug caught only sometimes is a flaky test
            if args.repeat > 1:
                by = f"{by or '-'} ({fails}/{args.repeat})"
        finally:
            with open(file, "w") as f:
                f.write(original)
        results.append((name, caught, by, time.time() - start, what))
        print(f"  {'caught  ' if caught else 'SURVIVED'} {name:28} {by or '-':60} "
              f"{time.time() - start:5.0f} s", flush=True)
    run(make, log)  # leave the copy unmodified, built

    caught = sum(1 for r in results if r[1])
    print(f"\nmutate-kit: {caught} of {len(results)} bugs caught")
    for name, ok, by, _, what in results:
        if not ok:
            print(f"  survived: {name}: {what}")
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
