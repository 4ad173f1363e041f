#!/usr/bin/env python3
"""Padding of the capstone's training batches: kit::length_buckets against random batches.

Reads DIR/xsum.h5 (the prepared file) with h5py and forms the batches as
kit/seq2seq/batches.cpp does (torch's CPU generator seeded with seed + epoch: randperm of the
examples, stable sort by document length, cut, randperm of the batches), and random batches as a
shuffled sampler does (randperm, cut). Padding as kit::padding_of counts it: per batch,
longest * rows - sum of lengths.

usage: padding.py XSUM_H5 [--batch-size 16 ...] [--epochs 10] [--seed 42]
"""
import argparse

import h5py
import numpy as np
import torch


def length_buckets(lengths, batch_size, seed):
    g = torch.Generator().manual_seed(seed)
    n = len(lengths)
    perm = torch.randperm(n, generator=g).tolist()
    order = sorted(perm, key=lambda i: lengths[i])  # Python's sort is stable
    batches = [order[i:i + batch_size] for i in range(0, n, batch_size)]
    shuffle = torch.randperm(len(batches), generator=g).tolist()
    return [batches[i] for i in shuffle]


def random_batches(n, batch_size, seed):
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g).tolist()
    return [perm[i:i + batch_size] for i in range(0, n, batch_size)]


def padding_of(batches, lengths):
    return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in batches)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("h5")
    ap.add_argument("--batch-size", type=int, nargs="+", default=[16])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args()
    with h5py.File(a.h5, "r") as f:
        doc = f["train/document_lengths"][:].astype(np.int64).tolist()
        summ = f["train/summary_lengths"][:].astype(np.int64).tolist()
    tgt = [s + 1 for s in summ]  # <s> + summary, summary + </s>
    n = len(doc)
    print(f"train: {n} examples, document tokens {sum(doc)} (mean {sum(doc)/n:.1f}, "
          f"min {min(doc)}, max {max(doc)}), summary tokens mean {sum(summ)/n:.1f}, max {max(summ)}")
    print("batch  batches      documents: padded positions per epoch (share of the padded tensor)"
          "                 summaries (+1), same batches")
    for bs in a.batch_size:
        row = {"buckets": [0, 0], "random": [0, 0]}
        for e in range(a.epochs):
            s = a.seed + e
            for name, batches in (("buckets", length_buckets(doc, bs, s)),
                                  ("random", random_batches(n, bs, s))):
                row[name][0] += padding_of(batches, doc)
                row[name][1] += padding_of(batches, tgt)
        nb = (n + bs - 1) // bs
        out = []
        for name in ("random", "buckets"):
            pd, pt = (x / a.epochs for x in row[name])
            out.append(f"{name} {pd:9.1f} ({pd / (pd + sum(doc)):6.2%}) | {pt:8.1f} ({pt / (pt + sum(tgt)):6.2%})")
        saved = 1 - row["buckets"][0] / row["random"][0]
        print(f"{bs:5d} {nb:8d}   " + "   ".join(out) + f"   documents' padding {saved:.1%} less")


if __name__ == "__main__":
    main()
