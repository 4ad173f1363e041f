// ROUGE as rouge-score 0.1.2 computes it: rouge_score/tokenize.py and rouge_scorer.py, function
// for function (kit/seq2seq/rouge.h says what they do).
#include "kit/seq2seq/rouge.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

#include "kit/seq2seq/porter.h"

namespace kit {
namespace {

// rouge_score.scoring.fmeasure, with its operations in its order.
double fmeasure(double precision, double recall) {
  if (precision + recall > 0) return 2 * precision * recall / (precision + recall);
  return 0.0;
}

// Each n-gram as its tokens joined by spaces (tokens never hold one) -> how often it occurs.
std::unordered_map<std::string, long> ngrams(const std::vector<std::string>& tokens, int n) {
  std::unordered_map<std::string, long> counts;
  for (std::size_t i = 0; i + n <= tokens.size(); ++i) {
    std::string key = tokens[i];
    for (int k = 1; k < n; ++k) key += ' ' + tokens[i + k];
    ++counts[key];
  }
  return counts;
}

}  // namespace

std::vector<std::string> rouge_tokenize(std::string_view text, bool use_stemmer) {
  // text.lower(), then [^a-z0-9]+ -> " ", then split on spaces.
  std::vector<std::string> tokens;
  std::string token;
  auto end_token = [&] {
    if (!token.empty()) tokens.push_back(std::move(token));
    token.clear();
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c >= 'a' && c <= 'z') {
      token += c;
    } else if (c >= 'A' && c <= 'Z') {
      token += static_cast<char>(c - 'A' + 'a');
    } else if (c >= '0' && c <= '9') {
      token += c;
    } else if (text.compare(i, 3, "\xE2\x84\xAA") == 0) {  // U+212A KELVIN SIGN: lower() is "k"
      token += 'k';
      i += 2;
    } else if (text.compare(i, 2, "\xC4\xB0") == 0) {  // U+0130: lower() is "i" + U+0307
      token += 'i';
      end_token();
      i += 1;
    } else {
      end_token();  // any other character, ASCII or not, byte by byte
    }
  }
  end_token();
  if (use_stemmer) {
    // Only tokens longer than 3 characters are stemmed; a stem that is not [a-z0-9]+ (none is
    // known: only an empty one could be) is dropped, as the package's last check does.
    std::vector<std::string> stemmed;
    for (std::string& t : tokens) {
      std::string s = t.size() > 3 ? porter_stem(t) : std::move(t);
      if (!s.empty()) stemmed.push_back(std::move(s));
    }
    return stemmed;
  }
  return tokens;
}

RougeScore rouge_n(const std::vector<std::string>& target,
                   const std::vector<std::string>& prediction, int n) {
  if (n <= 0) throw std::invalid_argument("kit::rouge_n: n must be positive, got " + std::to_string(n));
  auto target_ngrams = ngrams(target, n);
  auto prediction_ngrams = ngrams(prediction, n);
  long overlap = 0, target_count = 0, prediction_count = 0;
  for (const auto& [gram, count] : target_ngrams) {
    auto it = prediction_ngrams.find(gram);
    if (it != prediction_ngrams.end()) overlap += std::min(count, it->second);
    target_count += count;
  }
  for (const auto& [gram, count] : prediction_ngrams) prediction_count += count;
  RougeScore s;
  s.precision = static_cast<double>(overlap) / static_cast<double>(std::max(prediction_count, 1L));
  s.recall = static_cast<double>(overlap) / static_cast<double>(std::max(target_count, 1L));
  s.fmeasure = fmeasure(s.precision, s.recall);
  return s;
}

std::size_t lcs_length(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  // The package's table, one row at a time: row[j] is the LCS of a[0..i) and b[0..j).
  std::vector<std::size_t> prev(b.size() + 1, 0), row(b.size() + 1, 0);
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j)
      row[j] = a[i - 1] == b[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], row[j - 1]);
    std::swap(prev, row);
  }
  return prev[b.size()];
}

RougeScore rouge_lcs(const std::vector<std::string>& target,
                     const std::vector<std::string>& prediction) {
  RougeScore s;
  if (target.empty() || prediction.empty()) return s;
  double lcs = static_cast<double>(lcs_length(target, prediction));
  s.precision = lcs / static_cast<double>(prediction.size());
  s.recall = lcs / static_cast<double>(target.size());
  s.fmeasure = fmeasure(s.precision, s.recall);
  return s;
}

RougeScores rouge_score(std::string_view target, std::string_view prediction, bool use_stemmer) {
  auto t = rouge_tokenize(target, use_stemmer);
  auto p = rouge_tokenize(prediction, use_stemmer);
  return {rouge_n(t, p, 1), rouge_n(t, p, 2), rouge_lcs(t, p)};
}

RougeMeans rouge_mean_fmeasure(const std::vector<std::string>& targets,
                               const std::vector<std::string>& predictions, bool use_stemmer) {
  if (targets.size() != predictions.size())
    throw std::invalid_argument("kit::rouge_mean_fmeasure: " + std::to_string(targets.size()) +
                                " targets but " + std::to_string(predictions.size()) +
                                " predictions: each prediction needs its reference summary");
  if (targets.empty())
    throw std::invalid_argument("kit::rouge_mean_fmeasure: no pairs to average");
  RougeMeans m;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    RougeScores s = rouge_score(targets[i], predictions[i], use_stemmer);
    m.rouge1 += s.rouge1.fmeasure;
    m.rouge2 += s.rouge2.fmeasure;
    m.rougeL += s.rougeL.fmeasure;
  }
  double n = static_cast<double>(targets.size());
  m.rouge1 /= n;
  m.rouge2 /= n;
  m.rougeL /= n;
  return m;
}

}  // namespace kit
