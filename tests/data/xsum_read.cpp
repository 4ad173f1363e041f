// xsum_read: kit/data/xsum.h from the command line, for tests/data/test_xsum.py (the capstone's
// trainer does not exist yet; this is the reader's only caller in the tests).
//
//   xsum_read PATH SPLIT [--max-document-len N] [--max-summary-len N] [--vocab-size N]
//             [--tokenizer FILE] [--decode K]
//
// Prints the dataset's report() line, then for every example (or the first K with --decode K)
// one line "INDEX<TAB>DOCUMENT IDS<TAB>SUMMARY IDS<TAB>DECODED DOCUMENT<TAB>DECODED SUMMARY", ids
// space-separated: every get() runs, so a damaged example anywhere is found. A DataError is one
// line on stderr and exit 1.
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

#include "kit/data/xsum.h"

namespace {

std::string ids_text(const torch::Tensor& ids) {
  std::ostringstream out;
  for (int64_t i = 0; i < ids.numel(); ++i) out << (i ? " " : "") << ids[i].item<int64_t>();
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: xsum_read PATH SPLIT [--max-document-len N] [--max-summary-len N] "
                 "[--vocab-size N] [--tokenizer FILE] [--decode K]\n";
    return 2;
  }
  kit::XsumOptions options;
  int64_t decode = -1;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--max-document-len") options.max_document_len = std::stoll(value);
    else if (flag == "--max-summary-len") options.max_summary_len = std::stoll(value);
    else if (flag == "--vocab-size") options.vocab_size = std::stoll(value);
    else if (flag == "--tokenizer") options.tokenizer = value;
    else if (flag == "--decode") decode = std::stoll(value);
    else {
      std::cerr << "xsum_read: unknown flag " << flag << "\n";
      return 2;
    }
  }
  try {
    kit::XsumDataset data(argv[1], argv[2], options);
    std::cout << data.report() << "\n";
    const size_t n = decode < 0 ? data.size() : std::min(data.size(), static_cast<size_t>(decode));
    for (size_t i = 0; i < n; ++i) {
      const kit::XsumExample e = data.get(i);
      std::cout << i << "\t" << ids_text(e.document) << "\t" << ids_text(e.summary) << "\t"
                << data.vocab().decode(e.document) << "\t" << data.vocab().decode(e.summary)
                << "\n";
    }
  } catch (const kit::DataError& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
