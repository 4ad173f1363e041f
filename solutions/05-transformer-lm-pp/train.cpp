// Exercise 05 — cut the model along its depth: pipeline parallelism, GPipe, 1F1B and interleaved
// 1F1B, with data parallelism over the copies of each stage.
//
// As shipped this is exercise 01's finished trainer (samplers, averaged gradients, rank-0 output,
// checkpoints) on exercise 01's model cut into chunks of blocks (kit/pipeline/stage.h), with every
// rank holding every chunk: each rank a data-parallel replica of the whole model. The TODOs make
// it a pipeline:
//   --pp N            N stages: rank s of a pipeline holds the blocks of stage s only (the first
//                     also the embedding, the last the output layer and the loss). A batch's
//                     activations go from stage to stage by send and receive, and its gradients
//                     come back the other way.
//   --micro-batches M the batch cut into M micro-batches, so that the stages work at once on
//                     different ones. While the pipe fills and drains some stages wait: the bubble,
//                     (N - 1) / (M + N - 1) of the step.
//   --schedule S      the order of each stage's forwards and backwards: gpipe (every forward, then
//                     every backward), 1f1b (a backward as soon as one can run: at most N
//                     micro-batches in flight), interleaved (--chunks V chunks per rank: a V times
//                     smaller bubble). --print-schedule shows each stage's list and its grid.
//   dp                what is left of the world: data parallelism over the copies of each stage.
// The losses must stay those of one rank (pp 1) step by step, every rank must hold its stage only,
// and each forward and backward must come in the schedule's order: `./kit check 05` judges each TODO.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>          // tensors, autograd, optimizers

#include "kit/train/args.h"             // TrainArgs, parse_args(), take_flag(): the flags
#include "kit/train/checkpoint.h"       // Checkpoints, TrainState: save, resume, stop before the time limit
#include "kit/data/data_loader.h"       // DataLoader, DistributedSampler, DistributedEvalSampler: batches
#include "kit/runtime/distributed.h"    // setup(), send/recv, isend, broadcast, all_reduce, print0()
#include "kit/train/metrics.h"          // Metrics: metrics.csv, progress lines, per-rank reports
#include "kit/models/transformer_lm.h"  // TransformerLM, lm_loss(): the model and the loss
#include "kit/parallel/mesh.h"          // Mesh: the dp x pp grid and its process groups
#include "kit/pipeline/schedule.h"      // the schedules' lists of forwards and backwards
#include "kit/pipeline/stage.h"         // whole_model(), take_chunks(): the model cut into chunks
#include "kit/train/pp_checkpoint.h"    // save_pp_checkpoint(), load_pp_checkpoint(): one file a rank
#include "kit/data/wikitext.h"          // load_wikitext2(), LanguageModelDataset: the data

using Loader = kit::DataLoader<kit::LanguageModelDataset>;

// What every step of the pipeline needs to know.
struct Pipeline {
  const kit::Mesh& mesh;
  std::vector<kit::pp::Chunk>& chunks;     // this rank's, in pipeline order
  std::vector<kit::pp::Action> schedule;   // this rank's forwards and backwards, in order
  kit::pp::Shape shape;                    // pp, chunks per rank, micro-batches
  int64_t d_model;

  kit::pp::Chunk& chunk(int index) {
    for (auto& c : chunks)
      if (c.index == index) return c;
    throw std::logic_error("chunk " + std::to_string(index) + " is not on this rank");
  }
  // The world rank that runs `chunk` in this rank's pipeline (the pp group's ranks, by stage).
  int rank_of(int chunk) const { return mesh.pp().global_rank(kit::pp::rank_of(chunk, shape)); }
  int last_rank() const { return rank_of(shape.chunks() - 1); }
  // One tag per message of a step: which chunk sent it, for which micro-batch, which way. Gloo
  // pairs a send with the receive of the same tag, whatever order the two ranks post them in.
  int tag(char kind, int chunk, int micro) const {
    return (chunk * shape.micro + micro) * 2 + (kind == 'B' ? 1 : 0);
  }
};

// One step of the pipeline over a batch. Training (`train`): each forward keeps its input and
// output for its backward, and each micro-batch's loss is weighted by its share of the batch's
// words, so that the gradients add up to those of the whole batch at once. Returns
// [loss x words, words] in double: in training the loss times 1 (the weights sum to 1), in an
// evaluation the sum over the batch's words. On every rank of the pipeline.
torch::Tensor pipeline_step(Pipeline& p, const torch::Tensor& input, const torch::Tensor& target,
                            bool train) {
  const std::vector<torch::Tensor> inputs = input.tensor_split(p.shape.micro, 0);
  const std::vector<torch::Tensor> targets = target.tensor_split(p.shape.micro, 0);
  const std::vector<kit::pp::Action>& order = p.schedule;
  for (const kit::pp::Action& a : order)
    if (a.micro >= static_cast<int>(inputs.size()) || inputs.size() != targets.size())
      throw std::runtime_error("pipeline_step: the order runs micro-batch " + std::to_string(a.micro) +
                               ", but the batch is cut into " + std::to_string(inputs.size()) +
                               " inputs and " + std::to_string(targets.size()) + " targets");
  const double words = static_cast<double>(target.numel());
  auto sum = torch::zeros({2}, torch::TensorOptions().dtype(torch::kDouble).device(input.device()));
  std::map<std::pair<int, int>, std::pair<torch::Tensor, torch::Tensor>> saved;  // input, output
  std::vector<kit::Work> sends;     // waited at the end of the step, never before the next action
  std::vector<torch::Tensor> sent;  // what they send, alive until then
  [[maybe_unused]] auto activation = [&](int micro) {  // between chunks (TODO 3): [seq, micro-batch, d_model]
    return torch::empty({input.size(1), inputs[micro].size(0), p.d_model},
                        torch::TensorOptions().device(input.device()));
  };
  for (const kit::pp::Action& a : order) {
    if (!train && a.kind == 'B') continue;
    // A short last batch may leave micro-batches empty: every stage has the same batch and skips
    // the same ones.
    if (inputs[a.micro].size(0) == 0) continue;
    kit::pp::Chunk& c = p.chunk(a.chunk);
    const std::pair<int, int> key{a.chunk, a.micro};
    if (a.kind == 'F') {
      torch::Tensor x = inputs[a.micro];  // the tokens, for the first chunk
      if (!c.first) {
        x = activation(a.micro);
        kit::recv(x, p.rank_of(a.chunk - 1), p.mesh.pp(), p.tag('F', a.chunk - 1, a.micro));
        x.requires_grad_(train);
      }
      torch::Tensor y = c.forward(x, a.micro);
      if (!c.last) {
        sent.push_back(y.detach());
        sends.push_back(kit::isend(sent.back(), p.rank_of(a.chunk + 1), p.mesh.pp(),
                                   p.tag('F', a.chunk, a.micro)));
      }
      if (c.last) {
        const auto& t = targets[a.micro];
        y = kit::lm_loss(y, t) * (static_cast<double>(t.numel()) / (train ? words : 1.0));
        sum[0] += y.detach().to(torch::kDouble);
        sum[1] += static_cast<double>(t.numel());
      }
      if (train) saved[key] = {x, y};
    } else {
      auto [x, y] = saved.at(key);
      saved.erase(key);
      torch::Tensor grad;  // undefined: y is the loss, and y.backward() starts from 1
      if (!c.last) {
        grad = torch::empty_like(y);
        kit::recv(grad, p.rank_of(a.chunk + 1), p.mesh.pp(), p.tag('B', a.chunk + 1, a.micro));
      }
      c.backward(y, grad, a.micro);
      if (!c.first) {
        sent.push_back(x.grad());
        sends.push_back(kit::isend(sent.back(), p.rank_of(a.chunk - 1), p.mesh.pp(),
                                   p.tag('B', a.chunk, a.micro)));
      }
    }
  }
  for (auto& w : sends) w.wait();
  kit::broadcast(sum, p.last_rank(), p.mesh.pp());
  return sum;
}

// The gradients of this rank's chunks averaged over `group`: what DDP does at the end of a step.
// (PyTorch's pipelining reaches into DDP's reducer to average at a stage's last backward only;
// one all-reduce after the step does the same.)
void average_gradients(std::vector<kit::pp::Chunk>& chunks, kit::ProcessGroup& group) {
  if (group.size() == 1) return;
  std::vector<torch::Tensor> grads;
  for (auto& c : chunks)
    for (auto& p : c.parameters()) grads.push_back(p.grad().reshape(-1));
  auto flat = torch::cat(grads);
  kit::all_reduce(flat, kit::ReduceOp::AVG, group);
  int64_t at = 0;
  for (auto& c : chunks)
    for (auto& p : c.parameters()) {
      p.mutable_grad().copy_(flat.narrow(0, at, p.numel()).view_as(p));
      at += p.numel();
    }
}

void set_training(std::vector<kit::pp::Chunk>& chunks, bool on) {
  for (auto& c : chunks)
    for (auto& u : c.units) u.module->train(on);
}

// One pass over the training data (or the rest of it, after a resume). Returns the mean training
// loss of the pass. Stops early, with state.stopped set, when the job is asked to stop.
torch::Tensor train_one_epoch(Pipeline& p, const Loader& loader, torch::optim::Optimizer& optimizer,
                              torch::Device device, kit::TrainState& state,
                              kit::Checkpoints& checkpoints, kit::Metrics& metrics,
                              int64_t max_steps) {
  set_training(p.chunks, true);
  auto total = state.epoch_loss_sum.defined()
                   ? state.epoch_loss_sum
                   : torch::zeros({}, torch::TensorOptions().device(device));
  const size_t first = max_steps > 0 && state.step_in_epoch >= max_steps
                           ? loader.size()
                           : static_cast<size_t>(state.step_in_epoch);
  const auto steps_per_epoch = static_cast<int64_t>(
      max_steps > 0 ? std::min<size_t>(loader.size(), max_steps) : loader.size());
  for (kit::Batch batch : loader.from(first)) {
    auto input = batch.input.to(device, /*non_blocking=*/true);
    auto target = batch.target.to(device, /*non_blocking=*/true);
    optimizer.zero_grad();
    auto loss = pipeline_step(p, input, target, /*train=*/true)[0].to(torch::kFloat);
    average_gradients(p.chunks, p.mesh.dp());  // the replicas of this stage
    optimizer.step();
    total += loss;
    state.epoch_loss_sum = total;
    ++state.step_in_epoch;
    ++state.global_step;
    metrics.step(state.epoch, loss, state.step_in_epoch, steps_per_epoch);
    if (checkpoints.stop_requested(state)) return {};  // time is up: main() saves and leaves
    if (state.step_in_epoch == max_steps) break;
  }
  // Every rank of a pipeline has its replica's loss (the broadcast of pipeline_step): the mean
  // over the world is the mean over the replicas.
  auto mean = total / static_cast<double>(state.step_in_epoch);
  kit::all_reduce(mean, kit::ReduceOp::AVG);
  return mean;
}

// The loss over a whole validation or test split: the loss summed over every predicted word,
// divided by the number of words (each replica's counted once per stage: the ratio is the same).
torch::Tensor evaluate(Pipeline& p, const Loader& loader, torch::Device device) {
  torch::NoGradGuard no_grad;
  set_training(p.chunks, false);
  auto totals = torch::zeros({2}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  for (kit::Batch batch : loader)
    totals += pipeline_step(p, batch.input.to(device), batch.target.to(device), /*train=*/false);
  kit::all_reduce(totals, kit::ReduceOp::SUM);
  return totals[0] / totals[1];
}

int main(int argc, char** argv) {
  // This exercise's flags, taken out before exercise 01's are parsed (--help lists them too).
  const int pp = static_cast<int>(kit::flag_int(
      "--pp", kit::take_flag(argc, argv, "--pp", "1", "N: stages the model is cut into (pipeline parallelism; default 1)"), 1));
  const std::string schedule_name = kit::take_flag(
      argc, argv, "--schedule", "1f1b",
      "gpipe, 1f1b or interleaved: the order of each stage's forwards and backwards (default 1f1b)");
  const int v = static_cast<int>(kit::flag_int(
      "--chunks", kit::take_flag(argc, argv, "--chunks", "1", "V: model chunks per rank, for --schedule interleaved (default 1)"), 1));
  const int micro = static_cast<int>(kit::flag_int(
      "--micro-batches", kit::take_flag(argc, argv, "--micro-batches", "4", "M: micro-batches per batch (default 4)"), 1));
  const bool print_schedule =
      kit::take_flag(argc, argv, "--print-schedule", "0", "1: print each stage's forwards and backwards and their grid, then train") == "1";
  kit::TrainArgs args = kit::parse_args(argc, argv);
  kit::pp::Schedule schedule{};
  try {
    schedule = kit::pp::parse_schedule(schedule_name);
  } catch (const std::invalid_argument& e) {
    kit::flag_error(std::string("--schedule: ") + e.what());
  }
  const kit::pp::Shape shape{.pp = pp, .v = v, .micro = micro};
  if (std::string why = kit::pp::refusal(schedule, shape); !why.empty()) kit::flag_error(why);
  if (args.batch_size % micro != 0)
    kit::flag_error("--micro-batches " + std::to_string(micro) + " does not divide --batch-size " +
                    std::to_string(args.batch_size) + ": the micro-batches must be equal");
  if (args.clip_grad > 0)  // the norm of a pipelined gradient needs every stage's squares
    kit::flag_error("--clip-grad: exercise 05 does not clip (the norm of a pipelined model's "
                    "gradient sums the squares of every stage's)");

  const kit::Setup me = kit::setup(args.seed);  // fields by name: no positional unpacking
  const int local_rank = me.local_rank, rank = me.rank, world_size = me.world_size;
  const torch::Device device = me.device;
  std::printf("rank %d of %d: local rank %d, device %s\n", rank, world_size, local_rank,
              device.str().c_str());

  kit::Mesh mesh({.pp = pp});
  std::printf("%s\n", mesh.describe().c_str());  // "rank 3 of 4: tp 0 of 1, cp 0 of 1, dp 1 of 2, pp 1 of 2 (order tp-cp-dp-pp)"

  kit::WikiText2 corpus = kit::load_wikitext2(args.data_dir);
  kit::LanguageModelDataset train_data(corpus.train, args.seq_len, "train");
  kit::LanguageModelDataset val_data(corpus.valid, args.seq_len, "valid");
  kit::LanguageModelDataset test_data(corpus.test, args.seq_len, "test");
  // One shard of the data per replica (exercise 04's lesson): the stages of a pipeline see the
  // same batches.
  kit::DistributedSampler train_sampler(train_data.size(), /*shuffle=*/true, args.seed,
                                        mesh.dp_size(), mesh.dp_rank());
  kit::DistributedEvalSampler val_sampler(val_data.size(), mesh.dp_size(), mesh.dp_rank());
  kit::DistributedEvalSampler test_sampler(test_data.size(), mesh.dp_size(), mesh.dp_rank());
  Loader train_loader(train_data, args.batch_size, train_sampler, {.pin_memory = true});
  Loader val_loader(val_data, args.eval_batch_size, val_sampler);
  Loader test_loader(test_data, args.eval_batch_size, test_sampler);

  // The whole model on every rank, from the seed: the weights of a one-rank run, without a
  // broadcast. Then each rank keeps its chunks.
  const kit::TransformerLMOptions options = kit::lm_options(args, corpus.vocab.size());
  kit::TransformerLM model = kit::pp::whole_model(options, args.seed);
  kit::print0("pipeline: %s\n", kit::pp::describe_split(static_cast<int>(options.layers), pp * v).c_str());
  auto chunks = kit::pp::take_chunks(model, mesh.pp_size(), v, mesh.pp_rank());
  model->to(device);
  std::vector<torch::Tensor> params;
  for (auto& c : chunks)
    for (auto& p : c.parameters()) params.push_back(p);
  // What this rank holds, on every rank: the check compares it with the split.
  std::string held;
  for (auto& c : chunks) held += (held.empty() ? "" : ",") + std::to_string(c.index);
  std::printf("rank %d holds chunks %s: %lld parameters\n", rank, held.c_str(),
              static_cast<long long>(std::accumulate(params.begin(), params.end(), int64_t{0},
                                                     [](int64_t n, const torch::Tensor& t) { return n + t.numel(); })));
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(args.lr));

  Pipeline pipe{mesh, chunks, kit::pp::actions(schedule, shape, mesh.pp_rank()), shape,
                options.d_model};
  if (std::string w = kit::pp::few_micro_batches_warning(shape); !w.empty()) kit::print0("%s\n", w.c_str());
  if (print_schedule && rank == 0) {
    const auto lists = kit::pp::all_actions(schedule, shape);
    for (int s = 0; s < pp; ++s) {
      std::printf("stage %d:", s);
      for (const auto& a : lists[s]) std::printf(" %s", kit::pp::to_string(a).c_str());
      std::printf("\n");
    }
    std::printf("%s", kit::pp::format(kit::pp::simulate(lists, shape, 1, 1)).c_str());
  }

  // A checkpoint belongs to one split: another pp or chunks per rank is refused (one line).
  kit::Checkpoints checkpoints(args.out_dir,
                               kit::config_fingerprint(args, corpus.vocab.size()) + " pp " +
                                   std::to_string(pp) + " chunks " + std::to_string(v),
                               args.keep_checkpoints);
  auto save_checkpoint = [&](kit::TrainState& s) {  // every rank saves the chunks it holds
    checkpoints.save_sharded(
        [&](const std::string& dir) { kit::save_pp_checkpoint(dir, mesh, chunks, optimizer); }, s);
  };
  kit::TrainState state = checkpoints.resume_sharded(
      [&](const std::string& dir) { kit::load_pp_checkpoint(dir, mesh, chunks, optimizer); },
      device, args.resume);
  kit::Metrics metrics(args.out_dir, args.batch_size, device, state.global_step);
  // Its samples/s count each batch once: the stages of one pipeline (TODO 1) share theirs.
  metrics.data_ranks(mesh.dp_size());

  while (state.epoch < args.epochs) {
    const int64_t epoch = state.epoch;
    train_sampler.set_epoch(epoch);
    torch::Tensor train_mean = train_one_epoch(pipe, train_loader, optimizer, device, state,
                                               checkpoints, metrics, args.max_steps);
    if (state.stopped) break;
    metrics.end_epoch(epoch);
    double train_loss = train_mean.item<double>();
    double val_loss = evaluate(pipe, val_loader, device).item<double>();
    kit::print0("[%ld/%ld] train loss %.5f, validation loss %.5f (perplexity %.2f)\n", epoch + 1,
                args.epochs, train_loss, val_loss, std::exp(val_loss));
    state.next_epoch();
    save_checkpoint(state);
  }

  if (state.stopped) {
    save_checkpoint(state);  // mid-epoch: the next run continues from here
  } else {
    double test_loss = evaluate(pipe, test_loader, device).item<double>();
    kit::print0("final test loss %.5f (perplexity %.2f)\n", test_loss, std::exp(test_loss));
  }
  kit::destroy_process_group();
  return 0;
}
