#!/usr/bin/env python3
"""kit/seq2seq's ROUGE and Porter stemmer against the PyPI packages the papers use (label oracle).

  scores  a few hundred pairs of texts, generated from a fixed seed, plus the hard cases written
          out below (punctuation, digits, hyphens, apostrophes, non-ASCII letters, the two
          non-ASCII letters whose lower case is ASCII, repeated words, long texts, empty texts,
          words that NLTK's default mode stems otherwise than Martin Porter's), scored by
          rouge_score.rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer) with
          and without the stemmer, and by rouge_probe on the same bytes. Every precision, recall
          and F-measure, and the mean F-measures, must agree within 1e-6; a failure names the pair.
  stems   nltk's PorterStemmer() (default mode, as rouge-score makes it) against kit::porter_stem
          on every distinct word of the bundled WikiText-format corpus and on generated words:
          short roots with every suffix the algorithm's rules name, one and two deep. Exactly.
          The list must hold words whose stems differ between NLTK's modes, so that a stemmer in
          Martin Porter's mode fails.

Without the packages (pip install -r requirements.txt: rouge-score, nltk) the test says so in one
line and is skipped (exit 77).

  oracle_rouge.py scores --probe rouge_probe --work DIR
  oracle_rouge.py stems --probe rouge_probe --corpus DIR --work DIR
"""
import argparse
import itertools
import os
import random
import subprocess
import sys

try:
    from nltk.stem.porter import PorterStemmer
    from rouge_score import rouge_scorer
except ImportError as e:
    print(f"skipped: {sys.executable} lacks rouge-score or nltk ({e}): "
          "pip install -r requirements.txt")
    sys.exit(77)

TOLERANCE = 1e-6
KINDS = ("rouge1", "rouge2", "rougeL")
FIELDS = ("precision", "recall", "fmeasure")

# Words a news summary uses, with inflections that stem together, and NLTK's irregular forms.
WORDS = """the a an of to in on at for with by from and or but not is was were be been has have
had will would said says say saying government minister ministers police officer officers court
courts city cities country countries people person year years week weeks day days report reports
reported reporting announce announced announcement announcements run runs running ran runner
happy happily happiness generous generously generosity relate related relational relations nation
national nationally nationalization organize organized organization organizational hope hoped
hopeful hopefully hopefulness electric electrical electricity conditional conditions adjust
adjustable adjustment adoption adopted control controlled controlling controller dying lying
tying dies died skies sky news innings inning outings canning howe proceed exceed succeed agreed
feed feeding fly flies flying spied enjoy enjoyed geology theology archaeology biology fairly
analogously sensibility sensitivity formality formalize triplicate callousness decisiveness
probate rate cease roll controll generalizations vietnamization digitizer conformably radically
valency hesitancy operator feudalism communism activate angularity homologous effective
bowdlerize irritant replacement dependent revival allowance inference airliner gyroscopic
defensible caresses ponies ties caress cats plastered bled motoring sing conflated troubled sized
hopping tanned falling hissing fizzed failing filing""".split()
ODD = ["don't", "it's", "o'neill", "rock'n'roll", "state-of-the-art", "e-mail", "co-operate",
       "u.s.", "3.5%", "£20m", "$1,000", "2024", "9/11", "covid-19", "a1", "b2b", "x86_64",
       "café", "naïve", "zürich", "straße", "ÉCOLE", "Ørsted", "İstanbul", "İİ", "5\u212a",
       "\u212aelvin", "δημοκρατία", "москва", "北京", "🙂", "—", "…", "«quoted»", "“smart”",
       "tab\there", "new\nline", "  spaced  ", "UPPER", "MiXeD", "yyyy", "y", "ies", "sses", "1234s",
       "a-b-c", "...", "!!!", "-", "'", "''", "0", "00", "007"]


def pair_texts(rng, vocabulary, n_pairs):
    """(target, prediction) pairs: a target, and a prediction made from it by the edits a
    summariser's output shows (words dropped, replaced, inflected, moved, repeated, case changed),
    so that the scores spread over [0, 1] instead of sitting near 0."""
    seps = [" ", " ", " ", " ", ", ", ". ", "\n", "  ", " - ", "'", "\t", "; ", "/"]

    def join(words):
        return "".join(w + rng.choice(seps) for w in words).rstrip() if words else ""

    def recase(w):
        r = rng.random()
        return w.upper() if r < 0.05 else w.capitalize() if r < 0.15 else w

    pairs = []
    for _ in range(n_pairs):
        n = rng.choice([0, 1, 2, 3, 5, 8, 12, 20, 30, 45]) if rng.random() < 0.96 else rng.randint(200, 600)
        target = [recase(rng.choice(vocabulary)) for _ in range(n)]
        noise = rng.choice([0.0, 0.1, 0.3, 0.5, 0.7, 0.9])  # how far the prediction strays
        pred = []
        for w in target:
            r = rng.random()
            if r < noise / 2:
                continue                                   # dropped
            if r < noise:
                pred.append(recase(rng.choice(vocabulary)))  # replaced
            elif r < noise + 0.08:
                pred += [w, w]                             # repeated
            else:
                pred.append(recase(w.lower()))
        if len(pred) > 2 and rng.random() < 0.3:           # a span moved
            i, j = sorted(rng.sample(range(len(pred)), 2))
            pred = pred[:i] + pred[j:] + pred[i:j]
        if rng.random() < 0.1:
            pred = [recase(rng.choice(vocabulary)) for _ in range(rng.randint(0, 15))]
        pairs.append((join(target), join(pred)))
    return pairs


def hard_pairs(differing):
    """The cases written out: each says in its text what it tries."""
    d = " ".join(differing[:40])
    return [
        ("", ""), ("", "a prediction with no reference"), ("a reference with no prediction", ""),
        ("!!! ... ---", "?? ,,"), ("word", "word"), ("word", "Word."), ("a b", "b a"),
        ("the the the the", "the the"), ("the cat the cat the cat", "the cat"),
        ("Don't stop: it's state-of-the-art!", "don t stop it s state of the art"),
        ("The U.S. economy grew 3.5% in 2024, to $1,000bn.", "US economy grew 3 5 in 2024 to 1 000bn"),
        ("Café naïve Zürich Straße", "caf na ve z rich stra e"),
        ("İstanbul İİ 5\u212a \u212aelvin", "i stanbul i i 5k kelvin"),
        ("Москва 北京 δημοκρατία 🙂", "— … «» “”"),
        ("e-mail co-operate covid-19 x86_64", "email cooperate covid 19 x86 64"),
        ("dying lying tying dies died skies news innings", "die lie tie die die sky news inning"),
        (d, d.upper()), (d, " ".join(reversed(differing[:40]))),
        ("running runs runner ran", "run run run run"),
        ("generalizations nationalization organizational", "general nation organ"),
        (" ".join(["word"] * 500), " ".join(["word"] * 499 + ["other"])),
        (" ".join(f"w{i}" for i in range(900)), " ".join(f"w{i}" for i in range(0, 900, 2))),
        ("line one\nline two\n\nline three", "line one line two line three"),
        ("  leading and trailing  ", "leading\tand\ttrailing"),
        ("yyyy ies sses 1234s", "yyyi i ss 1234"),
    ]


def differing_words(words):
    """Words that NLTK's default mode stems otherwise than MARTIN_EXTENSIONS (sorted)."""
    nltk_mode, martin = PorterStemmer(), PorterStemmer(PorterStemmer.MARTIN_EXTENSIONS)
    return sorted(w for w in set(words) if nltk_mode.stem(w) != martin.stem(w))


def generated_words():
    """Short roots (letters that make vowels, consonants and y's, and a digit) with every suffix
    the algorithm's rules name, one and two deep."""
    suffixes = """s sses ies ss eed ed ing y ational tional enci anci izer bli abli alli entli eli
    ousli ization ation ator alism iveness fulness ousness aliti iviti biliti fulli logi icate
    ative alize iciti ical ful ness al ance ence er ic able ible ant ement ment ent ion sion tion
    ou ism ate iti ous ive ize e ll at bl iz ied""".split()
    roots = ["".join(p) for k in (1, 2, 3) for p in itertools.product("aeiybclnst1", repeat=k)]
    words = set(roots)
    for r in roots:
        words.update(r + s for s in suffixes)
    for r in roots[:140]:
        words.update(r + s + t for s in suffixes for t in ("s", "ing", "ed", "ly", "ness", "al"))
    return sorted(words)


def run_probe(args, *argv):
    done = subprocess.run([args.probe, *argv], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"FAIL rouge_probe {' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def short(text):
    return repr(text if len(text) <= 70 else text[:60] + "...") + f" ({len(text)} chars)"


def scores(args):
    rng = random.Random(20261127)
    # Real words first, then generated ones from an eighth of the list (1 s, not 10).
    differing = differing_words(WORDS) + rng.sample(differing_words(generated_words()[::8]), 60)
    vocabulary = WORDS + ODD + differing
    pairs = hard_pairs(differing) + pair_texts(rng, vocabulary, 400)
    os.makedirs(args.work, exist_ok=True)
    path = os.path.join(args.work, "pairs.bin")
    with open(path, "wb") as f:
        for t, p in pairs:
            tb, pb = t.encode("utf-8"), p.encode("utf-8")
            f.write(f"{len(tb)} {len(pb)}\n".encode() + tb + pb)
    failures, worst, figures = [], 0.0, 0
    for stem in (False, True):
        scorer = rouge_scorer.RougeScorer(list(KINDS), use_stemmer=stem)
        lines = run_probe(args, "score", "1" if stem else "0", path).split("\n")
        if len(lines) != len(pairs) + 2 or not lines[-2].startswith("mean "):
            sys.exit(f"FAIL rouge_probe printed {len(lines) - 1} lines for {len(pairs)} pairs")
        sums = dict.fromkeys(KINDS, 0.0)
        for i, (t, p) in enumerate(pairs):
            ref = scorer.score(t, p)
            got = [float(x) for x in lines[i].split()]
            want = [getattr(ref[k], f) for k in KINDS for f in FIELDS]
            for k in KINDS:
                sums[k] += ref[k].fmeasure
            for (k, f), g, w in zip(itertools.product(KINDS, FIELDS), got, want):
                figures += 1
                worst = max(worst, abs(g - w))
                if abs(g - w) > TOLERANCE:
                    failures.append(f"pair {i} (use_stemmer={stem}): {k}.{f} is {g!r} in C++, "
                                    f"{w!r} in rouge-score; target {short(t)}, prediction {short(p)}")
        means = [float(x) for x in lines[-2].split()[1:]]
        for k, g in zip(KINDS, means):
            w = sums[k] / len(pairs)
            worst = max(worst, abs(g - w))
            if abs(g - w) > TOLERANCE:
                failures.append(f"mean {k} F (use_stemmer={stem}): {g!r} in C++, {w!r} from rouge-score")
    for line in failures[:20]:
        print("FAIL " + line)
    if failures:
        print(f"FAIL {len(failures)} of {figures} figures differ by more than {TOLERANCE}")
        return 1
    print(f"OK: {len(pairs)} pairs, with and without the stemmer, {figures} figures and 6 means "
          f"equal to rouge-score's within {TOLERANCE} (largest difference {worst:.3g})")
    return 0


def stems(args):
    words = set(generated_words()) | set(WORDS)
    for split in ("train", "valid", "test"):
        path = os.path.join(args.corpus, f"wiki.{split}.tokens")
        try:
            with open(path, encoding="utf-8") as f:
                corpus = {w for w in f.read().split() if w.isascii() and w.isalnum()}
        except OSError as e:
            sys.exit(f"FAIL cannot read the bundled corpus ({e}): build the target corpus")
        words |= corpus
    words = sorted(words)
    nltk_mode, martin = PorterStemmer(), PorterStemmer(PorterStemmer.MARTIN_EXTENSIONS)
    want = [nltk_mode.stem(w) for w in words]
    differing = [w for w, s in zip(words, want) if martin.stem(w) != s]
    if len(differing) < 100:
        sys.exit(f"FAIL the word list holds only {len(differing)} words that NLTK's modes stem "
                 "differently: it would not tell the modes apart")
    os.makedirs(args.work, exist_ok=True)
    path = os.path.join(args.work, "words.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(w + "\n" for w in words))
    got = run_probe(args, "stem", path).split("\n")[:-1]
    if len(got) != len(words):
        sys.exit(f"FAIL rouge_probe stemmed {len(got)} of {len(words)} words")
    wrong = [(w, g, s) for w, g, s in zip(words, got, want) if g != s]
    for w, g, s in wrong[:20]:
        print(f"FAIL {w!r}: kit::porter_stem gives {g!r}, NLTK {s!r}")
    if wrong:
        print(f"FAIL {len(wrong)} of {len(words)} stems differ from NLTK's")
        return 1
    print(f"OK: {len(words)} words (of them {len(differing)} that NLTK's default and Martin "
          "Porter's modes stem differently) stemmed as NLTK's PorterStemmer() does")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["scores", "stems"])
    ap.add_argument("--probe", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--corpus", help="the bundled WikiText-format corpus (stems)")
    args = ap.parse_args()
    if args.what == "stems" and not args.corpus:
        ap.error("stems needs --corpus")
    return scores(args) if args.what == "scores" else stems(args)


if __name__ == "__main__":
    sys.exit(main())
