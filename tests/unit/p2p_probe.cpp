// p2p_probe — send and receive between ranks (kit/runtime/distributed.h: kit::send, recv, isend,
// irecv, batch_isend_irecv) in a job of processes, for tests/unit/p2p_test.cpp. Start it under
// ddprun; every rank prints "rank R pid P" after setup(), and a line per finding:
//
//   exchange    (2 or 4 ranks) a ring of isend + recv, a blocking send and a receive into a
//               strided tensor, a batch in which every rank sends to and receives from its
//               neighbours at once, two tags received in the other order, and (4 ranks) a send on
//               group {1, 3}. Tensors on the rank's device (fakegpu under KIT_DEVICE_CHECK=nccl).
//               Prints "exchange rank R: ok", or "exchange rank R: FAIL what" for each wrong value.
//   facing      (2 ranks) both ranks send to each other with a blocking send first: a deadlock.
//   unmatched   (2 ranks) rank 0 sends twice, rank 1 receives once and goes on to a barrier.
//   bad WHAT    one bad call, which must end the rank with one line naming this file: peer (rank
//               5 of 2), self, outside (a peer outside the group), tag (-1), tag_high (2^30),
//               host (a CPU tensor under KIT_DEVICE_CHECK=nccl); shape and dtype (run them with
//               KIT_DEBUG_COLLECTIVES=1: rank 1 receives [3, 2] for [2, 3], or 2 doubles for 4
//               floats: the same bytes, so without the check the values arrive wrong, silently).
#include <unistd.h>

#include <cstdio>
#include <string>

#include <torch/torch.h>

#include "kit/runtime/distributed.h"

namespace {

int g_failures = 0;
void expect(bool ok, int rank, const std::string& what) {
  if (ok) return;
  std::printf("exchange rank %d: FAIL %s\n", rank, what.c_str());
  ++g_failures;
}

// Rank r's message: 6 values that name it.
torch::Tensor of_rank(int r, const torch::Device& device) {
  return (torch::arange(6, torch::kFloat) + 10.0f * r).view({2, 3}).to(device);
}

int exchange(const kit::Setup& me) {
  const int r = me.rank, n = me.world_size;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const auto on = torch::TensorOptions().device(me.device);

  // A ring: each rank's isend to the next, then its blocking recv from the previous.
  auto out = of_rank(r, me.device);
  auto in = torch::zeros({2, 3}, on);
  kit::Work sent = kit::isend(out, next);
  kit::recv(in, prev);
  sent.wait();
  expect(torch::equal(in.cpu(), of_rank(prev, torch::kCPU)), r, "ring");

  // Ranks 0 and 1: a blocking send, received into a strided tensor (a transposed view); then
  // back, in float64.
  if (r == 0) {
    kit::send(of_rank(0, me.device).t().contiguous(), 1);
    auto back = torch::zeros({4}, on.dtype(torch::kDouble));
    kit::recv(back, 1);
    expect(torch::equal(back.cpu(), torch::tensor({1.5, 2.5, 3.5, 4.5}, torch::kDouble)), r, "back");
  } else if (r == 1) {
    auto buffer = torch::zeros({2, 3}, on);
    auto strided = buffer.t();  // [3, 2], not contiguous
    kit::recv(strided, 0);
    expect(torch::equal(buffer.cpu(), of_rank(0, torch::kCPU)), r, "strided");
    kit::send(torch::tensor({1.5, 2.5, 3.5, 4.5}, torch::kDouble).to(me.device), 0);
  }

  // Every rank sends to both neighbours and receives from both at once, in one batch (the
  // pipeline's "send the activation, receive the gradient"): no order can deadlock it. On two
  // ranks next == prev: the tags tell the two messages apart (on NCCL the order does).
  if (n > 1) {
    auto from_prev = torch::zeros({2, 3}, on), from_next = torch::zeros({2, 3}, on);
    kit::batch_isend_irecv({{kit::ProcessGroup::P2POp::kSend, of_rank(r, me.device), next, 1},
                            {kit::ProcessGroup::P2POp::kSend, of_rank(r, me.device) * -1, prev, 2},
                            {kit::ProcessGroup::P2POp::kRecv, from_prev, prev, 1},
                            {kit::ProcessGroup::P2POp::kRecv, from_next, next, 2}})
        .wait();
    expect(torch::equal(from_prev.cpu(), of_rank(prev, torch::kCPU)), r, "batch from prev");
    expect(torch::equal(from_next.cpu(), -of_rank(next, torch::kCPU)), r, "batch from next");
  }

  // Tags pair messages on Gloo: rank 0 sends tag 7 then tag 8, rank 1 receives 8 first.
  if (me.device.type() != torch::kCUDA) {  // NCCL ignores tags, as in PyTorch
    if (r == 0) {
      auto a = kit::isend(torch::full({3}, 7.0f, on), 1, {}, 7);
      auto b = kit::isend(torch::full({3}, 8.0f, on), 1, {}, 8);
      a.wait();
      b.wait();
    } else if (r == 1) {
      auto eight = torch::zeros({3}, on), seven = torch::zeros({3}, on);
      auto b = kit::irecv(eight, 0, {}, 8);
      auto a = kit::irecv(seven, 0, {}, 7);
      b.wait();
      a.wait();
      expect(torch::equal(eight.cpu(), torch::full({3}, 8.0f)), r, "tag 8");
      expect(torch::equal(seven.cpu(), torch::full({3}, 7.0f)), r, "tag 7");
    }
  }

  // A subgroup: world rank 1 sends to world rank 3 on group {1, 3}; peers are world ranks.
  if (n == 4) {
    auto odd = kit::new_group({1, 3});
    if (r == 1) kit::send(of_rank(1, me.device), 3, odd);
    if (r == 3) {
      auto got = torch::zeros({2, 3}, on);
      kit::recv(got, 1, odd);
      expect(torch::equal(got.cpu(), of_rank(1, torch::kCPU)), r, "group 1,3");
    }
  }
  kit::barrier();
  if (g_failures == 0) std::printf("exchange rank %d: ok\n", r);
  return g_failures == 0 ? 0 : 1;
}

int facing(const kit::Setup& me) {
  auto t = torch::ones({4}, torch::TensorOptions().device(me.device));
  kit::send(t, 1 - me.rank);  // both ranks wait here for a receive that never comes
  kit::recv(t, 1 - me.rank);
  return 3;
}

int unmatched(const kit::Setup& me) {
  auto t = torch::ones({4}, torch::TensorOptions().device(me.device));
  if (me.rank == 0) {
    kit::send(t, 1);
    kit::send(t, 1);  // rank 1 never receives this one
  } else {
    kit::recv(t, 0);
    kit::barrier();  // where rank 1 goes on to
  }
  return 3;
}

int bad(const kit::Setup& me, const std::string& what) {
  const int r = me.rank;
  const auto on = torch::TensorOptions().device(me.device);
  auto t = torch::ones({2, 3}, on);
  kit::barrier();  // every rank is past setup() before one of them stops
  if (what == "peer") kit::send(t, 5);
  if (what == "self") kit::send(t, r);
  if (what == "outside") {
    auto zero = kit::new_group({0});
    auto one = kit::new_group({1});
    kit::barrier();  // both groups made (at rank 0's store) before a rank stops
    kit::send(t, 1 - r, r == 0 ? zero : one);
  }
  if (what == "tag") kit::send(t, 1 - r, {}, -1);
  if (what == "tag_high") kit::send(t, 1 - r, {}, 1 << 30);
  if (what == "host") kit::send(torch::ones({2}), 1 - r);
  if (what == "shape" || what == "dtype") {
    if (r == 0) {
      kit::send(torch::ones({2, 3}, on), 1);
      return 0;  // its message was taken; rank 1 alone fails
    }
    auto wrong = what == "shape" ? torch::zeros({3, 2}, on) : torch::zeros({3}, on.dtype(torch::kDouble));
    kit::recv(wrong, 0);
    std::printf("rank 1 received %s\n", what.c_str());
    return 0;
  }
  return 3;  // the error did not come
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: p2p_probe exchange | facing | unmatched | bad WHAT\n");
    return 2;
  }
  const std::string cmd = argv[1];
  const kit::Setup me = kit::setup();
  std::printf("rank %d pid %d\n", me.rank, static_cast<int>(getpid()));
  std::fflush(stdout);
  int rc = 2;
  if (cmd == "exchange") rc = exchange(me);
  else if (cmd == "facing") rc = facing(me);
  else if (cmd == "unmatched") rc = unmatched(me);
  else if (cmd == "bad" && argc == 3) rc = bad(me, argv[2]);
  else std::fprintf(stderr, "p2p_probe: bad arguments for '%s'\n", cmd.c_str());
  std::fflush(stdout);
  kit::destroy_process_group();
  return rc;
}
