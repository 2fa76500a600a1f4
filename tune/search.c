/* clattn-tune's search (tune/search.h). Timing is relative: each candidate runs alternately
 * with the row the device has now, call by call, so a shared machine's drift (its bandwidth
 * moves by half from one second to the next) cancels out of the ratio. A sequential space
 * (CLBlast's GEMM, which rebuilds on every change of parameters) is timed against the FMA
 * kernel run beside it instead. */
#include "search.h"

#include "../bench/bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TUNE_MAX_VALUES 8

/* One stage's grid: parameter indices and their values. */
typedef struct grid {
    int count, param[CLATTN__TUNING_MAX_PARAMS];
    int values[CLATTN__TUNING_MAX_PARAMS];
    long value[CLATTN__TUNING_MAX_PARAMS][TUNE_MAX_VALUES];
} grid;

static int param_index(const clattn__tuning_op *spec, const char *name, size_t length) {
    for (int i = 0; i < spec->count; ++i)
        if (strlen(spec->params[i]) == length && strncmp(spec->params[i], name, length) == 0)
            return i;
    return -1;
}

/* Parses "NAME=a|b NAME=c|d". The grids are the tuner's own constants: a malformed one is a
 * programming error, reported as CLATTN_ERR_INVALID_TUNING. */
static int parse_grid(const clattn__tuning_op *spec, const char *text, grid *g) {
    memset(g, 0, sizeof *g);
    for (const char *p = text; *p;) {
        const char *eq = strchr(p, '=');
        const int index = eq ? param_index(spec, p, (size_t)(eq - p)) : -1;
        if (index < 0 || g->count == CLATTN__TUNING_MAX_PARAMS) return CLATTN_ERR_INVALID_TUNING;
        int n = 0;
        char *end = (char *)eq;
        do {
            g->value[g->count][n++] = strtol(end + 1, &end, 10);
        } while (*end == '|' && n < TUNE_MAX_VALUES);
        g->param[g->count] = index;
        g->values[g->count++] = n;
        p = end + strspn(end, " ");
    }
    return CLATTN_SUCCESS;
}

/* Steps the odometer `digit` over the grid; false after the last candidate. */
static bool next_candidate(const grid *g, int *digit) {
    for (int i = 0; i < g->count; ++i) {
        if (++digit[i] < g->values[i]) return true;
        digit[i] = 0;
    }
    return false;
}

/* ---- running one parameter set ---- */

/* Fills the case's output with NaN, so that an element a candidate leaves unwritten fails the
 * check rather than pass with the last candidate's value. */
static int poison_output(tune_case *c, cl_command_queue queue) {
    const float nan = NAN;
    size_t bytes = 4;
    for (int d = 0; d < 4; ++d) bytes *= (size_t)c->out.shape[d];
    return clEnqueueFillBuffer(queue, c->out.buffer, &nan, sizeof nan, 0, bytes, 0, NULL, NULL);
}

/* Runs each case once with `params` and checks it; *why says what failed. */
static int verify(tune_case *cases, int count, const char *op, const char *params, bool *ok,
                  char *why, size_t capacity) {
    int status = CLATTN_SUCCESS;
    *ok = true;
    for (int i = 0; i < count && *ok && status == CLATTN_SUCCESS; ++i) {
        tune_run r = {&cases[i], op, params};
        cl_command_queue queue = clattn_env_queue(cases[i].env);
        status = poison_output(&cases[i], queue);
        if (status == CLATTN_SUCCESS) status = tune_run_with(&r, queue);
        if (status == CLATTN_SUCCESS) status = clFinish(queue);
        if (status != CLATTN_SUCCESS) {
            snprintf(why, capacity, "%s: %s (%s)", cases[i].shape, clattn_status_name(status),
                     clattn_last_error());
            *ok = false;
        } else {
            status = tune_check(&cases[i], ok, why, capacity);
        }
    }
    /* a candidate's own failure (a build past the device's limits) rejects it, nothing more */
    return *ok ? status : CLATTN_SUCCESS;
}

/* ---- the search ---- */

typedef struct search {
    const tune_space *space;
    const tune_settings *settings;
    cl_device_id device;
    tune_case cases[TUNE_MAX_CASES];
    int count;
    const char *start; /* the start row's text; NULL: none (CLBlast's own parameters) */
    char start_text[CLATTN_TUNING_PARAMS_MAX];
    bench_ceilings ceilings;           /* sequential spaces: the FMA kernel timed beside */
    double start_norm[TUNE_MAX_CASES]; /* sequential spaces: the start's normalized time */
    tune_result *result;
    double t0; /* when the search began (ms) */
} search;

/* One case's time with `params`, normalized by the FMA kernel's rate timed alternately with
 * it (ms x GFLOP/s): comparable across minutes on a machine whose speed drifts. */
static int normalized_time(search *s, int i, const char *params, int repeats, double *out) {
    bench_options opt = {.quick = true, .repeats = repeats, .warmup = 2};
    tune_run run = {&s->cases[i], s->space->spec->name, params};
    bench_timing t;
    double fma_gflops = 0;
    int status = bench_time_vs_fma(&opt, &s->ceilings, tune_run_with, &run,
                                   clattn_env_queue(s->cases[i].env), &t, &fma_gflops);
    *out = t.median_ms * fma_gflops;
    return status;
}

/* Median time of `params` over the start row's, case by case (geometric mean in *ratio):
 * timed alternately with the start, or for a sequential space (whose parameters cannot
 * alternate) against the start's normalized time measured before any candidate. */
static int time_ratio(search *s, const char *params, int repeats, double *ratio, double *per_case) {
    bench_options opt = {.repeats = repeats, .warmup = 2};
    const char *op = s->space->spec->name;
    int status = CLATTN_SUCCESS;
    double log_sum = 0;
    for (int i = 0; i < s->count && status == CLATTN_SUCCESS; ++i) {
        double r = 1.0, norm = 0;
        if (s->space->sequential) {
            status = normalized_time(s, i, params, repeats, &norm);
            r = norm / s->start_norm[i];
        } else {
            tune_run cand = {&s->cases[i], op, params}, ref = {&s->cases[i], op, s->start};
            bench_timing t_cand, t_ref;
            status = bench_time_beside(&opt, tune_run_with, &cand, tune_run_with, &ref,
                                       clattn_env_queue(s->cases[i].env), &t_cand, &t_ref);
            r = t_cand.median_ms / t_ref.median_ms;
        }
        if (per_case) per_case[i] = r;
        log_sum += log(r);
    }
    *ratio = exp(log_sum / s->count);
    return status;
}

/* Checks and times one candidate; a better one becomes the best. */
static int try_candidate(search *s, const long *values) {
    const char *op = s->space->spec->name;
    char params[CLATTN_TUNING_PARAMS_MAX], why[256] = "";
    clattn__tuning_format(s->space->spec, values, params, sizeof params);
    FILE *log = s->settings->log;
    bool ok = false;
    int status = verify(s->cases, s->count, op, params, &ok, why, sizeof why);
    s->result->tried++;
    if (status != CLATTN_SUCCESS || !ok) {
        s->result->rejected += status == CLATTN_SUCCESS;
        if (log && status == CLATTN_SUCCESS) fprintf(log, "  %-60s rejected: %s\n", params, why);
        return status;
    }
    /* a short look first: a candidate far slower than the best is not worth the full count */
    const double best = s->result->ratio;
    double ratio = 0, again = 0;
    status = time_ratio(s, params, 3, &ratio, NULL);
    if (status == CLATTN_SUCCESS && ratio < 1.5 * best)
        status = time_ratio(s, params, s->settings->repeats, &ratio, NULL);
    /* a new best is timed twice: one lucky median (the noise) must not win */
    if (status == CLATTN_SUCCESS && ratio < TUNE_MARGIN * best) {
        status = time_ratio(s, params, s->settings->repeats, &again, NULL);
        ratio = sqrt(ratio * again);
    }
    if (log && status == CLATTN_SUCCESS) fprintf(log, "  %-60s %.3f\n", params, ratio);
    if (status == CLATTN_SUCCESS && ratio < TUNE_MARGIN * best) {
        s->result->ratio = ratio;
        memcpy(s->result->best, values, sizeof s->result->best);
    }
    return status;
}

static int run_stage(search *s, const char *text) {
    const clattn__tuning_op *spec = s->space->spec;
    grid g;
    int status = parse_grid(spec, text, &g), digit[CLATTN__TUNING_MAX_PARAMS] = {0};
    long base[CLATTN__TUNING_MAX_PARAMS];
    memcpy(base, s->result->best, sizeof base);
    if (s->settings->log) fprintf(s->settings->log, " stage %s\n", text);
    do {
        long values[CLATTN__TUNING_MAX_PARAMS];
        memcpy(values, base, sizeof values);
        for (int i = 0; i < g.count; ++i) values[g.param[i]] = g.value[i][digit[i]];
        if (memcmp(values, base, sizeof values) == 0) continue; /* already measured */
        if (s->space->redundant && s->space->redundant(values)) continue;
        if (spec->fits(s->device, values)) {
            s->result->unfit++;
            continue;
        }
        if (bench_now_ms() - s->t0 > 1e3 * s->settings->budget) {
            s->result->out_of_time = true;
            break;
        }
        status = try_candidate(s, values);
    } while (status == CLATTN_SUCCESS && next_candidate(&g, digit));
    return status;
}

/* The cases, and the start row: what the device gets now (a row, or for an op whose rows are
 * optional CLBlast's own parameters), which must itself pass. */
static int open_search(search *s, clattn_env *env) {
    const clattn__tuning_op *spec = s->space->spec;
    tune_result *r = s->result;
    bool found = false;
    int status = clattn_tuning_override(spec->name, NULL);
    if (status == CLATTN_SUCCESS)
        status = clattn__tuning_find(s->device, spec, CLATTN_F32, r->start, &found);
    if (status == CLATTN_SUCCESS) status = s->space->cases(env, true, s->cases, &s->count);
    if (status != CLATTN_SUCCESS) return status;
    r->start_known = found;
    r->cases = s->count;
    for (int i = 0; i < s->count; ++i)
        snprintf(r->case_shape[i], sizeof r->case_shape[i], "%s", s->cases[i].shape);
    clattn__tuning_format(spec, r->start, s->start_text, sizeof s->start_text);
    s->start = found ? s->start_text : NULL;
    bool ok = false;
    char why[256] = "";
    status = verify(s->cases, s->count, spec->name, s->start, &ok, why, sizeof why);
    if (status == CLATTN_SUCCESS && !ok) status = CLATTN_ERR_INVALID_TUNING;
    if (status != CLATTN_SUCCESS && s->settings->log)
        fprintf(s->settings->log, " the start row %s fails: %s\n",
                s->start ? s->start : "(the op's own)", why);
    if (status == CLATTN_SUCCESS && s->space->sequential) {
        bench_options opt = {.quick = true, .repeats = s->settings->repeats, .warmup = 2};
        status = bench_ceilings_open(&opt, env, &s->ceilings);
        for (int i = 0; i < s->count && status == CLATTN_SUCCESS; ++i)
            status = normalized_time(s, i, s->start, 2 * s->settings->repeats, &s->start_norm[i]);
    }
    return status;
}

/* The best so far: the start row, or without one the space's seed, tried first. */
static int seed_best(search *s) {
    tune_result *r = s->result;
    memcpy(r->best, r->start, sizeof r->best);
    r->ratio = 1.0;
    if (r->start_known) return CLATTN_SUCCESS;
    grid g;
    int status = parse_grid(s->space->spec, s->space->seed, &g);
    for (int i = 0; i < g.count && status == CLATTN_SUCCESS; ++i)
        r->best[g.param[i]] = g.value[i][0];
    if (status == CLATTN_SUCCESS && s->space->spec->fits(s->device, r->best))
        status = CLATTN_ERR_INVALID_TUNING;
    r->ratio = INFINITY;
    if (status == CLATTN_SUCCESS) status = try_candidate(s, r->best);
    return status;
}

int tune_search(clattn_env *env, const tune_space *space, const tune_settings *settings,
                tune_result *out) {
    memset(out, 0, sizeof *out);
    search s = {
        .space = space, .settings = settings, .device = clattn_env_device(env), .result = out};
    const double t0 = s.t0 = bench_now_ms();
    int status = open_search(&s, env);
    if (status == CLATTN_SUCCESS) status = seed_best(&s);
    for (int i = 0; i < TUNE_MAX_STAGES && space->stages[i] && status == CLATTN_SUCCESS; ++i)
        status = run_stage(&s, space->stages[i]);
    /* the winner's gain, timed again with twice the calls: the search's own figure favours
     * whichever candidate the noise flattered */
    char best[CLATTN_TUNING_PARAMS_MAX];
    clattn__tuning_format(space->spec, out->best, best, sizeof best);
    if (status == CLATTN_SUCCESS)
        status = time_ratio(&s, best, 2 * settings->repeats, &out->ratio, out->case_ratio);
    clattn_tuning_override(space->spec->name, NULL);
    if (space->sequential) bench_ceilings_close(&s.ceilings);
    tune_cases_free(s.cases, s.count);
    out->seconds = (bench_now_ms() - t0) / 1e3;
    return status;
}
