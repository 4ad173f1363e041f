// kit/parallel/mesh.cpp — the grid and its groups (see mesh.h).
#include "kit/parallel/mesh.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include "kit/check/observe.h"  // the mesh in the run trace
#include "kit/runtime/env.h"  // read_rank_env: ranks per node

namespace kit {
namespace {

// The directions of the grid. pp (exercise 05) is one only where it is asked for: a pp of 1 left
// out of the order is no direction at all, so exercise 04's meshes are what they were.
const std::vector<std::string> kDims = {"tp", "cp", "dp", "pp"};
// The groups every rank makes, in this order (every rank must make the same ones in the same
// order: kit::new_group). NERSC's comm.py makes the same set.
const std::vector<std::string> kGroups = {"tp", "cp", "dp", "tp-cp", "dp-cp"};

std::vector<std::string> split_dims(const std::string& dims) {
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    const size_t dash = dims.find('-', at);
    out.push_back(dims.substr(at, dash == std::string::npos ? std::string::npos : dash - at));
    if (dash == std::string::npos) return out;
    at = dash + 1;
  }
}

// "dp-cp" and "cp-dp" name one group: the names sorted.
std::string canonical(const std::string& dims) {
  auto names = split_dims(dims);
  std::sort(names.begin(), names.end());
  std::string out;
  for (auto& n : names) out += (out.empty() ? "" : "-") + n;
  return out;
}

std::string joined(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

}  // namespace

MeshLayout::MeshLayout(std::vector<std::string> dims, std::vector<int> sizes, int world_size)
    : dims_(std::move(dims)), sizes_(std::move(sizes)), world_(world_size) {
  if (dims_.size() != sizes_.size())
    throw std::invalid_argument("kit::MeshLayout: " + std::to_string(dims_.size()) +
                                " directions but " + std::to_string(sizes_.size()) + " sizes");
  int product = 1;
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (sizes_[i] < 1)
      throw std::invalid_argument("kit::MeshLayout: " + dims_[i] + " = " +
                                  std::to_string(sizes_[i]) + ", but each size must be at least 1");
    strides_.push_back(product);
    product *= sizes_[i];
  }
  if (product != world_)
    throw std::invalid_argument("kit::MeshLayout: the sizes multiply to " + std::to_string(product) +
                                ", not the world size " + std::to_string(world_));
}

MeshLayout MeshLayout::make(int world_size, int tp, int cp, const std::string& order, int pp) {
  const std::string flags = "(tp " + std::to_string(tp) + ", cp " + std::to_string(cp) +
                            (pp != 1 ? ", pp " + std::to_string(pp) : "") + ")";
  if (tp < 1 || cp < 1 || pp < 1)
    throw std::invalid_argument(std::string(pp != 1 ? "tp, cp and pp" : "tp and cp") +
                                " must be at least 1 " + flags);
  const int model = tp * cp * pp;
  if (world_size % model != 0)
    throw std::invalid_argument(
        (pp != 1 ? "pp x tp x cp = " : "tp x cp = ") + std::to_string(model) +
        " does not divide the " + std::to_string(world_size) + " ranks " + flags +
        (pp != 1 ? ": the world must be pp x dp x cp x tp ranks" : ": the world must be dp x cp x tp ranks"));
  std::map<std::string, int> size_of = {{"tp", tp}, {"cp", cp}, {"dp", world_size / model}, {"pp", pp}};
  auto names = split_dims(order);
  // pp left out of the order is the slowest direction (Megatron's default, tp-cp-dp-pp: the
  // stages, which send least, on different nodes), or no direction when it is 1.
  if (std::find(names.begin(), names.end(), "pp") == names.end() && pp != 1) names.push_back("pp");
  std::set<std::string> seen;
  for (auto& n : names)
    if (!size_of.count(n) || !seen.insert(n).second) {
      seen.clear();
      break;
    }
  if (seen.size() != names.size() || !seen.count("tp") || !seen.count("cp") || !seen.count("dp"))
    throw std::invalid_argument("order '" + order + "' must name tp, cp and dp once each" +
                                (pp != 1 || order.find("pp") != std::string::npos
                                     ? std::string(" (and pp at most once)") : std::string()) +
                                ", joined by '-', fastest-varying first (e.g. tp-cp-dp)");
  std::vector<int> sizes;
  for (auto& n : names) sizes.push_back(size_of[n]);
  return MeshLayout(names, sizes, world_size);
}

bool MeshLayout::has(const std::string& dim) const {
  return std::find(dims_.begin(), dims_.end(), dim) != dims_.end();
}

int MeshLayout::index(const std::string& dim) const {
  for (size_t i = 0; i < dims_.size(); ++i)
    if (dims_[i] == dim) return static_cast<int>(i);
  throw std::invalid_argument("kit::MeshLayout: no direction '" + dim + "' in " + order());
}

int MeshLayout::size(const std::string& dim) const {
  return dim == "pp" && !has(dim) ? 1 : sizes_[index(dim)];
}

int MeshLayout::coord(int rank, const std::string& dim) const {
  if (dim == "pp" && !has(dim)) return 0;
  const int i = index(dim);
  return rank / strides_[i] % sizes_[i];
}

int MeshLayout::rank_at(const std::vector<int>& coords) const {
  int rank = 0;
  for (size_t i = 0; i < dims_.size(); ++i) rank += coords.at(i) * strides_[i];
  return rank;
}

std::vector<std::vector<int>> MeshLayout::groups(const std::string& dims) const {
  std::vector<bool> along(dims_.size(), false);
  for (auto& d : split_dims(dims))
    if (d != "pp" || has(d)) along[index(d)] = true;  // a pp of 1 left out: along it is alone
  // Ranks whose coordinates off `dims` agree share a group; by construction each list is sorted,
  // and the groups come in the order of their smallest rank.
  std::map<std::vector<int>, size_t> which;
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world_; ++r) {
    std::vector<int> key;
    for (size_t i = 0; i < dims_.size(); ++i)
      if (!along[i]) key.push_back(r / strides_[i] % sizes_[i]);
    auto [at, fresh] = which.emplace(key, out.size());
    if (fresh) out.emplace_back();
    out[at->second].push_back(r);
  }
  return out;
}

std::vector<int> MeshLayout::group_of(int rank, const std::string& dims) const {
  for (auto& g : groups(dims))
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  throw std::invalid_argument("kit::MeshLayout: rank " + std::to_string(rank) + " is not in the world of " +
                              std::to_string(world_));
}

std::string MeshLayout::order() const {
  std::string s;
  for (auto& d : dims_) s += (s.empty() ? "" : "-") + d;
  return s;
}

std::string MeshLayout::tp_across_nodes(int ranks_per_node) const {
  if (ranks_per_node < 1) return "";
  for (auto& g : groups("tp")) {
    const int first = g.front() / ranks_per_node, last = g.back() / ranks_per_node;
    if (first != last)
      return "the tp group " + joined(g) + " would span nodes " + std::to_string(first) + " and " +
             std::to_string(last) + " (" + std::to_string(ranks_per_node) +
             " ranks per node, placed in blocks): tensor parallelism all-reduces activations four "
             "times per block and step and needs a node's own links; put tp first in the order "
             "(tp-cp-dp) and use a tp that divides the ranks per node";
  }
  return "";
}

Mesh::Mesh(MeshOptions o, GroupRef world_ref, CallSite site)
    : layout_({"tp"}, {1}, 1), rank_(0) {
  const std::string call = "kit::Mesh (" + site.str() + ")";
  auto world = group_or_world(world_ref.get(), "kit::Mesh", &site);
  try {
    layout_ = MeshLayout::make(world->size(), o.tp, o.cp, o.order, o.pp);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(call + ": " + e.what());
  }
  rank_ = world->rank();
  int per_node = o.ranks_per_node;
  if (per_node == 0) {
    const RankEnv env = read_rank_env();
    per_node = env.launcher == "none" ? world->size() : env.local_world_size;
  }
  const std::string spans = layout_.tp_across_nodes(per_node);
  if (!spans.empty()) throw std::invalid_argument(call + ": " + spans);
  // Every rank makes every group, members or not, in one order (kit::new_group's rule).
  std::vector<std::string> made = kGroups;
  if (layout_.has("pp")) made.push_back("pp");  // the stages of one pipeline: sends and receives
  for (const auto& dims : made)
    for (const auto& ranks : layout_.groups(dims)) {
      auto g = world->new_group(ranks, site);
      if (g->is_member()) groups_.emplace_back(canonical(dims), g);
    }
  // Each rank alone: one group per rank, made by every rank in rank order (a non-member's call
  // only counts it), so that "alone" is a group of one like the others, with its own name.
  for (int r = 0; r < world->size(); ++r) {
    auto g = world->new_group({r}, site);
    if (g->is_member()) alone_ = g;
  }
  world_ = world;
  std::string coords, members;
  for (const char* d : {"tp", "cp", "dp", "pp"})
    if (layout_.has(d)) coords += std::string(d) + "=" + std::to_string(layout_.coord(rank_, d)) + "/" +
              std::to_string(layout_.size(d)) + " ";
  for (const auto& [dims, g] : groups_) {
    std::string list;
    for (int r : g->ranks()) list += (list.empty() ? "" : ",") + std::to_string(r);
    members += std::string(members.empty() ? "" : " ") + "group_" + dims + "=" + list;
  }
  observe::mesh(rank_, coords + "order=" + layout_.order(), members);
}

ProcessGroup& Mesh::group(const std::string& dims) const {
  const std::string key = canonical(dims);
  for (auto& [name, g] : groups_)
    if (name == key) return *g;
  if (key == "pp" && !layout_.has("pp")) return *alone_;  // one stage: the pipeline is this rank
  throw std::invalid_argument("kit::Mesh::group: no group '" + dims + "' (tp, cp, dp, dp-cp, tp-cp, "
                              "pp; alone() for this rank only)");
}

std::string Mesh::describe() const {
  auto one = [&](const char* d) {
    return std::string(d) + " " + std::to_string(layout_.coord(rank_, d)) + " of " +
           std::to_string(layout_.size(d));
  };
  return "rank " + std::to_string(rank_) + " of " + std::to_string(layout_.world_size()) + ": " +
         one("tp") + ", " + one("cp") + ", " + one("dp") +
         (layout_.has("pp") ? ", " + one("pp") : "") + " (order " + layout_.order() + ")";
}

}  // namespace kit
