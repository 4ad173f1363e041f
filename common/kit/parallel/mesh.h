// kit/parallel/mesh.h — Mesh: the world's ranks laid out on a grid of dp x cp x tp, and the process
// groups of each direction. The one place that owns the groups of tensor and context parallelism
// (Megatron-core's parallel_state, NERSC's comm.init_model_parallel_info).
//
//   kit::Mesh mesh({.tp = 2, .cp = 1});        // every rank, after kit::setup(); dp = the rest
//   std::printf("%s\n", mesh.describe().c_str());  // "rank 3 of 4: tp 1 of 2, cp 0 of 1, dp 1 of 2"
//   kit::ColumnParallelLinear up(d, ff, mesh.tp());           // layers split over the tp group
//   kit::DistributedDataParallel ddp(model, {.group = &mesh.dp_cp()});  // replicas of a shard
//
// The grid. Each rank has one coordinate per direction: tp (which slice of every split layer it
// holds), cp (which part of every sequence), dp (which part of the data). `order` says how the
// coordinates make the world rank, fastest-varying first, as in Megatron's RankGenerator: with
// "tp-cp-dp", rank = tp_rank + tp * (cp_rank + cp * dp_rank), so the ranks of one tp group are
// neighbours. A launcher (ddprun, Slurm's default block distribution) puts neighbouring ranks on
// one node, so "tp-cp-dp", the default, keeps each tp group inside a node: tensor parallelism
// all-reduces activations four times per block and step, the most frequent traffic of all, and
// needs the fastest links. dp, which all-reduces the gradients once per step, crosses nodes.
//
// The groups. A group along some directions holds the ranks whose other coordinates are equal:
//   tp()    the ranks that split one layer between them: every tensor-parallel collective;
//   cp()    the ranks that split one sequence: attention's all-gather of keys and values;
//   dp()    the ranks that see other data and hold the same slice of the model;
//   dp_cp() dp and cp together: the ranks that hold the same weights (cp splits the sequence, not
//           the weights), so DDP averages the gradients and the loss is averaged over them;
//   tp_cp() tp and cp together, the model-parallel group: the ranks that see the same data;
//   alone() this rank only: a layer split over it is whole (exercise 04's TODOs start from it),
//           and every operator of kit/parallel/mappings.h on it sends nothing.
// Each is a kit::new_group (kit/runtime/process_group.h) of the world, made for every rank in the
// same order at construction (every rank must construct the Mesh, with the same options): pass them
// to any collective, DDP's Options::group, the layers of kit/parallel/layers.h. The trace names
// each collective's group by its world ranks ("group=0,1"), so `kit check` can tell a tp
// all-reduce on the world from one on the tp group.
//
// Pipeline parallelism (exercise 05) adds a direction, pp: which stage of the model a rank runs.
//   pp()    the ranks of one pipeline, one per stage: the activations and their gradients go
//           from one to the next by send and receive (kit/pipeline/). dp() stays within a stage:
//           DDP averages over the replicas of one stage.
// Left out of `order`, pp is the slowest direction ("tp-cp-dp" with pp 2 is "tp-cp-dp-pp", as
// Megatron's default): the stages, which send least, go to different nodes. A pp of 1 left out of
// the order is no direction at all (the layout, its order, describe() and the trace are exercise
// 04's), and pp() is then alone().
//
// Refused, one line naming the caller's line (std::invalid_argument): tp, cp or pp below 1,
// pp x tp x cp not dividing the world size, an order that does not name each direction once, and a tp group
// that would span nodes (ranks per node from the rank environment, kit/runtime/env.h:
// LOCAL_WORLD_SIZE or Slurm's tasks per node; ranks placed on nodes in blocks, as ddprun and
// Slurm's default distribution place them). The model checks what the mesh cannot see (heads,
// widths, sequence length: kit/parallel/parallel_lm.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kit/runtime/distributed.h"  // GroupRef, new_group
#include "kit/runtime/process_group.h"

namespace kit {

struct MeshOptions {
  int tp = 1;  // tensor parallel: ranks that split each layer
  int cp = 1;  // context parallel: ranks that split each sequence
  int pp = 1;  // pipeline parallel: stages the model is cut into, one rank each
  // dp is what is left: world size / (tp x cp x pp).
  std::string order = "tp-cp-dp";  // fastest-varying direction first (see above)
  // Ranks on one node, for the check that no tp group spans two; 0: from the rank environment
  // (kit::read_rank_env().local_world_size, which is the whole world under ddprun on one node).
  int ranks_per_node = 0;
};

// The arithmetic of the grid, without any process group: which world rank sits at which
// coordinates, and which ranks form each group. Pure, for the Mesh, the tests and the checker.
class MeshLayout {
 public:
  // `dims`: the directions' names, fastest-varying first; `sizes`: theirs, whose product must be
  // `world_size`. Throws std::invalid_argument (one line) otherwise.
  MeshLayout(std::vector<std::string> dims, std::vector<int> sizes, int world_size);
  // pp x dp x cp x tp over `world_size` ranks in `order` (MeshOptions); throws as the Mesh does.
  static MeshLayout make(int world_size, int tp, int cp, const std::string& order, int pp = 1);

  int world_size() const { return world_; }
  const std::vector<std::string>& dims() const { return dims_; }
  bool has(const std::string& dim) const;          // pp: only where it was asked for
  int size(const std::string& dim) const;          // a direction's size (pp: 1 where it has none)
  int coord(int rank, const std::string& dim) const;  // a rank's coordinate along it
  int rank_at(const std::vector<int>& coords) const;  // coords in dims() order -> the world rank
  // Every group along `dims` ("tp", or several joined by '-': "dp-cp"): the lists of world ranks
  // whose other coordinates agree, each sorted, in the order of their smallest rank.
  std::vector<std::vector<int>> groups(const std::string& dims) const;
  std::vector<int> group_of(int rank, const std::string& dims) const;  // the one holding `rank`
  std::string order() const;  // "tp-cp-dp"
  // "" when every tp group lies inside one node (ranks r and r' share a node when
  // r / ranks_per_node == r' / ranks_per_node), else one line naming the first group that does not.
  std::string tp_across_nodes(int ranks_per_node) const;

 private:
  int index(const std::string& dim) const;  // position in dims_, or throws
  std::vector<std::string> dims_;
  std::vector<int> sizes_, strides_;
  int world_;
};

class Mesh {
 public:
  // Collective: every rank of `world` (default: setup()'s) constructs it, with the same options.
  // `site`: where the trainer made it, named by its errors.
  explicit Mesh(MeshOptions options = {}, GroupRef world = {}, CallSite site = {});

  const MeshLayout& layout() const { return layout_; }
  int rank() const { return rank_; }  // in the world
  int tp_size() const { return layout_.size("tp"); }
  int cp_size() const { return layout_.size("cp"); }
  int dp_size() const { return layout_.size("dp"); }
  int tp_rank() const { return layout_.coord(rank_, "tp"); }
  int cp_rank() const { return layout_.coord(rank_, "cp"); }
  int dp_rank() const { return layout_.coord(rank_, "dp"); }
  int pp_size() const { return layout_.size("pp"); }
  int pp_rank() const { return layout_.coord(rank_, "pp"); }  // this rank's stage

  ProcessGroup& tp() const { return group("tp"); }
  ProcessGroup& cp() const { return group("cp"); }
  ProcessGroup& dp() const { return group("dp"); }
  ProcessGroup& dp_cp() const { return group("dp-cp"); }
  ProcessGroup& tp_cp() const { return group("tp-cp"); }
  ProcessGroup& pp() const { return group("pp"); }
  ProcessGroup& alone() const { return *alone_; }
  ProcessGroup& world() const { return *world_; }  // the group the mesh splits
  // This rank's group along `dims`, one of those above (any order of the names: "cp-dp" too).
  ProcessGroup& group(const std::string& dims) const;

  // "rank 3 of 4: tp 1 of 2, cp 0 of 1, dp 1 of 2 (order tp-cp-dp)"
  std::string describe() const;

 private:
  MeshLayout layout_;
  int rank_;
  std::vector<std::pair<std::string, std::shared_ptr<ProcessGroup>>> groups_;  // this rank's
  std::shared_ptr<ProcessGroup> world_, alone_;
};

}  // namespace kit
