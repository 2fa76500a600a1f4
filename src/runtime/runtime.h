/* The runtime beneath the ops. Not installed. */
#ifndef CLATTN_RUNTIME_RUNTIME_H
#define CLATTN_RUNTIME_RUNTIME_H

#include "build_options.h"
#include "config.h"
#include "device_facts.h"
#include "hooks.h"
#include "kernel.h"
#include "launch.h"
#include "matrix_units.h"
#include "scratch.h"
#include "status.h"
#include "tensor.h"
#include "tuning.h"

/* Everything an op needs from the runtime. Ops include this (or the single headers); the
 * runtime never includes anything from src/ops or src/api. */

#endif
