#!/usr/bin/env python3
"""The capstone's XSum data path: common/data/xsum_data.py and kit/data/xsum.h (via xsum_read).

  generator  `generate` writes raw/{train,validation,test}.jsonl of {id, document, summary}; the
             same seed gives the same bytes, another seed other text; every summary is the rule's
             function of its document (the names of the first sentence), so it is learnable
  prepare    `prepare` on a generated corpus: xsum.h5 read with h5py (not the kit): the layout
             of common/data/XSUM.md (attributes, dtypes, offsets = cumulative lengths), the ids
             equal to sentencepiece's encoding of the text with DIR/xsum.model, whose SHA-256 is
             the file's attribute and whose pieces are the file's; the tokenizer learnt from the
             training split only; an empty summary skipped, counted and named; the same output
             twice (deterministic)
  reader     xsum_read (the C++ reader): ids equal to the file's, text equal to sentencepiece's
             decode (control and unknown ids included); documents longer than the limit cut to
             it and counted as numpy counts them; each read in the trace (KIT_TRACE_DIR)
  download   without network (every host behind a dead proxy): one line on stderr, exit 1,
             nothing written, also through `./kit data xsum download`; from a local mirror
             (XSUM_URL): both files SHA-256 checked, the archive turned into raw/*.jsonl as the
             `datasets` loader reads it, nothing fetched a second time; a file with another
             SHA-256 refused in one line and removed
  badinput   the reader on a missing file (naming ./kit data xsum), a partial file, offsets that
             do not add up, another format version, another tokenizer (file or vocabulary size),
             an empty summary, an id outside the vocabulary; prepare on a damaged raw line, a raw
             file that is not UTF-8 and a missing raw folder: each one line on stderr, exit 1,
             and no file changed

usage: test_xsum.py PART XSUM_DATA_PY XSUM_READ WORKDIR
"""
import hashlib
import http.server
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading

import h5py
import numpy as np
import sentencepiece as spm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ["--train", "300", "--validation", "40", "--test", "40"]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(cmd, env=None):
    full = dict(os.environ, **(env or {}))
    return subprocess.run(cmd, capture_output=True, text=True, env=full)


def one_line_error(r, what, needle):
    lines = r.stderr.splitlines()
    check(r.returncode == 1 and len(lines) == 1 and needle in r.stderr,
          f"{what}: exit 1 and one line with '{needle}' (exit {r.returncode}: {r.stderr.strip()!r})")


def generate(tool, out, extra=()):
    shutil.rmtree(out, ignore_errors=True)
    r = run([sys.executable, tool, "generate", out] + SMALL + list(extra))
    check(r.returncode == 0, f"generate {out}: {r.stderr.strip()}")
    return out


def prepare(tool, out, extra=()):
    r = run([sys.executable, tool, "prepare", out, "--vocab-size", "400", "--threads", "2"]
            + list(extra))
    check(r.returncode == 0, f"prepare {out}: {r.stderr.strip()}")
    return r


def raw(folder, split):
    with open(os.path.join(folder, "raw", split + ".jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def generator(tool, reader, work):
    spec = importlib.util.spec_from_file_location("xsum_data", tool)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    a = generate(tool, os.path.join(work, "a"))
    b = generate(tool, os.path.join(work, "b"))
    c = generate(tool, os.path.join(work, "c"), ["--seed", "2"])
    for split, count in (("train", 300), ("validation", 40), ("test", 40)):
        examples = raw(a, split)
        check(len(examples) == count and all(set(e) == {"id", "document", "summary"} and
                                             all(isinstance(v, str) for v in e.values())
                                             for e in examples),
              f"{split}: {count} JSON lines of strings id, document, summary")
        check(digest(os.path.join(a, "raw", split + ".jsonl")) ==
              digest(os.path.join(b, "raw", split + ".jsonl")), f"{split}: the same seed, the same file")
        check(raw(c, split)[0]["document"] != examples[0]["document"],
              f"{split}: another seed, other documents")
        rule = [module.generated_summary(e["document"]) == e["summary"] for e in examples]
        check(all(rule), f"{split}: every summary is the names of the document's first sentence "
                         f"({sum(rule)} of {len(rule)})")
        words = [len(e["summary"].split()) for e in examples]
        check(min(words) >= 2 and all(w in e["document"] for e in examples
                                      for w in e["summary"].rstrip(".").split()),
              f"{split}: summaries of 2 or more words, all copied from the document")
    # Not a constant: the summaries differ from example to example.
    check(len({e["summary"] for e in raw(a, "train")}) > 250, "train: the summaries differ")


def prepare_part(tool, reader, work):
    data = generate(tool, os.path.join(work, "p"))
    # A word only the validation split has, and a training example with an empty summary.
    val = raw(data, "validation")
    for e in val:  # letters the generator never writes
        e["document"] += " Qqxyzzyq Qqxyzzyq."
    train = raw(data, "train")
    train.insert(5, {"id": "empty-one", "document": "Some text here.", "summary": "  "})
    for split, rows in (("validation", val), ("train", train)):
        with open(os.path.join(data, "raw", split + ".jsonl"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    r = prepare(tool, data)
    check("train: 300 examples" in r.stdout and "1 skipped" in r.stdout and "empty-one" in r.stdout,
          f"prepare says the empty summary was skipped: {r.stdout.strip()!r}")
    path = os.path.join(data, "xsum.h5")
    sp = spm.SentencePieceProcessor(model_file=os.path.join(data, "xsum.model"))
    with h5py.File(path, "r") as f:
        a = f.attrs
        check(a["format"] == b"kit-xsum" and a["format_version"] == 1, "format kit-xsum, version 1")
        check(a["vocab_size"] == sp.get_piece_size() and (a["pad_id"], a["unk_id"], a["bos_id"],
              a["eos_id"]) == (0, 1, 2, 3), f"vocab_size {a['vocab_size']}, pad 0 unk 1 bos 2 eos 3")
        model = f["tokenizer/model"][...].tobytes()
        check(model == open(os.path.join(data, "xsum.model"), "rb").read() and
              a["tokenizer_sha256"].decode() == hashlib.sha256(model).hexdigest(),
              "tokenizer/model is xsum.model, tokenizer_sha256 its SHA-256")
        offsets, blob = f["tokenizer/piece_offsets"][...], f["tokenizer/pieces"][...].tobytes()
        pieces = [blob[offsets[i]:offsets[i + 1]].decode() for i in range(len(offsets) - 1)]
        check(pieces == [sp.id_to_piece(i) for i in range(sp.get_piece_size())] and
              f["tokenizer/piece_kinds"].dtype == np.uint8 and
              list(f["tokenizer/piece_kinds"][:4]) == [2, 1, 2, 2],
              "tokenizer/pieces are sentencepiece's, kinds: <pad> control, <unk> unknown, <s> </s> control")
        check(not any(c in p for p in pieces for c in "Qqxy"),
              "the tokenizer learnt from train only (no piece of the validation's own word)")
        for split in ("train", "validation", "test"):
            g = f[split]
            rows = [e for e in raw(data, split) if e["summary"].strip()]
            n = len(rows)
            for part in ("document", "summary"):
                tokens, offs, lengths = (g[part + "_tokens"], g[part + "_offsets"],
                                         g[part + "_lengths"])
                check(tokens.dtype == np.int32 and offs.dtype == np.int64 and
                      lengths.dtype == np.int32 and offs.shape == (n + 1,) and lengths.shape == (n,),
                      f"{split}/{part}: int32 tokens, int64 offsets [{n + 1}], int32 lengths [{n}]")
                check(np.array_equal(np.diff(offs[...]), lengths[...]) and offs[-1] == tokens.shape[0],
                      f"{split}/{part}: offsets are the cumulative lengths")
                ids = tokens[...]
                texts = [" ".join(e[part].split()) for e in rows]
                want = sp.encode(texts)
                check(all(np.array_equal(ids[offs[i]:offs[i + 1]], want[i]) for i in range(n)),
                      f"{split}/{part}: the ids are sentencepiece's encoding of the text")
                if split != "validation" or part == "summary":  # (not the unknown word's text)
                    check(sp.decode(want[3]) == texts[3], f"{split}/{part}: they decode to the text")
            check(g.attrs["examples"] == n and [i.decode() for i in g["ids"][...]] ==
                  [e["id"] for e in rows], f"{split}: {n} examples, ids in order")
        check(f["train"].attrs["skipped_empty"] == 1 and
              [i.decode() for i in f["train/skipped_ids"][...]] == ["empty-one"],
              "train: skipped_empty 1, skipped_ids names it")
    before = {n: digest(os.path.join(data, n)) for n in ("xsum.h5", "xsum.model")}
    prepare(tool, data)
    check(before == {n: digest(os.path.join(data, n)) for n in ("xsum.h5", "xsum.model")},
          "prepare twice: the same xsum.h5 and xsum.model, byte for byte")
    check(not [n for n in os.listdir(data) if n.endswith(".part")], "no .part file left")


def reader_part(tool, reader, work):
    data = generate(tool, os.path.join(work, "r"))
    prepare(tool, data)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(data, "xsum.model"))
    with h5py.File(os.path.join(data, "xsum.h5"), "r") as f:
        g = f["validation"]
        tokens, offs = g["document_tokens"][...], g["document_offsets"][...]
        lengths = g["document_lengths"][...]
        stoks, soffs = g["summary_tokens"][...], g["summary_offsets"][...]
    limit = int(np.median(lengths))
    r = run([reader, data, "validation", "--max-document-len", str(limit)])
    check(r.returncode == 0, f"xsum_read validation: {r.stderr.strip()}")
    lines = r.stdout.splitlines()
    cut = int((lengths > limit).sum())
    check(lines[0] == f"xsum validation: 40 examples, {cut} documents truncated to {limit} "
                      "tokens, 0 summaries truncated to 64 tokens", f"report: {lines[0]!r}")
    check(0 < cut < 40, f"the limit cuts some documents, not all ({cut})")
    rows = [line.split("\t") for line in lines[1:]]
    check(len(rows) == 40, "one line per example")
    same_ids = same_text = True
    for i, (_, doc, summ, doc_text, summ_text) in enumerate(rows):
        full = tokens[offs[i]:offs[i + 1]]
        want = full[:limit]
        same_ids &= [int(t) for t in doc.split()] == list(want)
        same_ids &= [int(t) for t in summ.split()] == list(stoks[soffs[i]:soffs[i + 1]])
        same_text &= doc_text == sp.decode(want.tolist())
        same_text &= summ_text == sp.decode(stoks[soffs[i]:soffs[i + 1]].tolist())
    check(same_ids, "the reader's ids are the file's, documents cut to the first max tokens")
    check(same_text, "the reader's text is sentencepiece's decode_ids")
    # Control and unknown ids: <s> <unk> pieces </s>, as sentencepiece decodes them.
    copy = os.path.join(work, "special")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(data, copy)
    with h5py.File(os.path.join(copy, "xsum.h5"), "r+") as f:
        t = f["validation/summary_tokens"]
        o = f["validation/summary_offsets"][...]
        i = int(np.argmax(np.diff(o) >= 4))
        ids = t[o[i]:o[i + 1]]
        ids[0], ids[1], ids[-1] = 2, 1, 3
        t[o[i]:o[i + 1]] = ids
    r = run([reader, copy, "validation"])
    got = r.stdout.splitlines()[1 + i].split("\t")[4]
    check(got == sp.decode(ids.tolist()) and "\u2047" in got,
          f"<s>, <unk> and </s> decode as sentencepiece's: {got!r} vs {sp.decode(ids.tolist())!r}")
    # Every read is told to the checker's seam: one "sample" line per example of the trace.
    trace = os.path.join(work, "trace")
    shutil.rmtree(trace, ignore_errors=True)
    os.makedirs(trace)
    run([reader, data, "test", "--decode", "5"], {"KIT_TRACE_DIR": trace})
    lines = [line for name in os.listdir(trace) for line in open(os.path.join(trace, name))]
    check([line.split()[:3] for line in lines if line.startswith("sample ")] ==
          [["sample", "test", f"index={i}"] for i in range(5)], "the trace has a sample line per read")
    r = run([reader, data, "train", "--max-document-len", "0", "--vocab-size", "0", "--decode", "2"])
    check(r.returncode == 0 and "0 documents truncated to no limit" in r.stdout and
          len(r.stdout.splitlines()) == 3, f"no limit, the first 2 examples: {r.stdout[:80]!r}")


class Mirror(http.server.SimpleHTTPRequestHandler):
    requests = []

    def log_message(self, *args):
        Mirror.requests.append(self.path)


def fake_xsum(folder):
    """A small archive in XSum's [SN] format and its split file; returns their SHA-256."""
    os.makedirs(folder, exist_ok=True)
    splits = {"train": ["101", "102", "103"], "validation": ["201"], "test": ["301"]}
    with tarfile.open(os.path.join(folder, "XSUM-EMNLP18-Summary-Data-Original.tar.gz"), "w:gz") as tar:
        for ident in [i for ids in splits.values() for i in ids] + ["999"]:  # 999: in no split
            text = (f"[SN]URL[SN]\nhttp://www.bbc.co.uk/news/{ident}\n\n[SN]TITLE[SN]\nTitle {ident}\n\n"
                    f"[SN]FIRST-SENTENCE[SN]\nSummary of {ident}.\n\n[SN]RESTBODY[SN]\n"
                    f"First line of {ident}.\nShare this with\nEmail\n\nSecond line.\n").encode()
            info = tarfile.TarInfo(f"bbc-summary-data/{ident}.summary")
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
    with open(os.path.join(folder, "XSum-TRAINING-DEV-TEST-SPLIT-90-5-5.json"), "w") as f:
        json.dump(splits, f)
    return [digest(os.path.join(folder, n)) for n in
            ("XSUM-EMNLP18-Summary-Data-Original.tar.gz", "XSum-TRAINING-DEV-TEST-SPLIT-90-5-5.json")]


def download(tool, reader, work):
    dead = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused
    offline = {k: dead for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")}
    offline.update(no_proxy="", NO_PROXY="", XSUM_URL="")
    out = os.path.join(work, "offline")
    shutil.rmtree(work, ignore_errors=True)
    r = run([sys.executable, tool, "download", out], offline)
    one_line_error(r, "offline download", "cannot reach the network")
    check(r.stdout == "" and "login node" in r.stderr and "huggingface.co" in r.stderr,
          f"offline: nothing on stdout, the line names the login node and the host")
    check(not os.path.exists(os.path.join(out, "raw")) and
          not os.listdir(os.path.join(out, "download")), "offline: nothing written")
    r = run([os.path.join(ROOT, "kit"), "data", "xsum", "download", out], offline)
    one_line_error(r, "./kit data xsum download offline", "cannot reach the network")

    served = os.path.join(work, "mirror")
    sums = fake_xsum(served)
    handler = lambda *a, **k: Mirror(*a, directory=served, **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    mirror = dict(offline, XSUM_URL=f"http://127.0.0.1:{server.server_address[1]}/",
                  no_proxy="127.0.0.1", NO_PROXY="127.0.0.1", XSUM_SHA256=" ".join(sums))
    out = os.path.join(work, "mirrored")
    r = run([sys.executable, tool, "download", out], mirror)
    check(r.returncode == 0, f"download from the mirror: {r.stderr.strip()}")
    check(all(os.path.isfile(os.path.join(out, "download", n)) for n in
              ("XSUM-EMNLP18-Summary-Data-Original.tar.gz", "XSum-TRAINING-DEV-TEST-SPLIT-90-5-5.json")),
          "download/ holds both files")
    counts = {s: len(raw(out, s)) for s in ("train", "validation", "test")}
    check(counts == {"train": 3, "validation": 1, "test": 1}, f"raw/: the split file's ids {counts}")
    e = raw(out, "train")[0]
    check(e == {"id": "101", "document": "First line of 101.\nSecond line.",
                "summary": "Summary of 101."},
          f"the first sentence is the summary, the body the document, without 'Share this with': {e}")
    asked = len(Mirror.requests)
    r = run([sys.executable, tool, "download", out], mirror)
    check(r.returncode == 0 and len(Mirror.requests) == asked, "again: nothing fetched twice")
    bad = dict(mirror, XSUM_SHA256="0" * 64 + " " + sums[1])
    out = os.path.join(work, "damaged")
    r = run([sys.executable, tool, "download", out], bad)
    one_line_error(r, "an archive of another SHA-256", "SHA-256")
    check(not os.path.exists(os.path.join(out, "download", "XSUM-EMNLP18-Summary-Data-Original.tar.gz"))
          and not [n for n in os.listdir(os.path.join(out, "download")) if n.endswith(".part")]
          and not os.path.exists(os.path.join(out, "raw")), "the bad archive removed, no raw/")
    server.shutdown()


def badinput(tool, reader, work):
    data = generate(tool, os.path.join(work, "good"))
    prepare(tool, data)

    def damaged(name, change):
        copy = os.path.join(work, name)
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(data, copy)
        change(os.path.join(copy, "xsum.h5"))
        return copy

    def refused(what, folder, needle, extra=()):
        files = {n: digest(os.path.join(folder, n)) for n in os.listdir(folder)
                 if os.path.isfile(os.path.join(folder, n))}
        r = run([reader, folder, "validation"] + list(extra))
        one_line_error(r, what, needle)
        check(files == {n: digest(os.path.join(folder, n)) for n in files},
              f"{what}: no file changed")

    empty = os.path.join(work, "empty")
    os.makedirs(empty, exist_ok=True)
    refused("no xsum.h5", empty, "./kit data xsum")
    # A data folder that does not exist at all: the hint names that folder, not its parent.
    nowhere = os.path.join(work, "not-prepared")
    r = run([reader, nowhere, "validation"])
    one_line_error(r, "a data folder that does not exist", f"./kit data xsum {nowhere} ")

    def truncate(path):
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(size // 2)
    refused("a partial copy", damaged("partial", truncate), "cannot open")

    def offsets(path):
        with h5py.File(path, "r+") as f:
            o = f["validation/document_offsets"]
            o[-1] = o[-1] + 7
    refused("offsets that do not add up", damaged("offsets", offsets), "partial or damaged")

    def version(path):
        with h5py.File(path, "r+") as f:
            f.attrs["format_version"] = np.int64(2)
    refused("format version 2", damaged("version", version), "format version 2")

    other = generate(tool, os.path.join(work, "other"), ["--seed", "9"])
    prepare(tool, other, ["--vocab-size", "300"])
    mismatch = damaged("mismatch", lambda p: None)
    shutil.copy(os.path.join(other, "xsum.model"), os.path.join(mismatch, "xsum.model"))
    refused("another tokenizer beside the file", mismatch, "another tokenizer")
    refused("another tokenizer named", data, "another tokenizer",
            ["--tokenizer", os.path.join(other, "xsum.model")])
    with h5py.File(os.path.join(data, "xsum.h5"), "r") as f:
        vocab = int(f.attrs["vocab_size"])
    refused("a model of another vocabulary size", data, f"tokenizer of {vocab} pieces",
            ["--vocab-size", str(vocab + 1)])

    def empty_summary(path):
        with h5py.File(path, "r+") as f:
            g = f["validation"]
            t, o = g["summary_tokens"][...], g["summary_offsets"][...]
            lengths = np.diff(o).astype(np.int32)
            keep = np.ones(len(t), bool)
            keep[o[3]:o[4]] = False
            lengths[3] = 0
            for name, value in (("summary_tokens", t[keep]), ("summary_lengths", lengths),
                                ("summary_offsets", np.concatenate([[0], np.cumsum(lengths)]))):
                del g[name]
                g[name] = value.astype(np.int64 if name.endswith("offsets") else np.int32)
    refused("an empty summary", damaged("empty-summary", empty_summary),
            "example 3 has an empty summary")

    def outside(path):
        with h5py.File(path, "r+") as f:
            f["validation/summary_tokens"][0] = f.attrs["vocab_size"]
    refused("an id outside the vocabulary", damaged("outside", outside), "outside the tokenizer")

    # prepare: a damaged raw line, then no raw folder; the prepared file stays as it was.
    before = digest(os.path.join(data, "xsum.h5"))
    with open(os.path.join(data, "raw", "test.jsonl"), "a") as f:
        f.write('{"id": "x", "document": 3}\n')
    r = run([sys.executable, tool, "prepare", data, "--vocab-size", "400"])
    one_line_error(r, "prepare on a damaged raw line", "test.jsonl:41: not a JSON object")
    check(digest(os.path.join(data, "xsum.h5")) == before, "prepare refused: xsum.h5 unchanged")
    with open(os.path.join(data, "raw", "test.jsonl"), "rb") as f:
        good = b"".join(f.readlines()[:40])
    with open(os.path.join(data, "raw", "test.jsonl"), "wb") as f:  # line 41 in Latin-1
        f.write(good + b'{"id": "y", "document": "caf\xe9", "summary": "s"}\n')
    r = run([sys.executable, tool, "prepare", data, "--vocab-size", "400"])
    one_line_error(r, "prepare on a raw file that is not UTF-8", "test.jsonl:41: not UTF-8")
    check(digest(os.path.join(data, "xsum.h5")) == before and
          not [n for n in os.listdir(data) if n.endswith(".part")], "xsum.h5 unchanged, no .part")
    r = run([sys.executable, tool, "prepare", empty])
    one_line_error(r, "prepare without raw/", "./kit data xsum download")


def main():
    part, tool, reader, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    {"generator": generator, "prepare": prepare_part, "reader": reader_part,
     "download": download, "badinput": badinput}[part](tool, reader, work)
    print(f"{len(failures)} failed" if failures else "all passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
