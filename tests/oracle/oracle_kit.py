#!/usr/bin/env python3
"""oracle_kit.py -- the kit's data order, augmentation and AdamW against references that are not
the kit (label oracle; kit_oracle_probe writes what the kit computes).

    oracle_kit.py --probe build/bin/kit_oracle_probe --work DIR (sampler|augment|adamw)

sampler  DistributedSampler / DistributedEvalSampler, every (size, seed, epoch, replicas, rank)
         of a grid. The kit shuffles with its own algorithm (kit/data/data_loader.h: Fisher-Yates driven
         by std::mt19937_64(seed + epoch), the same on every compiler), not torch.randperm, so the
         permutation is re-computed here from that description (mt19937_64 written out in
         Python, checked against the value the C++ standard requires of it); the padding and the
         cut into ranks are torch.utils.data.DistributedSampler's own, applied to it. Without
         shuffle, torch's sampler directly. Exact.
augment  Cifar10Dataset's crop and flip per (seed, epoch, index), re-computed from kit/data/cifar10.h's
         description (splitmix64, pad by 4 with zeros after normalising, crop, flip) with torch
         ops. Exact: the same float32 operations.
adamw    ShardedAdamW on 3 shards and ZeroOptimizer stages 1 and 2 on 2 ranks against
         torch.optim.AdamW on the averaged gradients. Not exact: torch.optim.AdamW updates its
         first moment with lerp_, torch::optim::AdamW (which the kit follows operation for
         operation, and matches bit for bit: unit.ShardedAdamW.*) with mul_ and add_. Measured
         (2026-11-26, torch 2.13, CPU): 1.6e-8 at most, relative to the weights' norm; allowed
         1e-6. A planted bug is far above it: the ranks' gradients summed instead of averaged
         differ by 0.7-2.5% (eps 0.5 makes the gradient's scale count), the weight decay applied
         after the update by 1.8e-4 to 8.5e-4 over the 5 steps (both computed with torch). The kit's three forms must agree bit for bit.
Exit 0 when everything agrees; otherwise the first differences, and exit 1.
"""
import argparse
import os
import subprocess
import sys

import torch

MASK = (1 << 64) - 1


class MT19937_64:
    """std::mt19937_64, from the parameters the C++ standard gives ([rand.predef])."""
    N, M = 312, 156

    def __init__(self, seed):
        self.mt = [seed & MASK]
        for i in range(1, self.N):
            prev = self.mt[-1]
            self.mt.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & MASK)
        self.index = self.N

    def __call__(self):
        if self.index >= self.N:
            mt = self.mt
            for i in range(self.N):
                x = (mt[i] & 0xFFFFFFFF80000000) | (mt[(i + 1) % self.N] & 0x7FFFFFFF)
                mt[i] = mt[(i + self.M) % self.N] ^ (x >> 1) ^ (0xB5026F5AA96619E9 if x & 1 else 0)
            self.index = 0
        y = self.mt[self.index]
        self.index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & MASK


def kit_permutation(n, seed, epoch):
    """Fisher-Yates from the last position down: j = engine() mod (i + 1), swap i and j."""
    order = list(range(n))
    engine = MT19937_64(seed + epoch)
    for i in range(n, 1, -1):
        j = engine() % i
        order[i - 1], order[j] = order[j], order[i - 1]
    return order


def torch_positions(n, replicas, rank):
    """torch's DistributedSampler without shuffle: padded by repeating the start, then strided."""
    from torch.utils.data import DistributedSampler
    return list(DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=False))


def check_sampler(probe):
    engine = MT19937_64(5489)  # the default seed; the standard fixes the 10000th value
    for _ in range(9999):
        engine()
    if engine() != 9981545732273789042:
        return ["the Python mt19937_64 is not the standard's: the reference is wrong"]
    cases = []
    for n in (1, 7, 10, 64, 101):
        for replicas in (1, 2, 3, 4, 8):
            for rank in range(replicas):
                for seed in (0, 42):
                    for epoch in (0, 1, 5):
                        cases.append((n, seed, epoch, replicas, rank, 0))
                cases.append((n, -1, 0, replicas, rank, 0))
                cases.append((n, 0, 0, replicas, rank, 1))
    out = subprocess.run([probe, "sampler"], input="".join(" ".join(map(str, c)) + "\n" for c in cases),
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        return [f"kit_oracle_probe sampler failed: {out.stderr.strip()}"]
    lines = out.stdout.split("\n")
    bad = []
    for (n, seed, epoch, replicas, rank, ev), line in zip(cases, lines):
        got = [int(x) for x in line.split()]
        if ev:
            want = list(range(n))[rank::replicas]  # every sample once, no padding
        elif seed < 0:
            want = torch_positions(n, replicas, rank)
        else:
            perm = kit_permutation(n, seed, epoch)
            want = [perm[p] for p in torch_positions(n, replicas, rank)]
        if got != want:
            kind = "eval" if ev else "in order" if seed < 0 else f"seed {seed} epoch {epoch}"
            bad.append(f"sampler size {n}, {kind}, rank {rank} of {replicas}: kit {got[:12]}, "
                       f"reference {want[:12]}")
    print(f"sampler: {len(cases)} cases, {len(cases) - len(bad)} equal to the reference")
    return bad


MEAN = torch.tensor([0.4914, 0.4822, 0.4465], dtype=torch.float32).view(3, 1, 1)
STD = torch.tensor([0.2470, 0.2435, 0.2616], dtype=torch.float32).view(3, 1, 1)


def splitmix64(z):
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def augmented(image, seed, epoch, index):
    r = splitmix64(splitmix64(splitmix64(seed) ^ epoch) ^ index)
    dy, dx, flip = r % 9 - 4, (r // 9) % 9 - 4, (r >> 32) & 1
    x = (image.to(torch.float32) / 255.0 - MEAN) / STD
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))  # zero after normalising: the mean colour
    crop = padded[:, 4 + dy:36 + dy, 4 + dx:36 + dx]
    return crop.flip(2) if flip else crop


def check_augment(probe, work):
    n, epochs = 40, 3
    bad = []
    for seed in (0, 9):
        path = os.path.join(work, f"augment-{seed}.bin")
        out = subprocess.run([probe, "augment", str(n), str(seed), str(epochs), path],
                             capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            return [f"kit_oracle_probe augment failed: {out.stderr.strip()}"]
        got = torch.from_file(path, size=epochs * n * 3 * 32 * 32, dtype=torch.float32)
        got = got.view(epochs, n, 3, 32, 32)
        i = torch.arange(n).view(n, 1, 1, 1)
        c, y, x = torch.arange(3).view(1, 3, 1, 1), torch.arange(32).view(1, 1, 32, 1), torch.arange(32).view(1, 1, 1, 32)
        images = ((37 * i + 101 * c + 7 * y + 3 * x) % 256).to(torch.uint8)
        for e in range(epochs):
            for k in range(n):
                if not torch.equal(got[e, k], augmented(images[k], seed, e, k)):
                    bad.append(f"augment seed {seed} epoch {e} image {k}: not the reference's crop and flip")
    print(f"augment: {2 * epochs * n} images, {2 * epochs * n - len(bad)} equal to the reference")
    return bad


def check_adamw(probe, work, tolerance):
    out = subprocess.run([probe, "adamw", work], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        return [f"kit_oracle_probe adamw failed: {out.stderr.strip()}"]
    shapes, steps = [(3, 4), (7,), (4,)], 5
    numel = sum(torch.Size(s).numel() for s in shapes)

    def load(name, count):
        return torch.from_file(os.path.join(work, name), size=count * numel, dtype=torch.float32).view(count, numel)

    init, grads = load("init.bin", 1)[0], load("grads.bin", steps)
    params, at = [], 0
    for s in shapes:
        k = torch.Size(s).numel()
        params.append(init[at:at + k].view(s).clone().requires_grad_(True))
        at += k
    adamw = torch.optim.AdamW(params, lr=0.05, betas=(0.8, 0.95), eps=0.5, weight_decay=0.3)
    reference = []
    for step in range(steps):
        at = 0
        for p in params:
            p.grad = grads[step, at:at + p.numel()].view(p.shape).clone()
            at += p.numel()
        adamw.step()
        reference.append(torch.cat([p.detach().reshape(-1) for p in params]))
    bad, worst = [], 0.0
    runs = {name: load(f"{name}.bin", steps) for name in ("sharded", "zero1", "zero2")}
    for name, run in runs.items():
        for step in range(steps):
            diff = ((run[step] - reference[step]).norm() / reference[step].norm()).item()
            worst = max(worst, diff)
            if diff > tolerance:
                bad.append(f"adamw {name} step {step + 1}: {diff:.3g} relative to torch.optim.AdamW "
                           f"(allowed {tolerance:g})")
            if name != "sharded" and not torch.equal(run[step], runs["sharded"][step]):
                bad.append(f"adamw {name} step {step + 1}: not bit for bit ShardedAdamW's weights")
    print(f"adamw: ShardedAdamW, ZeRO-1 and ZeRO-2 against torch.optim.AdamW over {steps} steps: "
          f"{worst:.3g} relative at most (allowed {tolerance:g})")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--probe", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--tolerance", type=float, default=1e-6, help="adamw: relative, per step")
    ap.add_argument("what", choices=["sampler", "augment", "adamw"])
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    if args.what == "sampler":
        bad = check_sampler(args.probe)
    elif args.what == "augment":
        bad = check_augment(args.probe, args.work)
    else:
        bad = check_adamw(args.probe, args.work, args.tolerance)
    for line in bad[:10]:
        print("DIFFERS: " + line)
    if len(bad) > 10:
        print(f"... and {len(bad) - 10} more")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
