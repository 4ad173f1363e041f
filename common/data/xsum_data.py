#!/usr/bin/env python3
"""XSum for the capstone (the news summariser): download, generate, prepare. `./kit data xsum`
runs it; the layout of every file is on common/data/XSUM.md.

  xsum_data.py download DIR   login node: the original XSum files, SHA-256 checked, into
                              DIR/download/, then DIR/raw/{train,validation,test}.jsonl
  xsum_data.py generate DIR   a small invented corpus in the same raw format, whose summary is a
                              function of its document (offline; deterministic by --seed)
  xsum_data.py prepare DIR    a SentencePiece tokenizer trained on DIR/raw/train.jsonl
                              (DIR/xsum.model), every split tokenised, one HDF5 file DIR/xsum.h5

download needs only Python's standard library; prepare needs the packages pinned in
requirements.txt: sentencepiece, h5py, numpy. Compute nodes have no internet: both steps run on
the login node, and the job reads DIR/xsum.h5 alone. Errors are one line on stderr and exit 1.
"""
import argparse
import hashlib
import io
import json
import os
import random
import sys
import tarfile
import urllib.error
import urllib.request

FORMAT_VERSION = 1
SPLITS = ("train", "validation", "test")
PROG = "xsum_data.py"

# The original XSum (Narayan et al., 2018): the BBC articles in one archive and the split file.
# SHA-256 and sizes: the download_checksums the Hugging Face `datasets` library recorded for these
# two files (datasets/xsum/dataset_infos.json, version 1.2.0 of its XSum loader). The archive is
# fetched from the Hugging Face hub's copy (dataset EdinburghNLP/xsum, data/), else from the
# authors' host; XSUM_URL (a folder holding both files, e.g. a site's mirror) is tried first.
ARCHIVE = "XSUM-EMNLP18-Summary-Data-Original.tar.gz"
SPLIT_FILE = "XSum-TRAINING-DEV-TEST-SPLIT-90-5-5.json"
SOURCES = {
    ARCHIVE: ["https://huggingface.co/datasets/EdinburghNLP/xsum/resolve/main/data/" + ARCHIVE,
              "http://bollin.inf.ed.ac.uk/public/direct/" + ARCHIVE],
    SPLIT_FILE: ["https://raw.githubusercontent.com/EdinburghNLP/XSum/master/XSum-Dataset/" +
                 SPLIT_FILE],
}
SHA256 = {ARCHIVE: "10b48aa187fc9c904b30f76ca97e2da0de8d3a1238acc26acadef93e2001af90",
          SPLIT_FILE: "9c0c5d8f048a90bd68b19a34e4c30577ed270d3247b2119fa06a04ef46292068"}
# Lines of the BBC pages that are not article text, dropped as the `datasets` loader drops them.
REMOVE_LINES = {"Share this with", "Email", "Facebook", "Messenger", "Twitter", "Pinterest",
                "WhatsApp", "Linkedin", "LinkedIn", "Copy this link",
                "These are external links and will open in a new window"}


class Refused(Exception):
    """A problem of the data or the network: its message is the one line the user sees."""


# --- download -----------------------------------------------------------------------------------
def sources(name):
    mirror = os.environ.get("XSUM_URL", "").rstrip("/")
    return ([mirror + "/" + name] if mirror else []) + SOURCES[name]


def expected_sha256(name):
    # XSUM_SHA256="ARCHIVE SPLIT": other checksums, for a mirror of other files (and the tests).
    other = os.environ.get("XSUM_SHA256", "").split()
    if other:
        if len(other) != 2:
            raise Refused("XSUM_SHA256 must be two SHA-256 sums: the archive's and the split file's")
        return other[0] if name == ARCHIVE else other[1]
    return SHA256[name]


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(name, folder):
    """DIR/download/NAME, verified; from the first source that gives the right file."""
    path = os.path.join(folder, name)
    want = expected_sha256(name)
    if os.path.isfile(path) and sha256_of(path) == want:
        return path, None
    unreachable, problems = [], []
    for url in sources(name):
        part = path + ".part"
        started = False
        try:
            with urllib.request.urlopen(url, timeout=30) as response, open(part, "wb") as out:
                started = True
                print(f"{PROG}: downloading {url}", flush=True)
                h = hashlib.sha256()
                for block in iter(lambda: response.read(1 << 20), b""):
                    h.update(block)
                    out.write(block)
        except (urllib.error.HTTPError, OSError) as e:
            if os.path.exists(part):
                os.remove(part)
            if isinstance(e, urllib.error.HTTPError):
                problems.append(f"{url}: HTTP {e.code}")
            elif started:  # the host answered, then the transfer broke off
                problems.append(f"{url}: the download broke off ({e})")
            else:  # no route, no name, refused, timed out, a proxy that does not answer
                reason = getattr(e, "reason", e)
                unreachable.append(f"{url.split('/')[2]} ({reason})")
            continue
        if h.hexdigest() != want:
            os.remove(part)
            problems.append(f"{url} gave a file of SHA-256 {h.hexdigest()[:16]}..., expected "
                            f"{want[:16]}... (damaged, or another file; removed)")
            continue
        os.replace(part, path)
        return path, None
    return None, (unreachable, problems)


def download(args):
    folder = os.path.join(args.dir, "download")
    os.makedirs(folder, exist_ok=True)
    got = {}
    for name in (ARCHIVE, SPLIT_FILE):
        path, failed = fetch(name, folder)
        if path is None:
            unreachable, problems = failed
            if not problems:  # not one host answered: the one-line offline message
                raise Refused(
                    "cannot reach the network (" + "; ".join(unreachable) + "): run this on the "
                    "login node, which has internet (compute nodes have none), or set XSUM_URL to "
                    "a mirror holding " + ARCHIVE + " and " + SPLIT_FILE)
            raise Refused(f"no good {name}: " + "; ".join(problems + unreachable))
        got[name] = path
    print(f"{PROG}: {folder} holds the verified {ARCHIVE} and {SPLIT_FILE}", flush=True)
    convert(got[ARCHIVE], got[SPLIT_FILE], os.path.join(args.dir, "raw"))


def parse_summary_file(text):
    """(document, summary) of one bbc-summary-data/<id>.summary file: its FIRST-SENTENCE is the
    summary, its RESTBODY the document (the `datasets` loader's reading of the format)."""
    lines = [ln for ln in text.splitlines() if ln.strip() and ln.strip() not in REMOVE_LINES]
    parts = "\n".join(lines).split("[SN]")
    # ['', 'URL', url, 'TITLE', title, 'FIRST-SENTENCE', summary, 'RESTBODY', body]
    if len(parts) < 9 or parts[5] != "FIRST-SENTENCE" or parts[7] != "RESTBODY":
        return None
    return parts[8].strip(), parts[6].strip()


def convert(archive, split_file, raw):
    with open(split_file, encoding="utf-8") as f:
        split_ids = json.load(f)
    if not isinstance(split_ids, dict) or any(s not in split_ids for s in SPLITS):
        raise Refused(f"{split_file} has no lists {', '.join(SPLITS)}")
    split_of = {str(i): s for s in SPLITS for i in split_ids[s]}
    os.makedirs(raw, exist_ok=True)
    tmp = {s: os.path.join(raw, f".{s}.jsonl.part") for s in SPLITS}
    outs = {s: open(tmp[s], "w", encoding="utf-8") for s in SPLITS}
    counts = dict.fromkeys(SPLITS, 0)
    seen = set()
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                base = os.path.basename(member.name)
                if not member.isfile() or not base.endswith(".summary"):
                    continue
                ident = base[: -len(".summary")]
                split = split_of.get(ident)
                if split is None:
                    continue
                parsed = parse_summary_file(tar.extractfile(member).read().decode("utf-8"))
                if parsed is None:
                    raise Refused(f"{archive}: {member.name} is not in XSum's [SN] format")
                document, summary = parsed
                outs[split].write(json.dumps({"id": ident, "document": document,
                                              "summary": summary}, ensure_ascii=False) + "\n")
                counts[split] += 1
                seen.add(ident)
    except (tarfile.TarError, EOFError, OSError, UnicodeDecodeError) as e:
        raise Refused(f"cannot read {archive}: {e} (remove it and download again)")
    finally:
        for f in outs.values():
            f.close()
    missing = [i for i in split_of if i not in seen]
    if missing:
        for p in tmp.values():
            os.remove(p)
        raise Refused(f"{archive} lacks {len(missing)} articles of {split_file} (e.g. {missing[0]})")
    for s in SPLITS:
        os.replace(tmp[s], os.path.join(raw, s + ".jsonl"))
    print(f"{PROG}: {raw} holds " + ", ".join(f"{s} {counts[s]}" for s in SPLITS) + " examples",
          flush=True)


# --- generate -----------------------------------------------------------------------------------
def invented_words(rng, count, capital):
    syllables = ["ka", "lo", "mi", "ne", "ru", "ta", "vo", "shi", "den", "bar", "tor", "lin",
                 "pe", "gu", "sa", "fi", "zo", "mar", "kel", "wen"]
    words = set()
    while len(words) < count:
        w = "".join(rng.choice(syllables) for _ in range(rng.randint(2, 3)))
        words.add(w.capitalize() if capital else w)
    return sorted(words)


def generate_split(rng, commons, names, count):
    """Documents of 3-6 sentences of lower-case words with capitalised names anywhere; the
    summary: the names of the first sentence, in order, and a full stop. A model learns it by
    copying, which attention does within a short CPU run."""
    examples = []
    for _ in range(count):
        sentences = []
        for k in range(rng.randint(3, 6)):
            words = [rng.choice(commons) for _ in range(rng.randint(6, 12))]
            for _ in range(rng.randint(2, 3) if k == 0 else rng.randint(0, 2)):
                words.insert(rng.randrange(1, len(words) + 1), rng.choice(names))
            sentences.append(words)
        document = "\n".join(s[0].capitalize() + " " + " ".join(s[1:]) + "." for s in sentences)
        summary = " ".join(w for w in sentences[0] if w[0].isupper()) + "."
        examples.append((document, summary))
    return examples


def generated_summary(document):
    """The generator's rule, for the tests: the names (capitalised words, not the first word of
    the sentence) of the document's first line, in order, and a full stop."""
    first = document.split("\n")[0].rstrip(".").split(" ")
    return " ".join([w for w in first[1:] if w[0].isupper()]) + "."


def generate(args):
    rng = random.Random(args.seed)
    commons = invented_words(rng, 300, capital=False)
    names = invented_words(rng, 60, capital=True)
    raw = os.path.join(args.dir, "raw")
    os.makedirs(raw, exist_ok=True)
    for split, count in (("train", args.train), ("validation", args.validation),
                         ("test", args.test)):
        with open(os.path.join(raw, split + ".jsonl"), "w", encoding="utf-8") as f:
            for n, (document, summary) in enumerate(generate_split(rng, commons, names, count)):
                f.write(json.dumps({"id": f"{split}-{n}", "document": document,
                                    "summary": summary}) + "\n")
    print(f"{PROG}: {raw} holds a generated corpus (seed {args.seed}): train {args.train}, "
          f"validation {args.validation}, test {args.test} examples", flush=True)


# --- prepare ------------------------------------------------------------------------------------
def read_raw(path, command):
    if not os.path.isfile(path):
        raise Refused(f"no {path}: run {command} first (the raw format: common/data/XSUM.md)")
    ids, documents, summaries, skipped = [], [], [], []
    with open(path, "rb") as f:  # bytes, decoded line by line: an error names its line
        for n, line in enumerate(f, 1):
            try:
                e = json.loads(line.decode("utf-8"))
                ident, document, summary = str(e["id"]), e["document"], e["summary"]
                if not isinstance(document, str) or not isinstance(summary, str):
                    raise TypeError
            except UnicodeDecodeError:
                raise Refused(f"{path}:{n}: not UTF-8 text (a damaged file)") from None
            except (ValueError, KeyError, TypeError):
                raise Refused(f"{path}:{n}: not a JSON object with strings id, document, summary "
                              "(a damaged file: download or generate it again)") from None
            # Text on one line: the tokenizer sees the document's lines as one text.
            document, summary = " ".join(document.split()), " ".join(summary.split())
            if not document or not summary:
                skipped.append(ident)  # counted and named in the HDF5 file, not trained on
                continue
            ids.append(ident)
            documents.append(document)
            summaries.append(summary)
    if not ids:
        raise Refused(f"{path} holds no example with a document and a summary")
    return ids, documents, summaries, skipped


def encode(sp, texts, threads, np, chunk=10000):
    """All texts' ids, one after the other (int32), and each text's length (int32). In chunks:
    XSum's 90 million training ids as Python ints would take gigabytes, as int32 360 MB."""
    tokens, lengths = [], []
    for start in range(0, len(texts), chunk):
        encoded = sp.encode(texts[start:start + chunk], num_threads=threads)
        lengths.append(np.array([len(e) for e in encoded], dtype=np.int32))
        tokens.append(np.fromiter((t for e in encoded for t in e), dtype=np.int32,
                                  count=int(lengths[-1].sum())))
    return np.concatenate(tokens), np.concatenate(lengths)


def prepare(args):
    try:
        import h5py
        import numpy as np
        import sentencepiece as spm
    except ImportError as e:
        raise Refused(f"{e.name} is missing from {sys.executable}: pip install the sentencepiece, "
                      "h5py and numpy pinned in requirements.txt (./kit data xsum prepare finds "
                      "them in .venv too)") from None
    command = f"./kit data xsum download {args.dir} (or ./kit data xsum generate {args.dir})"
    data = {s: read_raw(os.path.join(args.dir, "raw", s + ".jsonl"), command) for s in SPLITS}

    # The tokenizer, from the training split only (documents and summaries), as the vocabulary
    # of exercise 01: no word of the validation or test text may shape it.
    spm.set_random_generator_seed(args.seed)
    model = io.BytesIO()
    _, documents, summaries, _ = data["train"]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(documents + summaries), model_writer=model,
        vocab_size=args.vocab_size, hard_vocab_limit=False, model_type="unigram",
        character_coverage=0.9995, pad_id=0, unk_id=1, bos_id=2, eos_id=3, input_sentence_size=args.input_sentences,
        shuffle_input_sentence=True, max_sentence_length=1 << 16, num_threads=args.threads,
        minloglevel=2)
    model_bytes = model.getvalue()
    sp = spm.SentencePieceProcessor(model_proto=model_bytes)

    final = os.path.join(args.dir, "xsum.h5")
    part = os.path.join(args.dir, ".xsum.h5.part")
    try:
        write(h5py, np, sp, data, model_bytes, part, args)
    except BaseException:
        if os.path.exists(part):
            os.remove(part)
        raise
    with open(os.path.join(args.dir, "xsum.model"), "wb") as m:
        m.write(model_bytes)
    os.replace(part, final)  # the job never sees a half-written file under the final name
    print(f"{PROG}: {final} written (vocabulary {sp.get_piece_size()}, tokenizer "
          f"{args.dir}/xsum.model, SHA-256 {hashlib.sha256(model_bytes).hexdigest()[:16]}...)",
          flush=True)


def write(h5py, np, sp, data, model_bytes, part, args):
    """The HDF5 file of common/data/XSUM.md, at `part`."""
    vocab = sp.get_piece_size()
    pieces = [sp.id_to_piece(i).encode("utf-8") for i in range(vocab)]
    # 0 normal, 1 unknown, 2 control (<pad>, <s>, </s>: no text), 3 unused, 4 byte
    kinds = [1 if sp.is_unknown(i) else 2 if sp.is_control(i) else 3 if sp.is_unused(i)
             else 4 if sp.is_byte(i) else 0 for i in range(vocab)]
    with h5py.File(part, "w") as f:
        f.attrs["format"] = np.bytes_("kit-xsum")
        f.attrs["format_version"] = np.int64(FORMAT_VERSION)
        f.attrs["vocab_size"] = np.int64(vocab)
        for name in ("pad", "unk", "bos", "eos"):
            f.attrs[name + "_id"] = np.int64(getattr(sp, name + "_id")())
        f.attrs["tokenizer_sha256"] = np.bytes_(hashlib.sha256(model_bytes).hexdigest())
        f.attrs["source"] = np.bytes_(args.source or os.path.abspath(os.path.join(args.dir, "raw")))
        t = f.create_group("tokenizer")
        t["model"] = np.frombuffer(model_bytes, dtype=np.uint8)
        t["pieces"] = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        t["piece_offsets"] = np.cumsum([0] + [len(p) for p in pieces], dtype=np.int64)
        t["piece_kinds"] = np.array(kinds, dtype=np.uint8)
        for split in SPLITS:
            ids, documents, summaries, skipped = data[split]
            g = f.create_group(split)
            for name, texts in (("document", documents), ("summary", summaries)):
                tokens, lengths = encode(sp, texts, args.threads, np)
                g[name + "_tokens"] = tokens
                g[name + "_offsets"] = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
                g[name + "_lengths"] = lengths
            g["ids"] = np.array([i.encode("utf-8") for i in ids], dtype=np.bytes_)
            g.attrs["examples"] = np.int64(len(ids))
            g.attrs["skipped_empty"] = np.int64(len(skipped))
            if skipped:
                g["skipped_ids"] = np.array([i.encode("utf-8") for i in skipped], dtype=np.bytes_)
            lengths = g["document_lengths"][...]
            print(f"{PROG}: {split}: {len(ids)} examples, document tokens mean "
                  f"{lengths.mean():.0f}, max {lengths.max()}"
                  + (f"; {len(skipped)} skipped (empty document or summary: "
                     f"{', '.join(skipped[:3])}{', ...' if len(skipped) > 3 else ''})"
                     if skipped else ""), flush=True)


def main():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("download", help="login node: the original XSum, SHA-256 checked, as raw/")
    d.add_argument("dir")
    g = sub.add_parser("generate", help="an invented corpus in the raw format (offline)")
    g.add_argument("dir")
    g.add_argument("--train", type=int, default=2000)
    g.add_argument("--validation", type=int, default=200)
    g.add_argument("--test", type=int, default=200)
    g.add_argument("--seed", type=int, default=1)
    r = sub.add_parser("prepare", help="tokenizer and DIR/xsum.h5 from DIR/raw/")
    r.add_argument("dir")
    r.add_argument("--vocab-size", type=int, default=16000,
                   help="pieces at most (fewer where the text has fewer, as the generated corpus)")
    r.add_argument("--input-sentences", type=int, default=2000000,
                   help="texts the tokenizer is trained on at most (a sample of the split)")
    r.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1))
    r.add_argument("--seed", type=int, default=1, help="SentencePiece's sampling of the texts")
    r.add_argument("--source", default="", help="what the data are, for the file's attribute")
    args = p.parse_args()
    try:
        {"download": download, "generate": generate, "prepare": prepare}[args.command](args)
    except Refused as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        sys.exit(1)
    except (RuntimeError, OSError) as e:  # sentencepiece's trainer, a full disk, no permission
        print(f"{PROG}: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
