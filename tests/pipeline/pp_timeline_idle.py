#!/usr/bin/env python3
"""common/tools/pp_timeline.py's idle arithmetic on a synthetic trace with a known answer.

Two ranks, p 2, v 1, m 2, three training steps with evaluation forwards between them (which must
not be taken for a step). Step 2 (times in microseconds):
  rank 0: 0F0 100-110, 0F1 110-120, 0B0 150-170, 0B1 170-190              busy 60
  rank 1: 1F0 110-120, 1F1 120-130, 1B0 130-150, 1B1 150-165, + a recv wait busy 55
frame 100-190 (90): idle 30/90 and 35/90, overall 65/180. Step 3 is step 2 moved by 1000 with
rank 1's last backward 150-170 (idle 30/90 each). Step 1 (warm-up, skipped) is twice as long.
So the measured mean idle is (65/180 + 60/180) / 2, per rank ((30+30)/90/2, (35+30)/90/2).
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "common", "tools"))
from verdict import expect, finish  # noqa: E402
import pp_timeline  # noqa: E402


def step(rank, at, slow_last=False, stretch=1):
    s = lambda t: at + (t - 100) * stretch  # noqa: E731
    if rank == 0:
        acts = [("F", 0, 0, 100, 110), ("F", 0, 1, 110, 120), ("B", 0, 0, 150, 170),
                ("B", 0, 1, 170, 190)]
    else:
        acts = [("F", 1, 0, 110, 120), ("F", 1, 1, 120, 130), ("B", 1, 0, 130, 150),
                ("B", 1, 1, 150, 165 if slow_last else 170)]
    return [f"pp kind={k} stage={c} mb={mb} t0={s(a)} t1={s(b)}" for k, c, mb, a, b in acts]


def main():
    with tempfile.TemporaryDirectory() as d:
        for r in (0, 1):
            lines = ["process pid=1", f"setup rank={r} world_size=2"]
            lines += step(r, 0, stretch=2)
            lines += [f"pp kind=F stage={r} mb=0 t0=500 t1=505", f"pp kind=F stage={r} mb=1 t0=505 t1=510"]
            lines += step(r, 100, slow_last=True)
            if r == 1:
                lines.append("p2p_wait seq=1 kind=recv peer=0 group=world t0=100 t1=110")
            lines += [f"pp kind=F stage={r} mb=0 t0=600 t1=605"]
            lines += step(r, 1100)
            with open(os.path.join(d, f"rank{r}.trace"), "w") as f:
                f.write("\n".join(lines) + "\n")
        ranks = pp_timeline.read_traces(d)
        res = pp_timeline.measure(ranks, skip=1)
        expect((res["p"], res["v"], res["m"]) == (2, 1, 2), "the shape p 2, v 1, m 2 from the trace",
               (res["p"], res["v"], res["m"]))
        expect(len(res["steps"]) == 3, "three training steps found, evaluation forwards skipped",
               len(res["steps"]))
        expect(res["measured"] == [1, 2], "step 1 is the warm-up, steps 2 and 3 measured", res["measured"])
        s2 = res["steps"][1]
        expect(s2["frame"] == (100, 190), "step 2's frame: first action to last", s2["frame"])
        expect(abs(s2["idle"][0] - 30 / 90) < 1e-12 and abs(s2["idle"][1] - 35 / 90) < 1e-12,
               "step 2's idle per rank 30/90 and 35/90", s2["idle"])
        expect(abs(s2["overall"] - 65 / 180) < 1e-12, "step 2's idle overall 65/180", s2["overall"])
        # Replayed with its durations, each action as soon as its input exists: step 2 has no
        # gap that its dependencies do not explain, so the replay is the step itself.
        expect(abs(s2["replay"] - 65 / 180) < 1e-12, "step 2 replayed: 65/180", s2["replay"])
        # A message that took 10: 1F0 starts at 20, not 10. Measured idle 80/140; replayed with
        # messages free the step is 60 long, 60 of 120 busy.
        gap = {0: [("F", 0, 0, 0, 10), ("B", 0, 0, 50, 70)], 1: [("F", 1, 0, 20, 30), ("B", 1, 0, 30, 50)]}
        expect(abs(pp_timeline.replay(gap, 2) - 0.5) < 1e-12, "a late message: replayed idle 1/2",
               pp_timeline.replay(gap, 2))
        want = (65 / 180 + 60 / 180) / 2
        expect(abs(res["idle"] - want) < 1e-12, f"mean idle over steps 2-3 = {want:.6f}", res["idle"])
        expect(abs(res["idle_per_rank"][1] - (35 + 30) / 90 / 2) < 1e-12, "rank 1's mean idle",
               res["idle_per_rank"])
        expect(abs(res["formula"] - 1 / 3) < 1e-12, "formula (2-1)/(2+2-1) = 1/3", res["formula"])
        expect(pp_timeline.busy_union([(0, 10), (5, 15), (20, 30), (25, 26)], 2, 28) == 21,
               "busy time: union of overlapping intervals, clipped to the frame")
        trace = pp_timeline.chrome_trace(res, ranks)
        waits = [e for e in trace["traceEvents"] if e.get("cat") == "recv"]
        expect(len(waits) == 1 and waits[0]["dur"] == 10, "the recv wait in the Chrome trace", waits)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
