// kit/runtime/process.h — what the kit does to a program's whole process, in one place: how an
// error ends it, what a rank that aborts says, and how glibc's malloc keeps memory.
//
// These are process-wide settings (a terminate handler, a signal handler, malloc options), so a
// reader should see where they are made: setup() calls prepare_process() first thing, and so does
// the flag parser (kit/train/args.h), so that a trainer's bad flags or missing data, before
// setup(), end in one line too.
#pragma once

namespace kit {

// Once per process; later calls do nothing.
//
// 1. How an exception that nobody caught ends the process (std::set_terminate):
//    - on the main thread (bad flags, missing data, a failed collective, a SetupError): one line,
//      "rank N: error: <the exception's first line>", and exit status 1, instead of "terminate
//      called after throwing ..." and a core dump;
//    - on any other thread: as c10d intends. ProcessGroupNCCL's watchdog rethrows a collective's
//      timeout or failure from its own thread precisely so that the process aborts (with
//      TORCH_NCCL_ASYNC_ERROR_HANDLING, which setup() turns on) rather than compute on with a
//      broken communicator. One line "kit: rank N aborted (SIGABRT): an exception escaped thread
//      <name>: <its first line>", then abort(): SIGABRT, exit status 134 through ddprun or srun.
//    N is the rank setup() joined as, before it RANK or SLURM_PROCID; no rank: no "rank N".
// 2. glibc's malloc keeps freed memory in the process (see process.cpp for why and what it
//    gains); KIT_MALLOC=default leaves glibc's settings alone.
void prepare_process();

// setup(), once it knows the rank: a SIGABRT from then on (NCCL's watchdog, a failed assertion)
// first writes "kit: rank N aborted (SIGABRT): ..." to stderr, so that a Slurm job's .err names
// the rank where srun says only "task 3: Aborted"; then the default action runs (core dump,
// status 134). An exception that escaped a thread has said its own line already (above).
void name_rank_on_abort(int rank);

}  // namespace kit
