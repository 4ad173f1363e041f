// The C++ side of oracle_rouge.py: kit/seq2seq's ROUGE and Porter stemmer on the texts the
// oracle wrote, printed with every digit so that Python compares the doubles themselves.
//
//   rouge_probe stem WORDS          one word a line in, its stem a line out
//   rouge_probe score 0|1 PAIRS     (use_stemmer) per pair: P R F of ROUGE-1, ROUGE-2, ROUGE-L;
//                                   then "mean" and the three mean F-measures
//
// PAIRS holds, per pair, a line "<bytes of target> <bytes of prediction>" and then the two texts'
// UTF-8 bytes, back to back: texts may hold newlines, and no byte needs escaping.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "kit/seq2seq/porter.h"
#include "kit/seq2seq/rouge.h"

namespace {

int fail(const std::string& why) {
  std::cerr << "rouge_probe: " << why << "\n";
  return 2;
}

void print(const kit::RougeScore& s) {
  std::printf(" %.17g %.17g %.17g", s.precision, s.recall, s.fmeasure);
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "stem" && argc == 3) {
    std::ifstream in(argv[2]);
    if (!in) return fail(std::string("cannot read ") + argv[2]);
    for (std::string word; std::getline(in, word);) std::printf("%s\n", kit::porter_stem(word).c_str());
    return 0;
  }
  if (mode != "score" || argc != 4) return fail("usage: rouge_probe stem WORDS | score 0|1 PAIRS");
  bool stem = std::string(argv[2]) == "1";
  std::ifstream in(argv[3], std::ios::binary);
  if (!in) return fail(std::string("cannot read ") + argv[3]);
  std::vector<std::string> targets, predictions;
  for (std::string header; std::getline(in, header);) {
    std::istringstream sizes(header);
    std::size_t nt = 0, np = 0;
    if (!(sizes >> nt >> np)) return fail("pair " + std::to_string(targets.size()) + ": bad header '" + header + "'");
    std::string t(nt, '\0'), p(np, '\0');
    if (!in.read(t.data(), static_cast<std::streamsize>(nt)) ||
        !in.read(p.data(), static_cast<std::streamsize>(np)))
      return fail("pair " + std::to_string(targets.size()) + ": the file ends inside its texts");
    targets.push_back(std::move(t));
    predictions.push_back(std::move(p));
  }
  for (std::size_t i = 0; i < targets.size(); ++i) {
    kit::RougeScores s = kit::rouge_score(targets[i], predictions[i], stem);
    print(s.rouge1);
    print(s.rouge2);
    print(s.rougeL);
    std::printf("\n");
  }
  kit::RougeMeans m = kit::rouge_mean_fmeasure(targets, predictions, stem);
  std::printf("mean %.17g %.17g %.17g\n", m.rouge1, m.rouge2, m.rougeL);
  return 0;
}
