// tests/oracle/probe_io.h: what the oracles' C++ probes write for their Python side, one helper
// for all of them: a dict of named tensors in the format torch.load reads (torch::pickle_save).
#pragma once

#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/serialize.h>
#include <torch/torch.h>

namespace probe {

// Writes `dict` to `path`; a file that cannot be written throws, naming the probe (`who`) and the
// path.
inline void write_tensors(const std::string& path,
                          const c10::Dict<std::string, torch::Tensor>& dict, const char* who) {
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error(std::string(who) + ": cannot write " + path);
}

}  // namespace probe
