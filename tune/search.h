/* clattn-tune's search: a grid per stage over an op's tuning parameters (coordinate descent:
 * each stage starts from the best so far), every candidate checked against the reference and
 * timed beside the row the device has now. */
#ifndef CLATTN_TUNE_SEARCH_H
#define CLATTN_TUNE_SEARCH_H

#include "tune.h"
#include "runtime/tuning.h"

#include <stdio.h>

#define TUNE_MAX_STAGES 4
/* A candidate replaces the best only when at least 3% faster: less is within the noise of a
 * median of a few calls here, and every change of row needs a reason. */
#define TUNE_MARGIN 0.97

/* One op's search space. */
typedef struct tune_space {
    const clattn__tuning_op *spec;
    /* each stage's grid: "NAME=a|b|c NAME=a|b ..."; the other parameters keep the best values */
    const char *stages[TUNE_MAX_STAGES];
    /* a candidate that repeats another (a parameter its variant ignores); NULL: none */
    bool (*redundant)(const long *values);
    tune_cases_fn cases;
    /* sequential: the parameters cannot alternate call by call (CLBlast recompiles its GEMM on
     * each change), so candidates are timed one after another, each against the FMA kernel
     * timed beside it; seed: where the search starts when the device has no row */
    bool sequential;
    const char *seed;
} tune_space;

typedef struct tune_settings {
    int repeats;   /* timed calls of each candidate and of the start row, alternating */
    double budget; /* seconds an op's search may take before it stops trying candidates */
    FILE *log;     /* every candidate's line; NULL: none */
} tune_settings;

typedef struct tune_result {
    long start[CLATTN__TUNING_MAX_PARAMS]; /* the row the device had */
    long best[CLATTN__TUNING_MAX_PARAMS];
    bool start_known;                  /* false: no row (CLBlast's own parameters) */
    double ratio;                      /* best's time / start's, geometric mean over cases */
    double case_ratio[TUNE_MAX_CASES]; /* the same per case, from the final re-timing */
    char case_shape[TUNE_MAX_CASES][96];
    int cases, tried, rejected, unfit;
    bool out_of_time; /* the budget ran out before the grid did */
    double seconds;
} tune_result;

/* Searches `space` on env's device. Fails when the start row itself misses the reference or an
 * OpenCL call fails outside a candidate. Leaves no override set. */
int tune_search(clattn_env *env, const tune_space *space, const tune_settings *settings,
                tune_result *out);

#endif
