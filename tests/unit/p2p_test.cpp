// Point to point (kit::send, recv, isend, irecv, batch_isend_irecv: kit/runtime/distributed.h) on
// real ranks: processes started by ddprun, each joining with kit::setup() as a trainer does.
// tests/unit/p2p_probe.cpp is the program; this test starts it and judges its output and traces:
// the values that arrive, the trace's numbering per peer and direction, a deadlock (two blocking
// sends facing each other, a send without its receive) named on both ranks within the timeout,
// and each bad argument as one line naming the probe's line.
//
// No LibTorch in this file: it only starts programs and reads what they leave behind.
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "child_process.h"  // Process, Result, TempDir, clean_env (tests/support)

namespace fs = std::filesystem;

namespace {

using kit_test::Process;
using kit_test::Result;

const std::string g_tag = "kit-p2p-" + std::to_string(::getpid());

Result run_probe(int n, const std::vector<std::string>& args, const fs::path& dir,
                 std::map<std::string, std::string> env = {}) {
  if (!env.count("KIT_TIMEOUT")) env["KIT_TIMEOUT"] = "20";
  std::vector<std::string> argv = {DDPRUN_EXE, "--nproc-per-node", std::to_string(n),
                                   "--tag-output", "--", PROBE_EXE};
  argv.insert(argv.end(), args.begin(), args.end());
  Process p(argv, kit_test::clean_env("KIT_P2P_TAG", g_tag, env), dir, "ddprun");
  return p.wait(45);
}

// The lines of `text` that match `re`.
std::vector<std::string> lines_matching(const std::string& text, const std::string& re) {
  std::vector<std::string> out;
  const std::regex r(re);
  for (auto& line : kit_test::nonempty_lines(text))
    if (std::regex_search(line, r)) out.push_back(line);
  return out;
}

// The probe's line that holds `code` (error lines name the caller's line: this finds its number).
int line_of(const std::string& code) {
  const std::string src = kit_test::read_file(PROBE_SOURCE);
  const auto at = src.find(code);
  EXPECT_NE(at, std::string::npos) << code;
  return 1 + static_cast<int>(std::count(src.begin(), src.begin() + at, '\n'));
}
std::string site(const std::string& code) {
  return "p2p_probe\\.cpp:" + std::to_string(line_of(code));
}

// How a deadlocked wait ends on Gloo: its own timeout, or, when the peer timed out a moment
// earlier, the connection the peer's Gloo closed then (process_group.cpp, explain()).
std::string ended(const std::string& peer) {
  return "(timed out after 4 s|ended when rank " + peer + " gave up waiting after 4 s)";
}

// ---------------------------------------------------------------------------------------------

// Every form on Gloo, 2 and 4 ranks: the values that arrive are the sender's (a ring, a blocking
// pair into a strided tensor, a batch both ways at once, tags received out of order, a subgroup
// with world ranks as peers); the same under KIT_DEBUG_COLLECTIVES=1, whose descriptions travel
// ahead of each message, and under KIT_DEVICE_CHECK=nccl, on the fake device.
TEST(PointToPoint, EveryFormDeliversTheSendersValues) {
  kit_test::TempDir tmp("kit-p2p");
  const std::map<std::string, std::string> envs[] = {
      {}, {{"KIT_DEBUG_COLLECTIVES", "1"}}, {{"KIT_DEVICE_CHECK", "nccl"}}};
  for (int n : {2, 4})
    for (auto& env : envs) {
      Result r = run_probe(n, {"exchange"}, tmp.path, env);
      EXPECT_EQ(r.exit_code, 0) << n << " ranks\n" << r;
      EXPECT_EQ(lines_matching(r.out, R"(exchange rank \d: ok$)").size(), static_cast<size_t>(n)) << r;
      EXPECT_TRUE(lines_matching(r.out, "FAIL").empty()) << r;
    }
}

// The trace: one "p2p" line per send or receive, numbered per peer and direction, with the peer's
// world rank, the tag and the caller's line, and one "p2p_wait" per wait.
TEST(PointToPoint, TheTraceNumbersEachCallPerPeerAndDirection) {
  kit_test::TempDir tmp("kit-p2p");
  Result r = run_probe(4, {"exchange"}, tmp.path, {{"KIT_TRACE_DIR", tmp.path.string()}});
  ASSERT_EQ(r.exit_code, 0) << r;
  const std::string rank1 = kit_test::read_file(tmp.path / "rank1.trace");
  const std::string rank3 = kit_test::read_file(tmp.path / "rank3.trace");
  const std::string ring = site("kit::Work sent = kit::isend(out, next);");
  // Rank 1 sends to 2 (the ring's #1, the batch's #2), to 0 (the float64 reply #1, the batch's
  // #2) and to 3 on group 1,3; it receives from 0 five times (the ring, the strided tensor, the
  // batch, tag 8, tag 7) and from 2 once (the batch): 11 calls, 11 waits.
  for (auto [re, count] : std::vector<std::pair<std::string, size_t>>{
           {"^p2p seq=1 kind=send peer=2 tag=0 shape=\\[2,3\\] dtype=Float site=" + ring + " group=world$", 1},
           {"^p2p seq=2 kind=send peer=2 tag=1 .* group=world$", 1},
           {"^p2p seq=1 kind=recv peer=0 tag=0 .* site=" + site("kit::recv(in, prev);") + " group=world$", 1},
           {"^p2p seq=2 kind=recv peer=0 tag=0 shape=\\[3,2\\] .*site=" + site("kit::recv(strided, 0);"), 1},
           {"^p2p seq=1 kind=send peer=0 tag=0 shape=\\[4\\] dtype=Double", 1},
           {"^p2p seq=1 kind=send peer=3 tag=0 .* site=" + site("if (r == 1) kit::send(") + " group=1,3$", 1},
           {"^p2p seq=4 kind=recv peer=0 tag=8 ", 1},
           {"^p2p seq=5 kind=recv peer=0 tag=7 ", 1},
           {"^p2p ", 11},
           {"^p2p_wait seq=\\d+ kind=(send|recv) peer=\\d group=\\S+ t0=\\d+ t1=\\d+$", 11}})
    EXPECT_EQ(lines_matching(rank1, re).size(), count) << re << "\n" << rank1;
  EXPECT_EQ(lines_matching(rank3, "^p2p seq=1 kind=recv peer=1 tag=0 .* group=1,3$").size(), 1u) << rank3;
}

// Two blocking sends facing each other: each rank's line names its own call and line, the peer,
// and what the peer was waiting in, within the timeout (4 s, and up to 3 s for the peer's
// report), instead of a hang.
TEST(PointToPoint, TwoBlockingSendsFacingEachOtherAreNamedOnBothRanks) {
  kit_test::TempDir tmp("kit-p2p");
  for (const char* debug : {"0", "1"}) {
    Result r = run_probe(2, {"facing"}, tmp.path,
                         {{"KIT_TIMEOUT", "4"}, {"KIT_DEBUG_COLLECTIVES", debug}});
    EXPECT_NE(r.exit_code, 0) << r;
    const std::string send = site("kit::send(t, 1 - me.rank);");
    for (int rank : {0, 1}) {
      const std::string me = std::to_string(rank), peer = std::to_string(1 - rank);
      EXPECT_EQ(lines_matching(r.err, "^\\[rank " + me + "\\] rank " + me + ": error: send #1 to rank " + peer +
                                          " \\(" + send + "\\) " + ended(peer) + ": rank " + peer +
                                          " never posted the matching receive; rank " + peer +
                                          " was waiting in send #1 to rank " + me + " \\(" + send +
                                          "\\)\\. Every send needs its receive")
                    .size(),
                1u)
          << "KIT_DEBUG_COLLECTIVES=" << debug << "\n" << r;
    }
    EXPECT_LT(r.seconds, 15) << r;
  }
}

// A send without its receive: rank 0's second send waits for a receive rank 1 never posts, while
// rank 1 waits in a barrier rank 0 never joins. Each line names the other rank's call.
TEST(PointToPoint, ASendWithoutItsReceiveIsNamedOnBothRanks) {
  kit_test::TempDir tmp("kit-p2p");
  Result r = run_probe(2, {"unmatched"}, tmp.path, {{"KIT_TIMEOUT", "4"}});
  EXPECT_NE(r.exit_code, 0) << r;
  const std::string second = site("kit::send(t, 1);  // rank 1 never"), recv = site("kit::recv(t, 0);"),
                    barrier = site("kit::barrier();  // where rank 1");
  EXPECT_EQ(lines_matching(r.err, "^\\[rank 0\\] rank 0: error: send #2 to rank 1 \\(" + second +
                                      "\\) " + ended("1") + ": rank 1 never posted the matching "
                                      "receive; rank 1 was waiting in barrier #1 \\(" + barrier +
                                      "\\), after recv #1 from rank 0 \\(" + recv + "\\)\\. ")
                .size(),
            1u)
      << r;
  EXPECT_EQ(lines_matching(r.err, "^\\[rank 1\\] rank 1: error: barrier #1 \\(" + barrier +
                                      "\\) (timed out after 4 s: the other ranks never joined it|failed: another rank left the job "
                                      "\\(it gave up waiting after 4 s\\)); "
                                      "rank 0 was waiting in send #2 to rank 1 \\(" + second +
                                      "\\), after send #1 to rank 1 \\(")
                .size(),
            1u)
      << r;
  EXPECT_LT(r.seconds, 15) << r;
}

// Bad arguments: one line each, naming the probe's line, at once (no timeout involved). Both
// ranks make the bad call (but for shape and dtype, where rank 1 alone receives wrong); ddprun
// stops the slower one 0.5 s after the first failed, so the line of either rank is taken.
TEST(PointToPoint, BadArgumentsAreOneLineNamingTheCall) {
  kit_test::TempDir tmp("kit-p2p");
  struct Case {
    std::vector<std::string> args;
    std::map<std::string, std::string> env;
    std::function<std::string(int)> says;  // what rank R says, as a regex
  };
  const std::string recv = site("kit::recv(wrong, 0);");
  auto other = [](int rank) { return std::to_string(1 - rank); };
  const Case cases[] = {
      {{"bad", "peer"}, {}, [&](int) { return "send \\(" + site("kit::send(t, 5);") + "\\): peer 5 is not in the world \\(ranks 0 to 1\\)$"; }},
      {{"bad", "self"}, {}, [&](int rank) { return "send \\(" + site("kit::send(t, r);") + "\\): peer " + std::to_string(rank) + " is this rank itself"; }},
      {{"bad", "outside"}, {}, [&](int rank) {
         return "send \\(" + site("kit::send(t, 1 - r, r == 0") + "\\): peer " + other(rank) + " is not in group " +
                std::to_string(rank) + " "; }},
      {{"bad", "tag"}, {}, [&](int) { return "send \\(" + site("kit::send(t, 1 - r, {}, -1);") + "\\): tag -1 is outside 0 to 2\\^30 - 1"; }},
      {{"bad", "tag_high"}, {}, [&](int) { return "send \\(" + site("kit::send(t, 1 - r, {}, 1 << 30);") + "\\): tag 1073741824 is outside"; }},
      {{"bad", "host"}, {{"KIT_DEVICE_CHECK", "nccl"}}, [&](int rank) {
         return "send #1 to rank " + other(rank) + " \\(" + site("kit::send(torch::ones({2}), 1 - r);") +
                "\\) was given a tensor on cpu, but NCCL moves only tensors on the rank's device \\(fakegpu:0\\)"; }},
      {{"bad", "shape"}, {{"KIT_DEBUG_COLLECTIVES", "1"}}, [&](int rank) {
         return rank == 0 ? std::string("^$")
                          : "recv #1 from rank 0 \\(" + recv + "\\) expects \\[3, 2\\] Float, but rank 0's send #1 to it \\(line " +
                                std::to_string(line_of("kit::send(torch::ones({2, 3}, on), 1);")) + "\\) has \\[2, 3\\] Float\\. "; }},
      {{"bad", "dtype"}, {{"KIT_DEBUG_COLLECTIVES", "1"}}, [&](int rank) {
         return rank == 0 ? std::string("^$")
                          : "recv #1 from rank 0 \\(" + recv + "\\) expects \\[3\\] Double, but rank 0's send #1 to it \\(line \\d+\\) has \\[2, 3\\] Float\\. "; }}};
  for (auto& c : cases) {
    Result r = run_probe(2, c.args, tmp.path, c.env);
    EXPECT_NE(r.exit_code, 0) << c.args[1] << "\n" << r;
    size_t found = 0;
    for (int rank : {0, 1})
      found += lines_matching(r.err, "^\\[rank " + std::to_string(rank) + "\\] rank " + std::to_string(rank) +
                                         ": error: " + c.says(rank)).size();
    EXPECT_GE(found, 1u) << c.args[1] << "\n" << r;
    EXPECT_EQ(lines_matching(r.err, ": error: ").size(), found) << c.args[1] << ": another error\n" << r;
    EXPECT_TRUE(lines_matching(r.out, "received").empty()) << c.args[1] << "\n" << r;
    EXPECT_LT(r.seconds, 15) << r;
  }
}

}  // namespace
