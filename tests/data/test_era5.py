#!/usr/bin/env python3
"""Exercise 06's data path, checked from outside the kit.

  layout     make_weather's files, read with h5py and numpy (not the kit): train/ and valid/ hold
             one dataset "fields" of float32 [time, channel, lat, lon] each; stats/ holds
             global_means.npy and global_stds.npy of shape [1, C, 1, 1], equal to the per-channel
             mean and standard deviation numpy computes over the training files; the next time
             step is the current one carried east (the dynamics the model must learn)
  learnable  a short run of the solution on fields of eight "years" (make_weather's default grid,
             20 steps a file): u10's RMSE after 95 steps is well below the first epoch's, and
             below a forecast of "no change" (persistence) on the validation year. (The bundled
             set's two training years are too few: the model learns them, 0.08 training loss,
             but on a new year stays above persistence, 0.35 against 0.27 after 60 steps; here
             0.158 against 0.210, measured.)
  badinput   the solution on damaged data (files written with h5py): a dataset of 3 dimensions, a
             NaN, another channel count than the statistics, a file that is not HDF5, missing
             statistics: each one line on stderr naming the file, a non-zero exit; and the run's
             own bad input: --amp fp16 on a CPU (one line saying to use bf16), a profile folder
             that cannot be written (one line, and training goes on to its end), a patch size
             that does not divide the grid

usage: test_era5.py layout MAKE_WEATHER WORKDIR
       test_era5.py learnable TRAINER MAKE_WEATHER WORKDIR
       test_era5.py badinput TRAINER MAKE_WEATHER WORKDIR
"""
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

SMALL = ["--channels", "3", "--lat", "8", "--lon", "16", "--steps", "6", "--train-files", "2",
         "--valid-files", "1", "--seed", "5"]
# A tiny model for the trainer's runs.
TINY = ["--patch-size", "4", "--embed-dim", "16", "--depth", "1", "--heads", "2",
        "--batch-size", "2", "--max-steps", "2"]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def generate(make_weather, out, args=SMALL):
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([make_weather, "--out", out] + args, check=True, capture_output=True)
    return out


def layout(make_weather, work):
    data = generate(make_weather, os.path.join(work, "fields"))
    fields = {}
    for split, count in (("train", 2), ("valid", 1)):
        files = sorted(os.listdir(os.path.join(data, split)))
        check(len(files) == count and all(f.endswith(".h5") for f in files),
              f"{split}/ holds {count} .h5 files: {files}")
        for name in files:
            with h5py.File(os.path.join(data, split, name), "r") as f:
                check(list(f.keys()) == ["fields"], f"{split}/{name} holds one dataset 'fields'")
                d = f["fields"]
                check(d.shape == (6, 3, 8, 16) and d.dtype == np.float32,
                      f"{split}/{name}: fields {d.shape} {d.dtype} is float32 [time, channel, lat, lon]")
                fields[(split, name)] = d[...]
    means = np.load(os.path.join(data, "stats", "global_means.npy"))
    stds = np.load(os.path.join(data, "stats", "global_stds.npy"))
    check(means.shape == (1, 3, 1, 1) and stds.shape == (1, 3, 1, 1) and means.dtype == np.float32,
          f"stats: means {means.shape} {means.dtype}, stds {stds.shape}: float32 [1, C, 1, 1]")
    train = np.concatenate([v for (s, _), v in fields.items() if s == "train"]).astype(np.float64)
    want_mean = train.mean(axis=(0, 2, 3))
    want_std = train.std(axis=(0, 2, 3))
    check(np.allclose(means.ravel(), want_mean, rtol=1e-5, atol=1e-4),
          f"the means are numpy's over the training files: {means.ravel()} vs {want_mean}")
    check(np.allclose(stds.ravel(), want_std, rtol=1e-4),
          f"the standard deviations are numpy's: {stds.ravel()} vs {want_std}")
    # Channel 0 is u10 (mean 0 by construction), channel 2 t2m (around 278 K): the offsets differ,
    # so normalising per channel matters.
    check(abs(want_mean[2] - 278) < 60 and abs(want_mean[0]) < 10,
          f"u10 and t2m have the offsets of their real variables: {want_mean}")
    # The dynamics: each row moves east by its own fractional number of points per step, so step
    # t + 1 is closer to step t shifted east by one point than to step t itself, in the middle
    # rows (the fastest wind).
    f = fields[("train", sorted(n for s, n in fields if s == "train")[0])][:, 0]
    still = np.abs(f[1:, 4] - f[:-1, 4]).mean()
    moved = np.abs(f[1:, 4] - np.roll(f[:-1, 4], 1, axis=-1)).mean()
    check(moved < still, f"the fields move east: {moved:.3f} after a shift by one point, {still:.3f} unshifted")


def run(cmd, cwd=None):
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    return p.returncode, p.stdout, p.stderr


def lines(text):
    return [l for l in text.splitlines() if l.strip()]


def learnable(trainer, make_weather, work):
    os.makedirs(work, exist_ok=True)
    data = generate(make_weather, os.path.join(work, "fields"),
                    ["--train-files", "8", "--steps", "20", "--seed", "7"])
    code, out, err = run([trainer, "--data-dir", data, "--out-dir", work, "--epochs", "5",
                          "--max-steps", "20", "--batch-size", "8", "--patch-size", "4",
                          "--embed-dim", "64", "--depth", "2", "--heads", "4", "--lr", "2e-3",
                          "--seed", "1"])
    check(code == 0, f"the solution trains on eight years of fields ({err.strip()[-200:]})")
    rmse = [float(l.rsplit(" ", 1)[1]) for l in lines(out) if "u10 RMSE" in l and l.startswith("[")]
    check(len(rmse) == 5 and rmse[-1] < 0.8 * rmse[0],
          f"u10's RMSE falls over five epochs of 19 steps: {rmse}")
    # Persistence (tomorrow = today) on the validation fields, in normalised units, latitude
    # weighted as the trainer's metric: the model must do better than not moving at all.
    means = np.load(os.path.join(data, "stats", "global_means.npy")).ravel()
    stds = np.load(os.path.join(data, "stats", "global_stds.npy")).ravel()
    with h5py.File(os.path.join(data, "valid", sorted(os.listdir(os.path.join(data, "valid")))[0])) as f:
        u = (f["fields"][:, 0].astype(np.float64) - means[0]) / stds[0]
    rows = u.shape[1]
    lat = 90 - np.arange(rows) * 180 / (rows - 1)
    w = np.cos(np.radians(lat))
    w = (w / w.mean())[:, None]
    persistence = np.mean([np.sqrt((w * (u[t + 1] - u[t]) ** 2).mean()) for t in range(len(u) - 1)])
    check(rmse and rmse[-1] < persistence,
          f"after 95 steps u10's RMSE {rmse[-1] if rmse else '?'} beats persistence's {persistence:.3f}")


def badinput(trainer, make_weather, work):
    good = generate(make_weather, os.path.join(work, "good"))

    def copy(name):
        out = os.path.join(work, name)
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(good, out)
        return out

    def refused(data, why, words, extra=()):
        code, out, err = run([trainer, "--data-dir", data, "--out-dir", os.path.join(work, "out")]
                             + TINY + list(extra))
        said = lines(err)
        check(code != 0 and len(said) == 1 and all(w in said[0] for w in words),
              f"{why}: one line naming it, exit {code}: {said}")

    d = copy("rank3")
    path = os.path.join(d, "train", "2002.h5")
    with h5py.File(path, "r+") as f:
        x = f["fields"][...]
        del f["fields"]
        f["fields"] = x[:, 0]  # [time, lat, lon]: no channel axis
    refused(d, "a dataset of 3 dimensions", [path, "3 dimensions", "[time, channel, lat, lon]"])

    d = copy("nan")
    path = os.path.join(d, "train", "2001.h5")
    with h5py.File(path, "r+") as f:
        f["fields"][3, 2, 1, 5] = np.nan
    # Every sample of the epoch is read (no --max-steps over it): the NaN is met.
    refused(d, "a NaN in a field", [path, "time step 3", "channel 2", "NaN"],
            ["--max-steps", "0", "--epochs", "1"])

    d = copy("channels")
    path = os.path.join(d, "valid", "2003.h5")
    with h5py.File(path, "r+") as f:
        x = f["fields"][...]
        del f["fields"]
        f["fields"] = x[:, :2]
    refused(d, "another number of channels than the statistics", [path, "2 channels", "3"])

    d = copy("not-hdf5")
    path = os.path.join(d, "train", "2001.h5")
    with open(path, "w") as f:
        f.write("not an HDF5 file\n")
    refused(d, "a file that is not HDF5", [path, "HDF5"])

    d = copy("no-stats")
    os.remove(os.path.join(d, "stats", "global_stds.npy"))
    refused(d, "missing statistics", ["global_stds.npy"])

    refused(good, "--amp fp16 on a CPU", ["fp16", "use --amp bf16"], ["--amp", "fp16"])
    refused(good, "a patch size that does not divide the grid", ["--patch-size"],
            ["--patch-size", "3"])

    # A profile folder that cannot be written: one line, and the training goes to its end.
    blocker = os.path.join(work, "a-file")
    with open(blocker, "w") as f:
        f.write("x")
    code, out, err = run([trainer, "--data-dir", good, "--out-dir", os.path.join(work, "out")]
                         + TINY + ["--profile-dir", os.path.join(blocker, "profile"),
                                   "--profile-start", "1"])
    said = [l for l in lines(err) if "profile" in l]
    check(code == 0 and "final valid loss" in out and len(said) == 1 and
          "training goes on" in said[0] and not os.path.exists(os.path.join(blocker, "profile")),
          f"an unwritable --profile-dir: one line, the run finishes (exit {code}): {said}")


def main(argv):
    what = argv[0] if argv else ""
    if what == "layout" and len(argv) == 3:
        layout(argv[1], argv[2])
    elif what == "learnable" and len(argv) == 4:
        learnable(argv[1], argv[2], argv[3])
    elif what == "badinput" and len(argv) == 4:
        badinput(argv[1], argv[2], argv[3])
    else:
        sys.stderr.write(__doc__)
        return 2
    if failures:
        print(f"{len(failures)} failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
