// kit/ddp/param_claim.cpp — the process-wide table of claimed parameters (see param_claim.h).
#include "kit/ddp/param_claim.h"

#include <map>
#include <mutex>

namespace kit {
namespace {

// One table for the process: in-process tests run several ranks as threads, each with its own
// model, so the table is shared and guarded.
std::mutex& table_mutex() {
  static std::mutex m;
  return m;
}
std::map<const void*, std::string>& table() {
  static std::map<const void*, std::string> t;
  return t;
}

}  // namespace

ParameterClaim::ParameterClaim(const std::vector<torch::Tensor>& params, std::string owner) {
  std::lock_guard<std::mutex> lock(table_mutex());
  for (const auto& p : params) {
    auto it = table().find(p.unsafeGetTensorImpl());
    if (it != table().end())
      throw std::invalid_argument(owner + ": this model is already wrapped by " + it->second +
                                  "; use one of them per model, not both");
  }
  for (const auto& p : params) {
    keys_.push_back(p.unsafeGetTensorImpl());
    table()[keys_.back()] = owner;
  }
}

ParameterClaim::~ParameterClaim() {
  std::lock_guard<std::mutex> lock(table_mutex());
  for (const void* k : keys_) table().erase(k);
}

}  // namespace kit
