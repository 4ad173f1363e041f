// gloo/rendezvous/store.h — the kit's stand-in: see gloo/kit_declarations.h for why declarations suffice.
#pragma once
#include <gloo/kit_declarations.h>
