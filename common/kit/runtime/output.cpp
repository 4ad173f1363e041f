// kit/runtime/output.cpp — every program built on the kit writes its stdout line by line.
//
// C's stdout is line-buffered only when it is a terminal. Under ddprun, srun or a Slurm batch
// job it is a pipe or a file, and then the C library holds everything in a 4 KiB buffer until it
// fills or the process exits: a rank's "rank 1 of 2: ..." line would show up after rank 0's final
// test loss, and a job's .out file would stay empty for minutes. Line buffering costs one write()
// per line, which is nothing next to a training step, and makes every line appear when printed.
//
// This runs when kit_common is loaded, before main() and before anything can be printed (setvbuf
// must come before the first output on a stream). It lives in the library so that every trainer,
// stage, student build and test gets it without a line of its own.
#include <cstdio>

namespace kit {
namespace {

struct LineBufferedStdout {
  LineBufferedStdout() { std::setvbuf(stdout, nullptr, _IOLBF, 0); }
};
const LineBufferedStdout line_buffered_stdout;

}  // namespace
}  // namespace kit
