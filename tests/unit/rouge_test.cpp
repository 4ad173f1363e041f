// kit/seq2seq/rouge.h and porter.h on cases worked out by hand (no LibTorch: builds in seconds).
// The comparison with the rouge-score package itself, on hundreds of pairs, is
// tests/oracle/oracle_rouge.py; these cases say what the numbers mean.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "kit/seq2seq/porter.h"
#include "kit/seq2seq/rouge.h"

namespace {

using Tokens = std::vector<std::string>;

void expect_score(const kit::RougeScore& s, double p, double r, const char* what) {
  SCOPED_TRACE(what);
  EXPECT_DOUBLE_EQ(s.precision, p);
  EXPECT_DOUBLE_EQ(s.recall, r);
  EXPECT_DOUBLE_EQ(s.fmeasure, p + r > 0 ? 2 * p * r / (p + r) : 0.0);
}

TEST(Rouge, IdenticalTextsScoreOne) {
  for (bool stem : {false, true}) {
    auto s = kit::rouge_score("The cat sat on the mat.", "the CAT sat on the mat", stem);
    expect_score(s.rouge1, 1, 1, "rouge1");
    expect_score(s.rouge2, 1, 1, "rouge2");
    expect_score(s.rougeL, 1, 1, "rougeL");
  }
}

TEST(Rouge, DisjointTextsScoreZero) {
  auto s = kit::rouge_score("alpha beta gamma", "delta epsilon", true);
  expect_score(s.rouge1, 0, 0, "rouge1");
  expect_score(s.rouge2, 0, 0, "rouge2");
  expect_score(s.rougeL, 0, 0, "rougeL");
}

TEST(Rouge, UnigramsAndBigramsAreClippedByTheOtherSide) {
  // target: the cat sat on the mat (6 unigrams, 5 bigrams); prediction: the the the cat (4, 3).
  // Unigrams: "the" counts min(2, 3) = 2, "cat" 1 -> 3. Bigrams: "the cat" 1 (of "the the" x2,
  // "the cat" in the prediction; "the cat", "cat sat", ... in the target).
  auto s = kit::rouge_score("the cat sat on the mat", "the the the cat", false);
  expect_score(s.rouge1, 3.0 / 4, 3.0 / 6, "rouge1");
  expect_score(s.rouge2, 1.0 / 3, 1.0 / 5, "rouge2");
  // LCS: "the cat" (2).
  expect_score(s.rougeL, 2.0 / 4, 2.0 / 6, "rougeL");
  // The other way round: the target's three "the" meet one in the prediction.
  s = kit::rouge_score("the the the cat", "the cat sat", false);
  expect_score(s.rouge1, 2.0 / 3, 2.0 / 4, "rouge1, clipped by the prediction");
}

TEST(Rouge, TheHeaderExample) {
  auto s = kit::rouge_score("the cat sat on the mat", "a cat sat on a mat", true);
  expect_score(s.rouge1, 4.0 / 6, 4.0 / 6, "rouge1");  // cat sat on mat
  expect_score(s.rouge2, 2.0 / 5, 2.0 / 5, "rouge2");  // cat sat, sat on
  expect_score(s.rougeL, 4.0 / 6, 4.0 / 6, "rougeL");
}

TEST(Rouge, LongestCommonSubsequenceSkipsButKeepsOrder) {
  // a b c d e f against a c e b f: a c e f (4); "b" before "c" in one and after "e" in the other.
  EXPECT_EQ(kit::lcs_length({"a", "b", "c", "d", "e", "f"}, {"a", "c", "e", "b", "f"}), 4u);
  EXPECT_EQ(kit::lcs_length({"x", "y"}, {"y", "x"}), 1u);
  EXPECT_EQ(kit::lcs_length({"x", "x", "x"}, {"x"}), 1u);  // each token matched once
  EXPECT_EQ(kit::lcs_length({}, {"x"}), 0u);
  expect_score(kit::rouge_lcs({"a", "b", "c", "d", "e", "f"}, {"a", "c", "e", "b", "f"}), 4.0 / 5,
               4.0 / 6, "rougeL");
}

TEST(Rouge, AnEmptySideScoresZeroAsTheRougeScorePackageDoes) {
  // rouge-score: n-gram precision and recall divide by max(count, 1), so 0 / 1; ROUGE-L returns
  // zeros when either side has no token; punctuation alone is no token.
  for (auto [target, prediction] : {std::pair{"", "some words"}, std::pair{"some words", ""},
                                    std::pair{"", ""}, std::pair{"!!! ...", "-- ?"}}) {
    auto s = kit::rouge_score(target, prediction, true);
    expect_score(s.rouge1, 0, 0, "rouge1");
    expect_score(s.rouge2, 0, 0, "rouge2");
    expect_score(s.rougeL, 0, 0, "rougeL");
  }
  // One token on each side: no bigram, so ROUGE-2 is 0 even for identical texts.
  auto s = kit::rouge_score("word", "word", false);
  expect_score(s.rouge1, 1, 1, "rouge1");
  expect_score(s.rouge2, 0, 0, "rouge2");
}

TEST(Rouge, TokensAreLowerCaseRunsOfAsciiLettersAndDigits) {
  EXPECT_EQ(kit::rouge_tokenize("Don't stop: state-of-the-art, 3.5% in 2024!", false),
            (Tokens{"don", "t", "stop", "state", "of", "the", "art", "3", "5", "in", "2024"}));
  // Non-ASCII letters separate tokens ("café" -> "caf"), except the two whose lower case is ASCII.
  EXPECT_EQ(kit::rouge_tokenize("café naïve Straße", false),
            (Tokens{"caf", "na", "ve", "stra", "e"}));
  EXPECT_EQ(kit::rouge_tokenize("5\xE2\x84\xAA \xC4\xB0stanbul", false),  // 5K (Kelvin), İstanbul
            (Tokens{"5k", "i", "stanbul"}));
  // A byte that is not UTF-8 is a separator too.
  EXPECT_EQ(kit::rouge_tokenize("ab\xFF" "cd\xC4", false), (Tokens{"ab", "cd"}));
}

TEST(Rouge, OnlyTokensLongerThanThreeCharactersAreStemmed) {
  // "ties" (4) -> "tie" by NLTK's 4-letter -ies rule; "was" (3) stays although Porter would
  // make it "wa"; "running" -> "run".
  EXPECT_EQ(kit::rouge_tokenize("Running ties was", true), (Tokens{"run", "tie", "was"}));
  EXPECT_EQ(kit::porter_stem("was"), "wa");
  // Stemming makes "cats"/"cat" match: unigram recall 1 with the stemmer, 0 without.
  EXPECT_DOUBLE_EQ(kit::rouge_score("cats running", "cat runs", true).rouge1.recall, 1.0);
  EXPECT_DOUBLE_EQ(kit::rouge_score("cats running", "cat runs", false).rouge1.recall, 0.0);
}

TEST(Porter, TheWordsOfThePaper) {
  // Porter (1980), one example per step.
  for (auto [word, stem] : {std::pair{"caresses", "caress"}, {"ponies", "poni"}, {"cats", "cat"},
                            {"feed", "feed"}, {"agreed", "agre"}, {"plastered", "plaster"},
                            {"motoring", "motor"}, {"sing", "sing"}, {"conflated", "conflat"},
                            {"hopping", "hop"}, {"falling", "fall"}, {"filing", "file"},
                            {"happy", "happi"}, {"relational", "relat"}, {"triplicate", "triplic"},
                            {"adjustable", "adjust"}, {"adoption", "adopt"},
                            {"controlling", "control"}, {"generalizations", "gener"}})
    EXPECT_EQ(kit::porter_stem(word), stem) << word;
}

TEST(Porter, NltkExtensionsNotMartinPortersVersion) {
  // Where NLTK's default mode differs from Martin Porter's (his gives the second column).
  for (auto [word, stem, porter] : {std::tuple{"dying", "die", "dy"}, {"dies", "die", "di"},
                                    {"died", "die", "di"}, {"news", "news", "new"},
                                    {"enjoy", "enjoy", "enjoi"}, {"geology", "geolog", "geologi"},
                                    {"skies", "sky", "ski"}, {"innings", "inning", "in"},
                                    // *o holds for a two-letter stem (NLTK only)
                                    {"used", "use", "us"}, {"aged", "age", "ag"}})
    EXPECT_EQ(kit::porter_stem(word), stem) << word << " (Martin Porter's: " << porter << ")";
  // Upper case is lowered first; one- and two-letter words stay.
  EXPECT_EQ(kit::porter_stem("Running"), "run");
  EXPECT_EQ(kit::porter_stem("is"), "is");
}

TEST(Rouge, CorpusMeanAveragesThePairsFMeasures) {
  auto m = kit::rouge_mean_fmeasure({"the cat sat", "a b"}, {"the cat sat", "c d"}, false);
  EXPECT_DOUBLE_EQ(m.rouge1, 0.5);
  EXPECT_DOUBLE_EQ(m.rouge2, 0.5);
  EXPECT_DOUBLE_EQ(m.rougeL, 0.5);
  EXPECT_THROW(kit::rouge_mean_fmeasure({"a"}, {}, false), std::invalid_argument);
  EXPECT_THROW(kit::rouge_mean_fmeasure({}, {}, false), std::invalid_argument);
}

}  // namespace
