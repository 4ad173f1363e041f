// Exercise 05 — cut the model along its depth: pipeline parallelism (GPipe, 1F1B, interleaved
// 1F1B), with data parallelism over the copies of each stage.
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "kit/data/data_loader.h"
#include "kit/data/wikitext.h"
#include "kit/models/transformer_lm.h"
#include "kit/parallel/mesh.h"
#include "kit/pipeline/schedule.h"
#include "kit/pipeline/stage.h"
#include "kit/runtime/distributed.h"
#include "kit/train/args.h"
#include "kit/train/checkpoint.h"
#include "kit/train/metrics.h"

using Loader = kit::DataLoader<kit::LanguageModelDataset>;

// What every step of the pipeline needs to know.
struct Pipeline {
  const kit::Mesh& mesh;
  std::vector<kit::pp::Chunk>& chunks;     // this rank's, in pipeline order
  std::vector<kit::pp::Action> actions;    // this rank's, in the schedule's order
  kit::pp::Shape shape;
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

// One step of the pipeline over a batch: the batch cut into micro-batches, then this rank's
// actions in the schedule's order. Training (`train`): each forward keeps its input and output
// for its backward, each micro-batch's loss is weighted by its share of the batch's words, so
// that the gradients add up to those of the whole batch at once. Returns the batch's loss on
// every rank of the pipeline (the last stage computes it and broadcasts it): the mean per word in
// training, [sum over the words, words] in double for an evaluation.
torch::Tensor pipeline_step(Pipeline& p, const torch::Tensor& input, const torch::Tensor& target,
                            bool train) {
  const auto inputs = input.tensor_split(p.shape.micro, 0);
  const auto targets = target.tensor_split(p.shape.micro, 0);
  const double words = static_cast<double>(target.numel());
  const auto device = input.device();
  auto sum = torch::zeros({2}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  std::map<std::pair<int, int>, std::pair<torch::Tensor, torch::Tensor>> saved;  // input, output
  std::vector<kit::Work> sends;  // waited at the end of the step: never before the next action
  std::vector<torch::Tensor> sent;
  auto activation = [&](int micro) {  // what travels between chunks: [seq, micro-batch, d_model]
    return torch::empty({input.size(1), inputs[micro].size(0), p.d_model},
                        torch::TensorOptions().device(device));
  };
  for (const kit::pp::Action& a : p.actions) {
    if (!train && a.kind == 'B') continue;
    // A short last batch may leave micro-batches empty: every stage of the pipeline has the same
    // batch and skips the same ones.
    if (inputs[a.micro].size(0) == 0) continue;
    kit::pp::Chunk& c = p.chunk(a.chunk);
    const std::pair<int, int> key{a.chunk, a.micro};
    if (a.kind == 'F') {
      torch::Tensor x = inputs[a.micro];
      if (!c.first) {
        x = activation(a.micro);
        kit::recv(x, p.rank_of(a.chunk - 1), p.mesh.pp(), p.tag('F', a.chunk - 1, a.micro));
        x.requires_grad_(train);
      }
      torch::Tensor y = c.forward(x);
      if (c.last) {
        const auto& t = targets[a.micro];
        y = kit::lm_loss(y, t) * (static_cast<double>(t.numel()) / (train ? words : 1.0));
        sum[0] += y.detach().to(torch::kDouble);
        sum[1] += static_cast<double>(t.numel());
      } else {
        sent.push_back(y.detach());
        sends.push_back(kit::isend(sent.back(), p.rank_of(a.chunk + 1), p.mesh.pp(),
                                   p.tag('F', a.chunk, a.micro)));
      }
      if (train) saved[key] = {x, y};
    } else {
      auto [x, y] = saved.at(key);
      saved.erase(key);
      if (c.last) {
        y.backward();
      } else {
        auto grad = torch::empty_like(y);
        kit::recv(grad, p.rank_of(a.chunk + 1), p.mesh.pp(), p.tag('B', a.chunk + 1, a.micro));
        y.backward(grad);
      }
      if (!c.first) {
        sent.push_back(x.grad());
        sends.push_back(kit::isend(sent.back(), p.rank_of(a.chunk - 1), p.mesh.pp(),
                                   p.tag('B', a.chunk, a.micro)));
      }
    }
  }
  for (auto& w : sends) w.wait();
  kit::broadcast(sum, p.last_rank(), p.mesh.pp());  // the loss, from the last stage to the others
  return train ? sum[0].to(torch::kFloat) : sum;
}

// The gradients of this rank's chunks averaged over the replicas of its stage (mesh.dp()).
void average_gradients(std::vector<kit::pp::Chunk>& chunks, const kit::Mesh& mesh) {
  if (mesh.dp_size() == 1) return;
  std::vector<torch::Tensor> grads;
  for (auto& c : chunks)
    for (auto& p : c.parameters()) grads.push_back(p.grad().reshape(-1));
  auto flat = torch::cat(grads);
  kit::all_reduce(flat, kit::ReduceOp::AVG, mesh.dp());
  int64_t at = 0;
  for (auto& c : chunks)
    for (auto& p : c.parameters()) {
      p.mutable_grad().copy_(flat.narrow(0, at, p.numel()).view_as(p));
      at += p.numel();
    }
}

torch::Tensor train_one_epoch(Pipeline& p, const Loader& loader, torch::optim::Optimizer& optimizer,
                              torch::Device device, kit::TrainState& state,
                              kit::Checkpoints& checkpoints, kit::Metrics& metrics,
                              int64_t max_steps) {
  for (auto& c : p.chunks)
    for (auto& u : c.units) u.module->train();
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
    auto loss = pipeline_step(p, input, target, /*train=*/true);
    average_gradients(p.chunks, p.mesh);
    optimizer.step();
    total += loss;
    state.epoch_loss_sum = total;
    ++state.step_in_epoch;
    ++state.global_step;
    metrics.step(state.epoch, loss, state.step_in_epoch, steps_per_epoch);
    if (checkpoints.stop_requested(state)) return {};
    if (state.step_in_epoch == max_steps) break;
  }
  auto mean = total / static_cast<double>(state.step_in_epoch);
  kit::all_reduce(mean, kit::ReduceOp::AVG, p.mesh.dp());
  return mean;
}

torch::Tensor evaluate(Pipeline& p, const Loader& loader, torch::Device device) {
  torch::NoGradGuard no_grad;
  for (auto& c : p.chunks)
    for (auto& u : c.units) u.module->eval();
  auto totals = torch::zeros({2}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  for (kit::Batch batch : loader)
    totals += pipeline_step(p, batch.input.to(device), batch.target.to(device), /*train=*/false);
  kit::all_reduce(totals, kit::ReduceOp::SUM, p.mesh.dp());
  return totals[0] / totals[1];
}

int main(int argc, char** argv) {
  const int pp = static_cast<int>(kit::flag_int(
      "--pp", kit::take_flag(argc, argv, "--pp", "1", "N: pipeline stages the model is cut into (default 1)"), 1));
  const std::string schedule_name = kit::take_flag(
      argc, argv, "--schedule", "1f1b", "gpipe, 1f1b or interleaved: the order of the forwards and backwards (default 1f1b)");
  const int v = static_cast<int>(kit::flag_int(
      "--chunks", kit::take_flag(argc, argv, "--chunks", "1", "V: model chunks per rank, for --schedule interleaved (default 1)"), 1));
  const int micro = static_cast<int>(kit::flag_int(
      "--micro-batches", kit::take_flag(argc, argv, "--micro-batches", "4", "M: micro-batches per batch (default 4)"), 1));
  const bool print_schedule = kit::take_flag(argc, argv, "--print-schedule", "", "print each rank's actions and the schedule's grid, then train") == "1";
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
                    std::to_string(args.batch_size) + ": every micro-batch must be as large");
  if (args.clip_grad > 0)
    kit::flag_error("--clip-grad: exercise 05 does not clip (the norm of a pipelined model's "
                    "gradient sums every stage's squares)");

  const kit::Setup me = kit::setup(args.seed);
  const torch::Device device = me.device;
  std::printf("rank %d of %d: local rank %d, device %s\n", me.rank, me.world_size, me.local_rank,
              device.str().c_str());
  kit::Mesh mesh({.pp = pp});
  std::printf("%s\n", mesh.describe().c_str());

  kit::WikiText2 corpus = kit::load_wikitext2(args.data_dir);
  kit::LanguageModelDataset train_data(corpus.train, args.seq_len, "train");
  kit::LanguageModelDataset val_data(corpus.valid, args.seq_len, "valid");
  kit::LanguageModelDataset test_data(corpus.test, args.seq_len, "test");
  kit::DistributedSampler train_sampler(train_data.size(), /*shuffle=*/true, args.seed,
                                        mesh.dp_size(), mesh.dp_rank());
  kit::DistributedEvalSampler val_sampler(val_data.size(), mesh.dp_size(), mesh.dp_rank());
  kit::DistributedEvalSampler test_sampler(test_data.size(), mesh.dp_size(), mesh.dp_rank());
  Loader train_loader(train_data, args.batch_size, train_sampler, {.pin_memory = true});
  Loader val_loader(val_data, args.eval_batch_size, val_sampler);
  Loader test_loader(test_data, args.eval_batch_size, test_sampler);

  const kit::TransformerLMOptions options = kit::lm_options(args, corpus.vocab.size());
  kit::TransformerLM model = kit::pp::whole_model(options, args.seed);  // the same on every rank
  kit::print0("pipeline: %s\n", kit::pp::describe_split(static_cast<int>(options.layers), pp * v).c_str());
  auto chunks = kit::pp::take_chunks(model, pp, v, mesh.pp_rank());
  model->to(device);
  std::vector<torch::Tensor> params;
  for (auto& c : chunks)
    for (auto& p : c.parameters()) params.push_back(p);
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(args.lr));

  Pipeline pipe{mesh, chunks, kit::pp::actions(schedule, shape, mesh.pp_rank()), shape, options.d_model};
  if (std::string w = kit::pp::few_micro_batches_warning(shape); !w.empty()) kit::print0("%s\n", w.c_str());
  if (print_schedule && me.rank == 0) {
    const auto lists = kit::pp::all_actions(schedule, shape);
    for (int r = 0; r < pp; ++r) {
      std::printf("stage %d:", r);
      for (const auto& a : lists[r]) std::printf(" %s", kit::pp::to_string(a).c_str());
      std::printf("\n");
    }
    std::printf("%s", kit::pp::format(kit::pp::simulate(lists, shape, 1, 1)).c_str());
  }

  kit::Checkpoints checkpoints(args.out_dir,
                               kit::config_fingerprint(args, corpus.vocab.size()) + " pp " +
                                   std::to_string(pp) + " chunks " + std::to_string(v),
                               args.keep_checkpoints);
  kit::TrainState state;  // checkpoints of a pipeline: not yet
  kit::Metrics metrics(args.out_dir, args.batch_size, device, state.global_step);

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
  }
  if (!state.stopped) {
    double test_loss = evaluate(pipe, test_loader, device).item<double>();
    kit::print0("final test loss %.5f (perplexity %.2f)\n", test_loss, std::exp(test_loss));
  }
  kit::destroy_process_group();
  return 0;
}
