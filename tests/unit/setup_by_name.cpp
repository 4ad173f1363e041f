// setup_by_name.cpp — how a trainer reads kit::setup()'s result, compiled three times by
// tests/unit/CMakeLists.txt: as written (target setup_by_name, part of the build: reading the
// fields by name compiles), and with KIT_SETUP_BY_POSITION=4 or 5 (targets setup_by_position4/5,
// built only by the test unit.SetupCannotBeUnpackedByPosition, which expects the compiler to
// refuse both: four names, the trap, and five, in case one thought the hidden member a field).
// Only compiled, never run: nothing here joins a job.
#include "kit/runtime/distributed.h"

int rank_of(const kit::Setup& me) {
#if KIT_SETUP_BY_POSITION == 4
  // The trap kit::Setup closes: the first two fields are both ints, so this order (rank first)
  // would compile, and every rank would take its local rank for its rank.
  auto [rank, local_rank, device, world_size] = me;
  return rank + 0 * local_rank + 0 * world_size + 0 * device.index();
#elif KIT_SETUP_BY_POSITION == 5
  auto [rank, local_rank, device, world_size, hidden] = me;
  return rank + 0 * local_rank + 0 * world_size + 0 * device.index() + 0 * hidden;
#else
  return me.rank;
#endif
}
