// NLTK's PorterStemmer in its default mode (NLTK_EXTENSIONS), step for step: each function below
// is the method of nltk/stem/porter.py with the same name, and keeps its order of rules, because
// a rule list stops at the first suffix that matches, whether or not its condition holds.
#include "kit/seq2seq/porter.h"

#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

namespace kit {
namespace {

using Condition = std::function<bool(const std::string& stem)>;
struct Rule {
  std::string_view suffix, replacement;
  Condition condition;  // empty: unconditional
};

bool is_vowel(char c) { return c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u'; }

// A 'y' is a consonant when the letter before it is a vowel (or it starts the word): a run of
// y's alternates, resolved from the left end of the run.
bool is_consonant(const std::string& w, std::size_t i) {
  if (is_vowel(w[i])) return false;
  if (w[i] != 'y') return true;
  bool negate = false;
  while (i > 0 && w[i] == 'y') {
    negate = !negate;
    --i;
  }
  return !is_vowel(w[i]) != negate;
}

// m in [C](VC){m}[V]: the number of vowel -> consonant changes.
int measure(const std::string& s) {
  int m = 0;
  bool prev_consonant = true;
  for (std::size_t i = 0; i < s.size(); ++i) {
    bool c = is_consonant(s, i);
    if (c && !prev_consonant) ++m;
    prev_consonant = c;
  }
  return m;
}

bool contains_vowel(const std::string& s) {
  for (std::size_t i = 0; i < s.size(); ++i)
    if (!is_consonant(s, i)) return true;
  return false;
}

bool ends_with(const std::string& w, std::string_view suffix) {
  return w.size() >= suffix.size() && w.compare(w.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string cut(const std::string& w, std::size_t n) { return w.substr(0, w.size() - n); }

bool ends_double_consonant(const std::string& w) {
  return w.size() >= 2 && w[w.size() - 1] == w[w.size() - 2] && is_consonant(w, w.size() - 1);
}

// *o: consonant-vowel-consonant, the last not w, x or y; NLTK also accepts a two-letter
// vowel-consonant word.
bool ends_cvc(const std::string& w) {
  std::size_t n = w.size();
  if (n >= 3 && is_consonant(w, n - 3) && !is_consonant(w, n - 2) && is_consonant(w, n - 1) &&
      w[n - 1] != 'w' && w[n - 1] != 'x' && w[n - 1] != 'y')
    return true;
  return n == 2 && !is_consonant(w, 0) && is_consonant(w, 1);
}

bool positive_measure(const std::string& s) { return measure(s) > 0; }
bool measure_above_1(const std::string& s) { return measure(s) > 1; }

// The first rule whose suffix matches decides: its replacement if the condition holds on what
// is left, the word unchanged otherwise.
std::string apply_rule_list(const std::string& word, const std::vector<Rule>& rules) {
  for (const Rule& r : rules) {
    if (!ends_with(word, r.suffix)) continue;
    std::string stem = cut(word, r.suffix.size());
    if (!r.condition || r.condition(stem)) return stem + std::string(r.replacement);
    return word;
  }
  return word;
}

std::string step1a(const std::string& w) {
  if (ends_with(w, "ies") && w.size() == 4) return cut(w, 3) + "ie";  // NLTK: dies -> die
  return apply_rule_list(w, {{"sses", "ss", {}}, {"ies", "i", {}}, {"ss", "ss", {}}, {"s", "", {}}});
}

std::string step1b(const std::string& w) {
  if (ends_with(w, "ied"))  // NLTK: died -> die, spied -> spi
    return cut(w, 3) + (w.size() == 4 ? "ie" : "i");
  if (ends_with(w, "eed")) {
    std::string stem = cut(w, 3);
    return measure(stem) > 0 ? stem + "ee" : w;
  }
  std::string s;
  bool removed = false;
  for (std::string_view suffix : {std::string_view("ed"), std::string_view("ing")}) {
    if (ends_with(w, suffix)) {
      s = cut(w, suffix.size());
      if (contains_vowel(s)) {
        removed = true;
        break;
      }
    }
  }
  if (!removed) return w;
  if (ends_with(s, "at")) return s + "e";
  if (ends_with(s, "bl")) return s + "e";
  if (ends_with(s, "iz")) return s + "e";
  if (ends_double_consonant(s)) {  // hopp -> hop, but fall, hiss, fizz stay
    char last = s.back();
    return last != 'l' && last != 's' && last != 'z' ? cut(s, 1) : s;
  }
  return measure(s) == 1 && ends_cvc(s) ? s + "e" : s;  // fil -> file
}

std::string step1c(const std::string& w) {
  // NLTK: y -> i after a consonant that is not the whole stem (happy -> happi, enjoy stays).
  return apply_rule_list(w, {{"y", "i", [](const std::string& stem) {
                                return stem.size() > 1 && is_consonant(stem, stem.size() - 1);
                              }}});
}

std::string step2(const std::string& w) {
  // NLTK applies ALLI -> AL first and runs the result through step 2 again.
  if (ends_with(w, "alli") && positive_measure(cut(w, 4))) return step2(cut(w, 4) + "al");
  Condition m0 = positive_measure;
  return apply_rule_list(
      w, {{"ational", "ate", m0}, {"tional", "tion", m0}, {"enci", "ence", m0},
          {"anci", "ance", m0}, {"izer", "ize", m0}, {"bli", "ble", m0}, {"alli", "al", m0},
          {"entli", "ent", m0}, {"eli", "e", m0}, {"ousli", "ous", m0}, {"ization", "ize", m0},
          {"ation", "ate", m0}, {"ator", "ate", m0}, {"alism", "al", m0}, {"iveness", "ive", m0},
          {"fulness", "ful", m0}, {"ousness", "ous", m0}, {"aliti", "al", m0},
          {"iviti", "ive", m0}, {"biliti", "ble", m0}, {"fulli", "ful", m0},
          // The 'l' of -logi stays with the stem for the condition: geology -> geolog.
          {"logi", "log", [&w](const std::string&) { return positive_measure(cut(w, 3)); }}});
}

std::string step3(const std::string& w) {
  Condition m0 = positive_measure;
  return apply_rule_list(w, {{"icate", "ic", m0}, {"ative", "", m0}, {"alize", "al", m0},
                             {"iciti", "ic", m0}, {"ical", "ic", m0}, {"ful", "", m0},
                             {"ness", "", m0}});
}

std::string step4(const std::string& w) {
  Condition m1 = measure_above_1;
  return apply_rule_list(
      w, {{"al", "", m1}, {"ance", "", m1}, {"ence", "", m1}, {"er", "", m1}, {"ic", "", m1},
          {"able", "", m1}, {"ible", "", m1}, {"ant", "", m1}, {"ement", "", m1},
          {"ment", "", m1}, {"ent", "", m1},
          {"ion", "", [](const std::string& s) {
             return measure(s) > 1 && (s.back() == 's' || s.back() == 't');
           }},
          {"ou", "", m1}, {"ism", "", m1}, {"ate", "", m1}, {"iti", "", m1}, {"ous", "", m1},
          {"ive", "", m1}, {"ize", "", m1}});
}

std::string step5a(const std::string& w) {
  if (!ends_with(w, "e")) return w;
  std::string stem = cut(w, 1);
  int m = measure(stem);
  if (m > 1 || (m == 1 && !ends_cvc(stem))) return stem;
  return w;
}

std::string step5b(const std::string& w) {
  return apply_rule_list(w, {{"ll", "l", [&w](const std::string&) {
                                return measure(cut(w, 1)) > 1;
                              }}});
}

// NLTK's table of irregular forms, looked up before any step.
const std::map<std::string, std::string, std::less<>>& irregular_forms() {
  static const std::map<std::string, std::string, std::less<>> pool = {
      {"sky", "sky"},         {"skies", "sky"},         {"dying", "die"},
      {"lying", "lie"},       {"tying", "tie"},         {"news", "news"},
      {"innings", "inning"},  {"inning", "inning"},     {"outings", "outing"},
      {"outing", "outing"},   {"cannings", "canning"},  {"canning", "canning"},
      {"howe", "howe"},       {"proceed", "proceed"},   {"exceed", "exceed"},
      {"succeed", "succeed"}};
  return pool;
}

}  // namespace

std::string porter_stem(std::string_view word) {
  std::string w(word);
  for (char& c : w)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  if (auto it = irregular_forms().find(w); it != irregular_forms().end()) return it->second;
  if (w.size() <= 2) return w;
  return step5b(step5a(step4(step3(step2(step1c(step1b(step1a(w))))))));
}

}  // namespace kit
