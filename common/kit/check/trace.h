// kit/check/trace.h — trace::record(): what a run did, for the checker (`kit check`,
// tests/student).
//
// Off unless KIT_TRACE_DIR is set. Then every process appends one line per event to
// $KIT_TRACE_DIR/rank<RANK>.trace (RANK from the launcher; the pid if there is none), after a
// first line "process pid=<pid>": the seeds of setup() and of each sampler, which samples it
// read, the parameters' fingerprint at each training forward, each step's loss, every collective
// (with its group: "world" or a subgroup's ranks) and all-reduce, every print0/save0 call, and
// whether the process group was still alive at exit. The checker compares these files across ranks, and with the solution's run event by
// event (common/tools/checklib/compare.py); it judges behaviour, not source text. With KIT_TRACE_WEIGHTS=1 the model also saves the weights it starts training from
// (tests/oracle compares the run with PyTorch).
//
// Only kit/check/ writes to it: the library reports its events through kit/check/observe.h,
// which formats each as a line here.
#pragma once

#include <string>

namespace kit::trace {

bool enabled();
// Appends "<event> <fields>" as one line; thread-safe, flushed at once so a crash loses nothing.
void record(const std::string& event, const std::string& fields);
// A file of this rank's beside its trace, "$KIT_TRACE_DIR/<stem>-rank<RANK>.<ext>", for records
// too large for a line; "" when tracing is off.
std::string file(const std::string& stem, const std::string& ext);

}  // namespace kit::trace
