// make_corpus: writes a small, invented corpus in the file format of WikiText-2.
//
// The kit's demo and tests must train a language model on a machine without internet, so they
// cannot use the real WikiText-2. This program makes a stand-in: wiki.train.tokens,
// wiki.valid.tokens and wiki.test.tokens with the same layout (" = Title = " headings, blank
// lines, one paragraph per line, tokens separated by spaces, " @-@ " / " @,@ " / " @.@ ",
// <unk>), but text produced by a tiny seeded grammar over made-up words.
//
// The grammar is deliberately regular so that a small Transformer lowers its loss visibly within a
// few epochs: function words follow fixed sentence patterns, each noun prefers a few verbs and
// adjectives, each verb prefers a few objects, an article keeps to one topic and keeps naming its
// own title, and "a"/"an" depends on the next word's first letter.
//
// Determinism: the random numbers come from splitmix64 and only integer arithmetic is used to
// turn them into choices (no std::*_distribution, whose results differ between standard
// libraries), so the same arguments give byte-identical files on every machine. Each split has
// its own random stream, so changing --train-tokens leaves valid and test unchanged.
//
// Plain C++17, no LibTorch: it builds in about a second.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "splitmix.h"  // Rng

namespace {

// --- Random numbers -------------------------------------------------------------------------------

// An independent stream for each use of the seed (lexicon, train, valid, test).
uint64_t derive_seed(uint64_t seed, uint64_t stream) {
  Rng mixer(seed ^ (stream * 0xD1B54A32D192ED03ull));
  return mixer.next();
}

// A list of indices with Zipf-like weights: the r-th entry is picked about 1/(r+1) times as often
// as the first, like word frequencies in real text. Integer weights keep it deterministic.
struct Zipf {
  std::vector<int> items;
  std::vector<uint64_t> cumulative;

  explicit Zipf(std::vector<int> list) : items(std::move(list)) {
    uint64_t total = 0;
    for (size_t r = 0; r < items.size(); ++r) {
      total += 1000000 / (r + 1);
      cumulative.push_back(total);
    }
  }
  int pick(Rng& rng) const {
    const uint64_t x = rng.below(cumulative.back());
    size_t lo = 0, hi = cumulative.size() - 1;  // first entry with cumulative > x
    while (lo < hi) {
      const size_t mid = (lo + hi) / 2;
      if (cumulative[mid] > x) hi = mid; else lo = mid + 1;
    }
    return items[lo];
  }
};

// --- The invented language ------------------------------------------------------------------------

// Words are built from syllables, so they look like words of some language but mean nothing.
std::string make_word(Rng& rng, int syllables) {
  static const char* const onsets[] = {"b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s",
                                       "t", "v", "z", "th", "sh", "br", "kr", "st", "tr", "gl",
                                       "dr", "h", "w"};
  static const char* const vowels[] = {"a", "e", "i", "o", "u", "ai", "ou", "ei", "ia", "oa"};
  static const char* const codas[] = {"", "", "", "n", "r", "s", "l", "m", "th", "nd", "sk"};
  std::string w;
  for (int s = 0; s < syllables; ++s) {
    // Some words start with a vowel, which is what makes "an" appear.
    if (s > 0 || !rng.percent(25)) w += onsets[rng.below(std::size(onsets))];
    w += vowels[rng.below(std::size(vowels))];
    if (s + 1 == syllables || rng.percent(30)) w += codas[rng.below(std::size(codas))];
  }
  return w;
}

std::string capitalised(std::string w) {
  if (!w.empty() && w[0] >= 'a' && w[0] <= 'z') w[0] = static_cast<char>(w[0] - 'a' + 'A');
  return w;
}

struct Lexicon {
  std::vector<std::string> nouns, verbs, adjectives, names;
  // Affinities: which verbs a noun (as subject) tends to take, which nouns a verb tends to take
  // as object, which adjectives a noun tends to carry.
  std::vector<std::vector<int>> noun_verbs, verb_objects, noun_adjectives;
  // Topics: each article draws its words from one topic's (Zipf-weighted) share of the lexicon.
  struct Topic { Zipf nouns, verbs, adjectives, names; };
  std::vector<Topic> topics;

  explicit Lexicon(uint64_t seed) {
    Rng rng(seed);
    std::set<std::string> taken = {"the", "a", "an", "of", "in", "and", "was", "were", "is",
                                   "by", "it", "that", "near", "about", "after", "has", "with",
                                   "to", "for", "on", "at", "as", "its", "from", "which", "also"};
    auto fresh = [&](int min_syll, int max_syll, const std::string& suffix) {
      for (;;) {
        std::string w = make_word(rng, rng.between(min_syll, max_syll)) + suffix;
        if (w.size() >= 3 && taken.insert(w).second) return w;
      }
    };
    for (int i = 0; i < 560; ++i) nouns.push_back(fresh(1, 2, ""));
    for (int i = 0; i < 220; ++i) verbs.push_back(fresh(1, 2, i % 3 == 0 ? "ated" : "ed"));
    for (int i = 0; i < 180; ++i) adjectives.push_back(fresh(1, 2, i % 2 == 0 ? "ic" : "ous"));
    for (int i = 0; i < 340; ++i) names.push_back(capitalised(fresh(2, 3, "")));

    auto some = [&](size_t count, size_t of) {
      std::vector<int> v;
      for (size_t i = 0; i < count; ++i) v.push_back(static_cast<int>(rng.below(of)));
      return v;
    };
    for (size_t n = 0; n < nouns.size(); ++n) noun_verbs.push_back(some(2, verbs.size()));
    for (size_t v = 0; v < verbs.size(); ++v) verb_objects.push_back(some(3, nouns.size()));
    for (size_t n = 0; n < nouns.size(); ++n) noun_adjectives.push_back(some(2, adjectives.size()));
    for (int t = 0; t < 10; ++t)
      topics.push_back(Topic{Zipf(some(90, nouns.size())), Zipf(some(40, verbs.size())),
                             Zipf(some(30, adjectives.size())), Zipf(some(45, names.size()))});
  }
};

// --- Sentences, paragraphs, articles --------------------------------------------------------------

const char* const kSections[] = {"History", "Background", "Description", "Design", "Reception",
                                 "Legacy", "Later years", "Early life", "Geography",
                                 "Production", "Aftermath", "Structure", "Notes"};

using Tokens = std::vector<std::string>;

class Writer {
 public:
  Writer(const Lexicon& lex, uint64_t seed) : lex_(lex), rng_(seed) {}

  // Appends articles to `out` until the split holds at least `target` tokens, counted as the
  // loader counts them (every word, plus one <eos> per line, empty lines included). It stops at
  // the end of a paragraph, so the result is a little above `target`.
  std::string write(long target) {
    std::string out;
    long count = 0;
    while (count < target) {
      topic_ = static_cast<int>(rng_.below(lex_.topics.size()));
      title_ = {name()};
      if (rng_.percent(50)) title_.push_back(name());
      year_ = rng_.between(1820, 1980);

      emit_heading(out, count, 1, title_);
      emit_paragraph(out, count, /*lead=*/true);
      if (rng_.percent(40) && count < target) emit_paragraph(out, count, false);
      const int sections = rng_.between(2, 4);
      for (int s = 0; s < sections && count < target; ++s) {
        const std::string section = kSections[rng_.below(std::size(kSections))];
        emit_heading(out, count, 2, split_words(section));
        for (int p = rng_.between(1, 3); p > 0 && count < target; --p)
          emit_paragraph(out, count, false);
        if (rng_.percent(20) && count < target) {
          emit_heading(out, count, 3, {capitalised(noun())});
          emit_paragraph(out, count, false);
        }
      }
    }
    return out;
  }

 private:
  const Lexicon& lex_;
  Rng rng_;
  int topic_ = 0;
  Tokens title_;
  int year_ = 1900;

  static Tokens split_words(const std::string& s) {
    Tokens t;
    size_t i = 0;
    while (i < s.size()) {
      size_t j = s.find(' ', i);
      if (j == std::string::npos) j = s.size();
      t.push_back(s.substr(i, j - i));
      i = j + 1;
    }
    return t;
  }

  // WikiText puts a space before and after every line's text, and a blank line is " ".
  static void emit_line(std::string& out, long& count, const Tokens& tokens) {
    out += ' ';
    for (const std::string& t : tokens) out += t + ' ';
    out += '\n';
    count += static_cast<long>(tokens.size()) + 1;  // + <eos>
  }

  // " = Title = ", " = = Section = = ", " = = = Subsection = = = ", each with blank lines around.
  static void emit_heading(std::string& out, long& count, int level, const Tokens& words) {
    Tokens line;
    for (int i = 0; i < level; ++i) line.push_back("=");
    line.insert(line.end(), words.begin(), words.end());
    for (int i = 0; i < level; ++i) line.push_back("=");
    emit_line(out, count, {});
    emit_line(out, count, line);
    emit_line(out, count, {});
  }

  void emit_paragraph(std::string& out, long& count, bool lead) {
    Tokens line;
    const int sentences = rng_.between(2, 6);
    for (int s = 0; s < sentences; ++s) {
      const Tokens sentence = (lead && s == 0) ? definition() : any_sentence();
      line.insert(line.end(), sentence.begin(), sentence.end());
    }
    emit_line(out, count, line);
  }

  // A rare word now and then is <unk>, as in WikiText (where rare words were replaced).
  std::string maybe_unk(const std::string& w) { return rng_.percent(2) ? "<unk>" : w; }

  const Lexicon::Topic& topic() const { return lex_.topics[static_cast<size_t>(topic_)]; }
  int noun_id() { return topic().nouns.pick(rng_); }
  std::string noun() { return maybe_unk(lex_.nouns[static_cast<size_t>(noun_id())]); }
  std::string name() { return maybe_unk(lex_.names[static_cast<size_t>(topic().names.pick(rng_))]); }
  std::string year() { return std::to_string(year_ + rng_.between(0, 40)); }

  // The verb a subject noun takes: mostly one of its own two, sometimes any verb of the topic.
  int verb_for(int noun) {
    if (noun >= 0 && rng_.percent(70))
      return lex_.noun_verbs[static_cast<size_t>(noun)][rng_.below(2)];
    return topic().verbs.pick(rng_);
  }
  int object_for(int verb) {
    if (rng_.percent(60)) return lex_.verb_objects[static_cast<size_t>(verb)][rng_.below(3)];
    return noun_id();
  }
  std::string adjective_for(int noun) {
    if (rng_.percent(60))
      return lex_.adjectives[static_cast<size_t>(lex_.noun_adjectives[static_cast<size_t>(noun)][rng_.below(2)])];
    return lex_.adjectives[static_cast<size_t>(topic().adjectives.pick(rng_))];
  }

  static std::string article_for(const std::string& next) {
    return std::string("aeiou").find(next[0]) != std::string::npos ? "an" : "a";
  }

  // "the [adjective] noun" or "a/an [adjective] noun" for noun number `n`.
  void noun_phrase(Tokens& t, int n, bool definite) {
    const std::string word = maybe_unk(lex_.nouns[static_cast<size_t>(n)]);
    const std::string adjective = rng_.percent(35) ? adjective_for(n) : "";
    const std::string first = adjective.empty() ? word : adjective;
    t.push_back(definite ? "the" : article_for(first));
    if (!adjective.empty()) t.push_back(adjective);
    t.push_back(word);
  }

  // The subject of a sentence; `noun` is set to its noun number, or -1 for a name. "It" and
  // "The" are capitalised only at the start of the sentence.
  void subject(Tokens& t, int& noun, bool starts_sentence = true) {
    noun = -1;
    const uint64_t kind = rng_.below(100);
    if (kind < 30) { t.insert(t.end(), title_.begin(), title_.end()); return; }
    if (kind < 45) { t.push_back(starts_sentence ? "It" : "it"); return; }
    if (kind < 55) { t.push_back(name()); return; }
    noun = noun_id();
    const size_t first = t.size();
    noun_phrase(t, noun, true);
    if (starts_sentence) t[first] = "The";
  }

  void big_number(Tokens& t) {  // "12 @,@ 500": WikiText splits thousands separators off
    static const char* const groups[] = {"000", "500", "200", "250", "800"};
    t.push_back(std::to_string(rng_.between(1, 99)));
    t.push_back("@,@");
    t.push_back(groups[rng_.below(std::size(groups))]);
  }

  void decimal(Tokens& t) {  // "3 @.@ 5"
    t.push_back(std::to_string(rng_.between(1, 20)));
    t.push_back("@.@");
    t.push_back(std::to_string(rng_.between(0, 9)));
  }

  // The first sentence of an article says what the title is.
  Tokens definition() {
    Tokens t = title_;
    t.push_back("is");
    noun_phrase(t, noun_id(), false);
    t.push_back("in");
    t.push_back(name());
    t.push_back(",");
    t.push_back("near");
    t.push_back("the");
    t.push_back(noun());
    t.push_back("of");
    t.push_back(name());
    t.push_back(".");
    return t;
  }

  Tokens any_sentence() {
    Tokens t;
    int s_noun;
    const uint64_t pattern = rng_.below(100);
    if (pattern < 32) {  // Subject verb object [in year | of name] .
      subject(t, s_noun);
      const int v = verb_for(s_noun);
      t.push_back(lex_.verbs[static_cast<size_t>(v)]);
      // (Two statements, because the order in which function arguments are evaluated is up to
      // the compiler, and both draw random numbers.)
      const int object = object_for(v);
      noun_phrase(t, object, rng_.percent(60));
      if (rng_.percent(30)) { t.push_back("in"); t.push_back(year()); }
      else if (rng_.percent(30)) { t.push_back("of"); t.push_back(name()); }
    } else if (pattern < 44) {  // In year , subject verb object .
      t = {"In", year(), ","};
      subject(t, s_noun, /*starts_sentence=*/false);
      const int v = verb_for(s_noun);
      t.push_back(lex_.verbs[static_cast<size_t>(v)]);
      noun_phrase(t, object_for(v), true);
    } else if (pattern < 54) {  // The noun ( Name ) was verb by Name in year .
      const int n = noun_id();
      t = {"The", noun(), "(", name(), ")", "was", lex_.verbs[static_cast<size_t>(verb_for(n))],
           "by", name(), "in", year()};
    } else if (pattern < 63) {  // subject verb about 40 nouns , and the noun verb the noun @-@ noun
      subject(t, s_noun);
      t.push_back(lex_.verbs[static_cast<size_t>(verb_for(s_noun))]);
      t.push_back("about");
      t.push_back(std::to_string(rng_.between(2, 99)));
      t.push_back(lex_.nouns[static_cast<size_t>(noun_id())] + "s");
      const int n = noun_id();
      for (const std::string& w : {std::string(","), std::string("and"), std::string("the"),
                                   noun(), lex_.verbs[static_cast<size_t>(verb_for(n))],
                                   std::string("the"), noun(), std::string("@-@"), noun()})
        t.push_back(w);
    } else if (pattern < 72) {  // It has a noun of 3 @.@ 5 and a noun of 12 @,@ 000 nouns .
      t = {"It", "has", "a", noun(), "of"};
      t[2] = article_for(t[3]);
      decimal(t);
      t.push_back("and");
      const std::string n2 = noun();
      t.push_back(article_for(n2));
      t.push_back(n2);
      t.push_back("of");
      big_number(t);
      t.push_back(lex_.nouns[static_cast<size_t>(noun_id())] + "s");
    } else if (pattern < 81) {  // Name verb that " the noun verb the noun " .
      const int n = noun_id();
      const int v = verb_for(n);
      t = {name(), lex_.verbs[static_cast<size_t>(verb_for(-1))], "that", "\"", "the",
           lex_.nouns[static_cast<size_t>(n)], lex_.verbs[static_cast<size_t>(v)]};
      noun_phrase(t, object_for(v), true);
      t.push_back("\"");
    } else if (pattern < 90) {  // After the noun of year , the noun and the noun were verb .
      const int n = noun_id();
      t = {"After", "the", noun(), "of", year(), ",", "the", lex_.nouns[static_cast<size_t>(n)],
           "and", "the", noun(), "were", lex_.verbs[static_cast<size_t>(verb_for(n))]};
    } else {  // subject was verb in year ; the noun verb a adjective noun .
      subject(t, s_noun);
      t.push_back("was");
      t.push_back(lex_.verbs[static_cast<size_t>(verb_for(s_noun))]);
      t.push_back("in");
      t.push_back(year());
      t.push_back(";");
      const int n = noun_id();
      t.push_back("the");
      t.push_back(lex_.nouns[static_cast<size_t>(n)]);
      const int v = verb_for(n);
      t.push_back(lex_.verbs[static_cast<size_t>(v)]);
      noun_phrase(t, object_for(v), false);
    }
    t.push_back(".");
    return t;
  }
};

// --- Command line ---------------------------------------------------------------------------------

const char* const kUsage =
    "usage: make_corpus --out DIR [--train-tokens N] [--valid-tokens N] [--test-tokens N] "
    "[--seed S]\n"
    "Writes DIR/wiki.{train,valid,test}.tokens: an invented corpus in the WikiText-2 format.\n"
    "Defaults: --train-tokens 120000 --valid-tokens 12000 --test-tokens 12000 --seed 2017.\n"
    "Token counts include one <eos> per line, as kit::load_wikitext2 counts them.\n";

int usage_error(const std::string& message) {
  std::cerr << "make_corpus: " << message << "\n" << kUsage;
  return 2;
}

bool parse_number(const std::string& text, unsigned long long max, unsigned long long& value) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return false;
  if (text.size() > 19) return false;
  value = std::stoull(text);
  return value <= max;
}

// Writes next to the destination, then renames: an interrupted run never leaves half a file
// behind that looks complete.
bool write_file(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) return false;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  return !ec;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_dir;
  unsigned long long sizes[3] = {120000, 12000, 12000};  // train, valid, test
  unsigned long long seed = 2017;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") { std::cout << kUsage; return 0; }
    if (i + 1 >= argc) return usage_error("missing value after " + arg);
    const std::string value = argv[++i];
    unsigned long long* target = nullptr;
    unsigned long long max = 100000000;  // 100 M tokens: far more than anyone needs here
    if (arg == "--out") { out_dir = value; continue; }
    if (arg == "--train-tokens") target = &sizes[0];
    else if (arg == "--valid-tokens") target = &sizes[1];
    else if (arg == "--test-tokens") target = &sizes[2];
    else if (arg == "--seed") { target = &seed; max = UINT64_MAX; }
    else return usage_error("unknown option " + arg);
    if (!parse_number(value, max, *target) || (target != &seed && *target == 0))
      return usage_error("bad value for " + arg + ": " + value);
  }
  if (out_dir.empty()) return usage_error("--out DIR is required");

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) {
    std::cerr << "make_corpus: cannot create " << out_dir << ": " << ec.message() << "\n";
    return 1;
  }

  const Lexicon lexicon(derive_seed(seed, 0));
  const char* const splits[] = {"train", "valid", "test"};
  for (int s = 0; s < 3; ++s) {
    Writer writer(lexicon, derive_seed(seed, static_cast<uint64_t>(s) + 1));
    const std::string text = writer.write(static_cast<long>(sizes[s]));
    const std::filesystem::path path =
        std::filesystem::path(out_dir) / (std::string("wiki.") + splits[s] + ".tokens");
    if (!write_file(path, text)) {
      std::cerr << "make_corpus: cannot write " << path.string() << "\n";
      return 1;
    }
  }
  return 0;
}
