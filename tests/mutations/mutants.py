#!/usr/bin/env python3
"""The mutation suite's table: typical student mistakes, each a small patch on an exercise's
solution, and the TODO that `kit check` (common/tools/check.py) must name for it.

A mutant is the solution with one mistake in it: a dropped line, a wrong argument, the right
code in the wrong place. Every (old, new) edit must match the solution exactly once; when the
solution changes so that one no longer does, `write` fails and names it (the build stops), so
the suite cannot silently rot. `verify` (a test of its own) applies every patch and checks that
every TODO of every exercise's trainer has at least one mutant.

Kinds:
  run        compiles; the check must fail, its first ✘ must be `todo`, and the failing TODOs
             must be exactly {todo} | also ("all", the final-loss row, is not constrained)
  compile    does not compile; the check's compiler report must name `todo`
  equivalent a correct rewrite the check must pass in full (guards against false alarms)

usage: mutants.py list EXERCISE              id kind todo, one mutant a line (for CMake)
       mutants.py write EXERCISE ID SOLUTION OUT
       mutants.py show EXERCISE ID           the mutant as JSON
       mutants.py verify                     every patch applies; every TODO is covered
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

AVG_TRAIN = "kit::all_reduce(mean, kit::ReduceOp::AVG);  // this rank's mean -> the mean over all ranks"
AVG_EVAL = "kit::all_reduce(mean, kit::ReduceOp::AVG);  // the loss of the whole split, on every rank"
# (id, kind, todo, what, [(old, new), ...], also)
MUTANTS = {
    "01-transformer-lm-ddp": [
        ("include-path", "compile", "1", "#include \"distributed.h\": the header without its kit/ folder",
         [('#include "kit/distributed.h"', '#include "distributed.h"')], []),
        ("no-distributed-include", "compile", "1", "kit/distributed.h not included (only kit/ddp.h)",
         [('#include "kit/distributed.h"      // setup(), all_reduce(), print0(), save0(), '
           'destroy_process_group()\n', "")], []),
        ("cuda-rank", "run", "2-3", "the device numbered by the global rank (cuda:rank, on this "
         "CPU-only machine cpu:rank) instead of setup()'s cuda:local_rank",
         [("auto [local_rank, rank, device, world_size] = kit::setup(args.seed);",
           "auto [local_rank, rank, setup_device, world_size] = kit::setup(args.seed);\n"
           "  torch::Device device(setup_device.type(), rank);")], []),
        ("per-rank-seed", "run", "4", "the training sampler seeded with args.seed + rank",
         [("train_sampler(train_data, /*shuffle=*/true, args.seed);",
           "train_sampler(train_data, /*shuffle=*/true, args.seed + rank);")], []),
        ("train-no-shuffle", "run", "4", "the training sampler with shuffle=false",
         [("train_sampler(train_data, /*shuffle=*/true, args.seed);",
           "train_sampler(train_data, /*shuffle=*/false, args.seed);")], []),
        ("val-shuffles", "run", "4", "the validation sampler without shuffle=false (it shuffles "
         "by default)",
         [("val_sampler(val_data, /*shuffle=*/false);", "val_sampler(val_data);")], []),
        ("train-loader-shuffle", "run", "5", "the training loader keeps shuffle=true; the sampler "
         "is made but never used",
         [("Loader train_loader(train_data, args.batch_size, train_sampler);",
           "Loader train_loader(train_data, args.batch_size, /*shuffle=*/true);")], ["9"]),
        ("train-loader-val-sampler", "run", "5", "the training loader gets val_sampler",
         [("Loader train_loader(train_data, args.batch_size, train_sampler);",
           "Loader train_loader(train_data, args.batch_size, val_sampler);")], []),
        ("val-loader-no-sampler", "run", "6", "the validation loader without its sampler",
         [("Loader val_loader(val_data, args.eval_batch_size, val_sampler);",
           "Loader val_loader(val_data, args.eval_batch_size);")], []),
        ("test-loader-no-sampler", "run", "7", "the test loader without its sampler",
         [("Loader test_loader(test_data, args.eval_batch_size, test_sampler);",
           "Loader test_loader(test_data, args.eval_batch_size);")], []),
        ("no-ddp", "run", "8", "no DistributedDataParallel",
         [("  kit::DistributedDataParallel ddp(model);  // from here on, backward() averages gradients\n",
           "")], []),
        ("ddp-temporary", "run", "8", "DistributedDataParallel as a temporary, destroyed at once",
         [("kit::DistributedDataParallel ddp(model);", "kit::DistributedDataParallel{model};")], []),
        ("set-epoch-late", "run", "9", "set_epoch() after the epoch's training (right code, "
         "wrong place)",
         [("    train_sampler.set_epoch(epoch);\n", ""),
          ("    double val_loss = evaluate(",
           "    train_sampler.set_epoch(epoch);\n    double val_loss = evaluate(")], []),
        ("sum-no-divide", "run", "10", "ReduceOp::SUM without dividing by the world size",
         [(AVG_TRAIN, "kit::all_reduce(mean, kit::ReduceOp::SUM);"),
          (AVG_EVAL, "kit::all_reduce(mean, kit::ReduceOp::SUM);")], []),
        ("eval-not-reduced", "run", "10", "evaluate() returns this rank's loss (its all_reduce "
         "dropped)",
         [("  " + AVG_EVAL + "\n", "")], []),
        ("printf-test-loss", "run", "11", "the final test loss printed with std::printf",
         [('kit::print0("final test loss', 'std::printf("final test loss')], []),
        ("torch-save-final", "run", "12", "the final model saved with torch::save",
         [('kit::save0(model, args.out_dir + "/model-final.pt");',
           'torch::save(model, args.out_dir + "/model-final.pt");')], []),
        ("save0-rank0-only", "run", "12", "save0 called on rank 0 only, inside if (rank == 0): "
         "its barrier waits for ranks that never come",
         [('kit::save0(model, args.out_dir + "/model-final.pt");',
           'if (rank == 0) kit::save0(model, args.out_dir + "/model-final.pt");')], []),
        ("no-destroy", "run", "13", "destroy_process_group() dropped",
         [("  kit::destroy_process_group();\n", "")], []),
        ("destroy-early", "run", "13", "destroy_process_group() before the final save0 (right "
         "code, wrong place)",
         [("  kit::destroy_process_group();\n", ""),
          ('kit::save0(model, args.out_dir + "/model-final.pt");',
           'kit::destroy_process_group();\n    kit::save0(model, args.out_dir + "/model-final.pt");')],
         []),
        ("sum-then-divide", "equivalent", "10", "ReduceOp::SUM, then divided by the world size "
         "(correct: must pass)",
         [(AVG_TRAIN, "kit::all_reduce(mean, kit::ReduceOp::SUM);\n"
           "  mean /= kit::get_world_size();"),
          (AVG_EVAL, "kit::all_reduce(mean, kit::ReduceOp::SUM);\n"
           "  mean /= kit::get_world_size();")], []),
    ],
}


class MutantError(Exception):
    pass


def mutants(ex):
    if ex not in MUTANTS:
        return []
    return [dict(id=i, kind=k, todo=t, what=w, edits=e, also=a) for i, k, t, w, e, a in MUTANTS[ex]]


def find(ex, mid):
    for m in mutants(ex):
        if m["id"] == mid:
            return m
    raise MutantError(f"no mutant '{mid}' for exercise {ex} (tests/mutations/mutants.py)")


def apply(m, text, where):
    for n, (old, new) in enumerate(m["edits"], 1):
        count = text.count(old)
        if count != 1:
            raise MutantError(
                f"mutant '{m['id']}' (TODO {m['todo']}), edit {n}: the text to replace occurs "
                f"{count} times in {where}, not once; update tests/mutations/mutants.py to the "
                f"changed solution. The text:\n{old}")
        text = text.replace(old, new)
    return text


def solution_path(ex):
    info = subprocess.run([sys.executable, os.path.join(ROOT, "common/tools/stages.py"), "info", ex],
                          capture_output=True, text=True, check=True)
    files = [f for f in json.loads(info.stdout)["files"] if f.get("lang", "cpp") == "cpp"]
    return os.path.join(ROOT, files[0]["solution"])


def verify():
    errors = []
    for ex in sorted(MUTANTS):
        rows = json.loads(subprocess.run(
            [sys.executable, os.path.join(ROOT, "common/tools/stages.py"), "todos", ex, "--json"],
            capture_output=True, text=True, check=True).stdout)
        labels = {r["todo"] for r in rows if r.get("lang", "cpp") == "cpp"}
        path = solution_path(ex)
        text = open(path, encoding="utf-8").read()
        seen = set()
        for m in mutants(ex):
            if m["id"] in seen:
                errors.append(f"{ex}: mutant id '{m['id']}' twice")
            seen.add(m["id"])
            try:
                if apply(m, text, path) == text:
                    errors.append(f"{ex}: mutant '{m['id']}' changes nothing")
            except MutantError as e:
                errors.append(f"{ex}: {e}")
            if m["todo"] not in labels:
                errors.append(f"{ex}: mutant '{m['id']}' names TODO {m['todo']}, which the "
                              f"exercise does not have ({sorted(labels)})")
        covered = {m["todo"] for m in mutants(ex) if m["kind"] != "equivalent"}
        for label in sorted(labels - covered, key=lambda l: int(l.split("-")[0])):
            errors.append(f"{ex}: no mutant for TODO {label}")
        print(f"{ex}: {len(mutants(ex))} mutants, TODOs covered: "
              f"{', '.join(sorted(covered, key=lambda l: int(l.split('-')[0])))}")
    for ex in [e for e in os.listdir(os.path.join(ROOT, "exercises"))
               if os.path.isfile(os.path.join(ROOT, "exercises", e, "info.toml"))]:
        if ex not in MUTANTS:
            errors.append(f"exercise {ex} has no mutants in tests/mutations/mutants.py")
    for e in errors:
        print("FAIL " + e)
    return 1 if errors else 0


def main(argv):
    if len(argv) >= 1 and argv[0] == "verify":
        return verify()
    if len(argv) == 2 and argv[0] == "list":
        for m in mutants(argv[1]):
            print(m["id"], m["kind"], m["todo"])
        return 0
    if len(argv) == 3 and argv[0] == "show":
        print(json.dumps(find(argv[1], argv[2])))
        return 0
    if len(argv) == 5 and argv[0] == "write":
        ex, mid, solution, out = argv[1:]
        m = find(ex, mid)
        text = apply(m, open(solution, encoding="utf-8").read(), solution)
        header = (f"// MUTANT {mid} of {ex} (tests/mutations/mutants.py), a mistake for TODO "
                  f"{m['todo']}: {m['what']}\n")
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        # The header replaces the solution's first line (a comment), so that the mutant's line
        # numbers stay the solution's.
        lines = text.split("\n")
        if lines[0].startswith("//"):
            lines[0] = header.rstrip("\n")
        new = "\n".join(lines)
        if not os.path.exists(out) or open(out, encoding="utf-8").read() != new:
            with open(out, "w", encoding="utf-8") as f:
                f.write(new)
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except MutantError as e:
        sys.stderr.write(f"mutants.py: {e}\n")
        sys.exit(1)
