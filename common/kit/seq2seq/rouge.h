// ROUGE-1, ROUGE-2 and ROUGE-L, the scores a summariser is judged by, computed as the PyPI package
// rouge-score does (rouge_score.rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"],
// use_stemmer=...).score(target, prediction), version 0.1.2, pinned in requirements.txt).
//
// Why in C++ and why exactly that package: the trainer evaluates on every rank without Python,
// and a ROUGE figure only means something beside the papers' when the text is cut into tokens
// and stemmed as theirs was; small differences there (a hyphen, an apostrophe, another stemmer)
// move the score by more than a training improvement does. tests/oracle/oracle_rouge.py compares
// this file with rouge-score on a few hundred pairs of texts (within 1e-6; they agree to the bit).
//
// What rouge-score does, and so this file:
//   tokens   the text lower-cased, every character that is not [a-z0-9] a separator (so "don't"
//            is "don" "t", "state-of-the-art" four tokens, "é" and "ß" separators); with the
//            stemmer, tokens longer than 3 characters go through NLTK's Porter stemmer
//            (kit/seq2seq/porter.h). Python lower-cases before it filters, so the two non-ASCII
//            letters whose lower case is ASCII count as letters: U+212A (Kelvin sign) is "k",
//            U+0130 ("İ") is "i" and ends the token. Text is UTF-8; a byte that is not valid
//            UTF-8 is a separator (Python cannot hold it in a str at all).
//   ROUGE-N  n-gram counts clipped by the other side's: precision over the prediction's n-grams,
//            recall over the target's, each 0 when there are none.
//   ROUGE-L  the longest common subsequence of the two token lists (not ROUGE-Lsum's per-sentence
//            union); all three 0 when either side has no token.
//   F        2 P R / (P + R), 0 when P + R is 0 (the same operations in the same order as
//            rouge_score.scoring.fmeasure, hence the same doubles).
//
//   kit::RougeScores s = kit::rouge_score("the cat sat on the mat", "a cat sat on a mat",
//                                         /*use_stemmer=*/true);
//   s.rouge1.fmeasure   // 0.666...: 4 of 6 unigrams on each side
//
// The corpus figure an evaluation prints is the mean of the pairs' F-measures
// (rouge_mean_fmeasure), what one gets from rouge-score by averaging score()'s fmeasure fields;
// it is not BootstrapAggregator's confidence interval.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace kit {

struct RougeScore {
  double precision = 0, recall = 0, fmeasure = 0;
};

struct RougeScores {
  RougeScore rouge1, rouge2, rougeL;
};

// rouge-score's tokenizer (rouge_score/tokenize.py) with or without the Porter stemmer.
std::vector<std::string> rouge_tokenize(std::string_view text, bool use_stemmer);

// ROUGE-N and ROUGE-L of token lists (the target is the reference summary).
RougeScore rouge_n(const std::vector<std::string>& target,
                   const std::vector<std::string>& prediction, int n);
RougeScore rouge_lcs(const std::vector<std::string>& target,
                     const std::vector<std::string>& prediction);
// The length of the longest common subsequence (what ROUGE-L counts).
std::size_t lcs_length(const std::vector<std::string>& a, const std::vector<std::string>& b);

// RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer).score(target, prediction).
RougeScores rouge_score(std::string_view target, std::string_view prediction, bool use_stemmer);

// The mean F-measure of each score over the pairs (targets[i], predictions[i]).
struct RougeMeans {
  double rouge1 = 0, rouge2 = 0, rougeL = 0;
};
// Throws std::invalid_argument (one line) when the lists differ in length or are empty.
RougeMeans rouge_mean_fmeasure(const std::vector<std::string>& targets,
                               const std::vector<std::string>& predictions, bool use_stemmer);

}  // namespace kit
