// Exercise 04 — split the model itself: tensor and context parallelism, Megatron-style, on a
// dp x cp x tp mesh of ranks.
//
// As shipped this is exercise 01's finished trainer (samplers, DDP, averaged losses, rank-0
// output, checkpoints) on kit::ParallelTransformerLM, exercise 01's model whose blocks can be
// split: with every rank a data-parallel replica that holds the whole model. The TODOs split it,
// as Megatron-LM does:
//   --tp N     tensor parallelism: N ranks share each block. The MLP's first linear layer is split
//              by its output features (column-parallel), its second by its input features (row-
//              parallel); attention by its heads. Each rank holds 1/N of every block's weights, and
//              the N ranks add up their partial results with all-reduces, two per block in the
//              forward pass and two in the backward pass.
//   --cp N     context parallelism: N ranks share each sequence; attention all-gathers the keys
//              and values of every position. The weights stay whole on each of them.
//   dp         what is left of the world: data parallelism over the copies of one shard.
//   --order    how the world's ranks are laid out on that grid (default tp-cp-dp: the ranks of a
//              tp group are neighbours, so a launcher puts them on one node).
// The losses must stay those of one rank (tp 1) step by step, while every rank holds its share of
// the weights, and every collective goes to its group: `./kit check 04` judges each TODO.
// Wider model: --size wide (see --help); KIT_MEMORY_CAP=<bytes> caps each rank's memory as a GPU
// would (exercise 04's page: a size that runs out of memory at tp 1 and fits at tp 4).
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>

#include <torch/torch.h>          // tensors, autograd, optimizers

#include "kit/train/args.h"             // TrainArgs, parse_args(), take_flag(): the flags
#include "kit/train/checkpoint.h"       // Checkpoints, TrainState: save, resume, stop before the time limit
#include "kit/data/data_loader.h"       // DataLoader, DistributedSampler, DistributedEvalSampler: batches
#include "kit/ddp/ddp.h"                // DistributedDataParallel: the replicas of a shard stay identical
#include "kit/runtime/distributed.h"    // setup(), all_reduce(), print0(), save0(), destroy_process_group()
#include "kit/train/metrics.h"          // Metrics: metrics.csv, progress lines, per-rank reports
#include "kit/models/transformer_lm.h"  // TransformerLM, lm_loss(): the tp = 1 model and the loss
#include "kit/parallel/context.h"       // cp_shard(): this rank's part of every sequence
#include "kit/parallel/mesh.h"          // Mesh: the dp x cp x tp grid and its process groups
#include "kit/parallel/parallel_lm.h"   // ParallelTransformerLM, ColumnParallelLinear, RowParallelLinear
#include "kit/train/tp_checkpoint.h"    // save_tp_checkpoint(), load_tp_checkpoint(): one file a rank
#include "kit/data/wikitext.h"          // load_wikitext2(), LanguageModelDataset: the data

using Loader = kit::DataLoader<kit::LanguageModelDataset>;
// The training forward, input -> logits: in Python, `model(x)` (main() says which one it is).
using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

// One pass over the training data (or the rest of it, after a resume). Returns the mean training
// loss of the pass. Stops early, with state.stopped set, when the job is asked to stop.
torch::Tensor train_one_epoch(kit::ParallelTransformerLM& model, const Forward& forward,
                              const Loader& loader, const kit::Mesh& mesh,
                              torch::optim::Optimizer& optimizer, torch::Device device,
                              kit::TrainState& state, kit::Checkpoints& checkpoints,
                              kit::Metrics& metrics, int64_t max_steps) {
  model->train();
  auto total = state.epoch_loss_sum.defined()
                   ? state.epoch_loss_sum
                   : torch::zeros({}, torch::TensorOptions().device(device));
  const size_t first = max_steps > 0 && state.step_in_epoch >= max_steps
                           ? loader.size()
                           : static_cast<size_t>(state.step_in_epoch);
  const auto steps_per_epoch = static_cast<int64_t>(
      max_steps > 0 ? std::min<size_t>(loader.size(), max_steps) : loader.size());
  for (kit::Batch batch : loader.from(first)) {
    // The loader pinned the batch (main()): non_blocking queues the copy behind the GPU's work.
    auto input = batch.input.to(device, /*non_blocking=*/true);
    auto target = batch.target.to(device, /*non_blocking=*/true);
    // TODO 7: Context parallelism: the ranks of a cp group share every sequence. Give the model only
    //         this rank's part of each sequence (kit::cp_shard along the sequence's dimension, 1; it
    //         reads the mesh's cp size and rank), and the same part of the targets. Attention then
    //         all-gathers the keys and values of the other parts over the cp group. Two places: here
    //         and in evaluate().
    optimizer.zero_grad();
    auto loss = kit::lm_loss(forward(input), target);
    loss.backward();
    optimizer.step();
    total += loss.detach();
    state.epoch_loss_sum = total;
    ++state.step_in_epoch;
    ++state.global_step;
    metrics.step(state.epoch, loss, state.step_in_epoch, steps_per_epoch);
    if (checkpoints.stop_requested(state)) return {};  // time is up: main() saves and leaves
    if (state.step_in_epoch == max_steps) break;
  }
  auto mean = total / static_cast<double>(state.step_in_epoch);
  // TODO 6: `mean` is this rank's loss over its batches and its part of each sequence. Which ranks
  //         hold a different part of the loss? Those of other data (dp) and other positions (cp); the
  //         ranks of a tp group hold copies of the same number. Average over mesh.dp_cp() only (the
  //         collectives of kit/runtime/distributed.h take a group as their last argument): over the
  //         world every loss would count tp times. The same group in evaluate().
  kit::all_reduce(mean, kit::ReduceOp::AVG);  // over the world
  return mean;
}

// The loss over a whole validation or test split, without training: the loss summed over every
// predicted word, divided by the number of words, both added up over the ranks.
torch::Tensor evaluate(kit::ParallelTransformerLM& model, const Loader& loader,
                       const kit::Mesh& mesh, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto options = torch::TensorOptions().dtype(torch::kDouble).device(device);
  auto loss_sum = torch::zeros({}, options), words = torch::zeros({}, options);
  for (kit::Batch batch : loader) {
    auto input = batch.input.to(device), target = batch.target.to(device);
    // TODO 7: (second place) the evaluation's sequences are shared the same way.
    auto loss = kit::lm_loss(model->forward(input), target);  // per-word mean of this rank's part
    loss_sum += loss.to(torch::kDouble) * target.numel();
    words += target.numel();
  }
  auto totals = torch::stack({loss_sum, words});
  // TODO 6: (second place) the sums and counts: added up over the same group.
  kit::all_reduce(totals, kit::ReduceOp::SUM);
  return totals[0] / totals[1];
}

// The parameters this rank holds, by part of the model (their names say which).
struct Held {
  int64_t attention = 0, mlp = 0, rest = 0;
};
Held held_by(kit::ParallelTransformerLM& model) {
  Held h;
  for (auto& p : model->named_parameters()) {
    const std::string& name = p.key();
    int64_t& part = name.find(".attention.") != std::string::npos ? h.attention
                    : name.find(".mlp.") != std::string::npos     ? h.mlp
                                                                  : h.rest;
    part += p.value().numel();
  }
  return h;
}

int main(int argc, char** argv) {
  // This exercise's flags, taken out before exercise 01's are parsed (--help lists them too).
  const int tp = static_cast<int>(kit::flag_int(
      "--tp", kit::take_flag(argc, argv, "--tp", "1", "N: ranks that split each block (tensor parallelism; default 1)"), 1));
  const int cp = static_cast<int>(kit::flag_int(
      "--cp", kit::take_flag(argc, argv, "--cp", "1", "N: ranks that split each sequence (context parallelism; default 1)"), 1));
  const std::string order = kit::take_flag(
      argc, argv, "--order", "tp-cp-dp",
      "the mesh's directions, fastest-varying first: tp-cp-dp (default: a tp group on one node)");
  const std::string size = kit::take_flag(
      argc, argv, "--size", "small",
      "small: the model of --d-model, --heads, --layers, --feedforward; wide: d-model 512, "
      "8 heads, 6 layers, feedforward 2048, where tensor parallelism matters");
  kit::TrainArgs args = kit::parse_args(argc, argv);
  if (size == "wide") {
    args.d_model = 512;
    args.heads = 8;
    args.layers = 6;
    args.feedforward = 2048;
  } else if (size != "small") {
    kit::flag_error("--size must be small or wide, not '" + size + "'");
  }
  if (args.clip_grad > 0)  // the norm of a split gradient needs its shards' squares summed over tp
    kit::flag_error("--clip-grad: exercise 04 does not clip (the global norm of a tensor-parallel "
                    "gradient is not clip_grad_norm_ of one rank's shards)");

  const kit::Setup me = kit::setup(args.seed);  // fields by name: no positional unpacking
  const int local_rank = me.local_rank, rank = me.rank, world_size = me.world_size;
  const torch::Device device = me.device;
  std::printf("rank %d of %d: local rank %d, device %s\n", rank, world_size, local_rank,
              device.str().c_str());

  // TODO 1: Lay the world out on a grid of dp x cp x tp ranks: a kit::Mesh with the flags' tp, cp
  //         and order (MeshOptions; dp is what is left). Every rank makes it, and it makes the
  //         groups of each direction: mesh.tp(), mesh.cp(), mesh.dp_cp(), ... Then print, on every
  //         rank, with std::printf, where this rank sits: mesh.describe(), one line. (As shipped
  //         the mesh is tp 1 and cp 1: every rank is a data-parallel replica.)
  kit::Mesh mesh({});

  kit::WikiText2 corpus = kit::load_wikitext2(args.data_dir);
  kit::LanguageModelDataset train_data(corpus.train, args.seq_len, "train");
  kit::LanguageModelDataset val_data(corpus.valid, args.seq_len, "valid");
  kit::LanguageModelDataset test_data(corpus.test, args.seq_len, "test");

  // TODO 2: Which ranks must read different data? Only the replicas of the model: the ranks of one
  //         tp group compute one model together and need the same batch, and so do those of a cp
  //         group (each takes its part of the same sequences). Give each sampler the number of
  //         data-parallel replicas and this rank's dp coordinate (mesh.dp_size(), mesh.dp_rank(): the
  //         samplers' num_replicas and rank) in place of the world's.
  kit::DistributedSampler train_sampler(train_data, /*shuffle=*/true, args.seed);
  kit::DistributedEvalSampler val_sampler(val_data);
  kit::DistributedEvalSampler test_sampler(test_data);
  // Training batches in pinned memory, for the non_blocking copy of train_one_epoch (on a GPU).
  Loader train_loader(train_data, args.batch_size, train_sampler, {.pin_memory = true});
  Loader val_loader(val_data, args.eval_batch_size, val_sampler);
  Loader test_loader(test_data, args.eval_batch_size, test_sampler);

  // How each block is split. The model calls these with the tp = 1 block's layers (their
  // weights come from TransformerLM's initialisation with args.seed, the same on every rank), and
  // keeps the layers they make. As shipped, both parts are made on mesh.alone(), a group of this
  // rank only: every rank holds and computes the whole block.
  const kit::TransformerLMOptions options = kit::lm_options(args, corpus.vocab.size());
  kit::ParallelLMOptions parallel{.seed = args.seed};
  // TODO 3: The MLP, Megatron's way: linear1 column-parallel (its rows, the hidden features, split
  //         over the tp ranks: each computes its slice of the hidden layer, ReLU included) and
  //         linear2 row-parallel (its columns split: each multiplies its slice and the partial sums
  //         are all-reduced). The hidden layer never leaves its rank: one all-reduce forward ("g",
  //         after linear2), one backward ("f", before linear1). Make both layers over the tp group.
  parallel.mlp = [&](const torch::nn::Linear& linear1, const torch::nn::Linear& linear2) {
    return kit::ColumnRow{kit::ColumnParallelLinear(linear1, mesh.alone()),
                          kit::RowParallelLinear(linear2, mesh.alone())};
  };
  // TODO 4: Attention: the heads are independent, so each tp rank computes heads / tp of them whole.
  //         q, k and v come from one layer, in_proj_weight [3 d, d]: q's rows, then k's, then v's.
  //         Split it column-parallel so that each rank keeps its heads' rows of EACH of the three
  //         (ColumnParallelOptions{.stacked = 3}); the output projection row-parallel, its columns
  //         being those heads. Both over the tp group.
  parallel.attention = [&](const torch::nn::MultiheadAttention& full) {
    return kit::ColumnRow{kit::ColumnParallelLinear(full->in_proj_weight, full->in_proj_bias, mesh.alone()),
                          kit::RowParallelLinear(full->out_proj, mesh.alone())};
  };
  kit::ParallelTransformerLM model(options, mesh, parallel);
  model->to(device);
  // What this rank holds, on every rank: the check compares it with the formula.
  const Held held = held_by(model);
  std::printf("rank %d holds %lld parameters: attention %lld, mlp %lld, the rest %lld\n", rank,
              static_cast<long long>(held.attention + held.mlp + held.rest),
              static_cast<long long>(held.attention), static_cast<long long>(held.mlp),
              static_cast<long long>(held.rest));

  // TODO 5: DDP averages the gradients of ranks that hold the same weights. Which are they? Not the
  //         ranks of a tp group: they hold different slices (DDP would also overwrite every rank's
  //         slices with rank 0's at construction). They are the ranks of other data and of other
  //         positions: give DDP the group mesh.dp_cp() (its Options' .group).
  kit::DistributedDataParallel ddp(model);  // over the world
  Forward forward = [&](const torch::Tensor& x) { return ddp.forward(x); };  // its backward averages
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(args.lr));

  // A checkpoint belongs to one mesh: another tp, cp or order is refused (one line).
  kit::Checkpoints checkpoints(args.out_dir,
                               kit::config_fingerprint(args, corpus.vocab.size()) + " tp " +
                                   std::to_string(tp) + " cp " + std::to_string(cp) + " order " + order,
                               args.keep_checkpoints);
  auto save_checkpoint = [&](kit::TrainState& s) {
    // TODO 8: Checkpoints: under DDP rank 0 holds everything and writes it alone. Here rank 0 holds
    //         only its slices, and a resume would hand them to every rank. Every rank must save what
    //         it holds (kit::save_tp_checkpoint: its slices, its AdamW state, its dropout streams),
    //         with checkpoints.save_sharded, and read it back in its resume below (resume_sharded
    //         with kit::load_tp_checkpoint). Each takes a function of the folder to write or read.
    checkpoints.save(model, optimizer, s);  // rank 0 writes its model and optimizer
  };
  // TODO 8: (second place) every rank reads back its own file.
  kit::TrainState state = checkpoints.resume(model, optimizer, device, args.resume);
  // The model's file: the whole tp = 1 model, gathered over tp (a collective: every rank calls
  // it), in exercise 01's format, written by rank 0.
  auto save_model = [&](const std::string& path) {
    kit::TransformerLM whole(options);
    model->gather_into(whole);
    kit::save0(whole, path);
  };
  kit::Metrics metrics(args.out_dir, args.batch_size, device, state.global_step);
  // Its samples/s count each batch once: the tp x cp ranks of one copy of the model (TODO 1)
  // share theirs.
  metrics.data_ranks(mesh.dp_size());

  while (state.epoch < args.epochs) {
    const int64_t epoch = state.epoch;
    train_sampler.set_epoch(epoch);
    torch::Tensor train_mean = train_one_epoch(model, forward, train_loader, mesh, optimizer,
                                               device, state, checkpoints, metrics, args.max_steps);
    if (state.stopped) break;
    metrics.end_epoch(epoch);
    double train_loss = train_mean.item<double>();
    double val_loss = evaluate(model, val_loader, mesh, device).item<double>();
    kit::print0("[%ld/%ld] train loss %.5f, validation loss %.5f (perplexity %.2f)\n", epoch + 1,
                args.epochs, train_loss, val_loss, std::exp(val_loss));
    if (val_loss < state.best_val_loss) {
      state.best_val_loss = val_loss;
      save_model(args.out_dir + "/model-best.pt");
    }
    state.next_epoch();
    save_checkpoint(state);
  }

  if (state.stopped) {
    save_checkpoint(state);  // mid-epoch: the next run continues from here
  } else {
    double test_loss = evaluate(model, test_loader, mesh, device).item<double>();
    kit::print0("final test loss %.5f (perplexity %.2f)\n", test_loss, std::exp(test_loss));
    save_model(args.out_dir + "/model-final.pt");
  }
  // TODO 9: Leave the job cleanly: kit::destroy_process_group() closes the world and every group
  //         made from it, the mesh's too.
  return 0;
}
