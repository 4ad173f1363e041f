// The Porter stemmer as NLTK runs it by default (nltk.stem.porter.PorterStemmer(), mode
// NLTK_EXTENSIONS), for ROUGE with stemming (kit/seq2seq/rouge.h).
//
// Why NLTK's and not Martin Porter's own C version: the summarisation papers report ROUGE from the
// PyPI package rouge-score with use_stemmer=True, and that package stems with NLTK's default
// mode, which differs from Porter's own versions on some words ("dying" -> "die" where Porter
// gives "dy", "dies" -> "die", "news" -> "news", "enjoy" -> "enjoy", "geology" -> "geolog";
// Porter: "di", "new", "enjoi", "geologi"). A score is only comparable with a paper's when the stems are the same,
// so this file follows nltk/stem/porter.py step for step (nltk 3.10.4, pinned in
// requirements.txt); tests/oracle/oracle_rouge.py compares the two on a long word list.
//
//   kit::porter_stem("running")   // "run"
//   kit::porter_stem("dying")     // "die"   (NLTK's irregular forms)
//   kit::porter_stem("flies")     // "fli"   (and "dies" -> "die")
//
// Like NLTK's stem(), the word is lower-cased first (ASCII letters) and words of one or two
// letters are returned as they are. Words are ASCII: the ROUGE tokenizer only hands on [a-z0-9]+.
// A word with bytes outside ASCII may stem otherwise than in NLTK, which lower-cases non-ASCII
// letters and counts each as one consonant where this file sees bytes; no ROUGE token has one.
#pragma once

#include <string>
#include <string_view>

namespace kit {

std::string porter_stem(std::string_view word);

}  // namespace kit
