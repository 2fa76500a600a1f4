/* Tuning: each tuned op's cases (tune/) with the table's default row beside the row this
 * device gets (its tuned row, if the table has one), timed alternately call by call, so the
 * ratio holds on a machine whose speed drifts. The default row is what a device without a row
 * of its own runs; --op tuning. An op without a row of its own is timed all the same: the row
 * against itself shows the noise. The rows' ceiling is the one measured at the start (the two
 * rows alternate with each other, not with a ceiling). The gemm row is not here: CLBlast
 * rebuilds its GEMM on each change of parameters, so they cannot alternate; clattn-tune
 * reports its gain. */
#include "bench.h"

#include "../tune/tune.h"

#include <stdio.h>
#include <string.h>

typedef struct tuned_op {
    const clattn__tuning_op *spec;
    tune_cases_fn cases;
} tuned_op;

static const tuned_op tuned_ops[] = {
    {&clattn__tuning_copy, tune_copy_cases},
    {&clattn__tuning_softmax, tune_softmax_cases},
    {&clattn__tuning_attention, tune_attention_cases},
    {&clattn__tuning_linear_attention, tune_linear_cases},
    {&clattn__tuning_matmul, tune_matmul_cases},
};

static int add_row(bench_report *report, clattn_env *env, const bench_ceilings *ceilings,
                   const tune_case *c, const char *op, const char *variant,
                   const bench_timing *timing) {
    if (c->compute)
        return bench_add_compute_row(report, env, op, variant, CLATTN_F32, c->shape, timing,
                                     c->work, ceilings->fma_gflops, -1.0);
    return bench_add_memory_row(report, env, op, variant, CLATTN_F32, c->shape, timing, c->work,
                                ceilings->copy_gbs, -1.0);
}

/* The case's whole output against its float64 reference, at the tuner's tolerance. */
static int check_run(void *p, clattn_env *env, bench_report *report, bool *ok) {
    (void)env;
    tune_run *r = p;
    return tune_check(r->c, ok, report->check_detail, sizeof report->check_detail);
}

/* The two rows of one case, each checked first, and the ratio. */
static int measure_case(const bench_options *opt, clattn_env *env, const bench_ceilings *ceilings,
                        tune_case *c, const char *op, const char *defaults, const char *tuned,
                        bench_report *report) {
    tune_run runs[2] = {{c, op, defaults}, {c, op, tuned}};
    const char *variants[2] = {"default", "tuned"};
    bool wrong[2] = {false, false};
    char checks[2][sizeof report->check]; /* each row's verdict ("ok", or "ablated") */
    int status = CLATTN_SUCCESS;
    for (int v = 0; v < 2 && status == CLATTN_SUCCESS; ++v) {
        const bench_row_name row = {op, variants[v], CLATTN_F32, c->shape};
        status = bench_check_row(report, env, tune_run_with, &runs[v], check_run, &row, &wrong[v]);
        snprintf(checks[v], sizeof checks[v], "%s", report->check);
    }
    if (status != CLATTN_SUCCESS || wrong[0] || wrong[1]) return status;
    bench_timing t_default, t_tuned;
    status = bench_time_beside(opt, tune_run_with, &runs[0], tune_run_with, &runs[1],
                               clattn_env_queue(env), &t_default, &t_tuned);
    snprintf(report->check, sizeof report->check, "%s", checks[0]);
    if (status == CLATTN_SUCCESS)
        status = add_row(report, env, ceilings, c, op, "default", &t_default);
    snprintf(report->check, sizeof report->check, "%s", checks[1]);
    if (status == CLATTN_SUCCESS) status = add_row(report, env, ceilings, c, op, "tuned", &t_tuned);
    if (status == CLATTN_SUCCESS)
        printf("  %s %s: tuned/default time %.2fx\n", op, c->shape,
               t_tuned.median_ms / t_default.median_ms);
    return status;
}

static int measure_op(const bench_options *opt, clattn_env *env, const bench_ceilings *ceilings,
                      const tuned_op *t, bench_report *report) {
    long defaults[CLATTN__TUNING_MAX_PARAMS], tuned[CLATTN__TUNING_MAX_PARAMS];
    char default_text[CLATTN_TUNING_PARAMS_MAX], tuned_text[CLATTN_TUNING_PARAMS_MAX];
    const char *op = t->spec->name;
    int status = clattn_tuning_override(op, NULL);
    if (status == CLATTN_SUCCESS)
        status = clattn__tuning_row(t->spec, CLATTN_F32, "default", defaults);
    if (status == CLATTN_SUCCESS)
        status = clattn__tuning_get(clattn_env_device(env), t->spec, CLATTN_F32, tuned);
    if (status != CLATTN_SUCCESS) return status;
    /* the default row is used as it is only where it fits (elsewhere the op clamps it) */
    const char *unfit = t->spec->fits(clattn_env_device(env), defaults);
    if (unfit) {
        printf("  %s: the default row does not fit this device (%s): no comparison\n", op, unfit);
        return CLATTN_SUCCESS;
    }
    clattn__tuning_format(t->spec, defaults, default_text, sizeof default_text);
    clattn__tuning_format(t->spec, tuned, tuned_text, sizeof tuned_text);
    printf("  %s: default %s, tuned %s%s\n", op, default_text, tuned_text,
           strcmp(default_text, tuned_text) == 0 ? " (the same: no row of its own)" : "");
    tune_case cases[TUNE_MAX_CASES];
    int count = 0;
    status = t->cases(env, true, cases, &count); /* with references: each row is checked */
    for (int i = 0; i < count && status == CLATTN_SUCCESS; ++i)
        status = measure_case(opt, env, ceilings, &cases[i], op, default_text, tuned_text, report);
    /* said here: clearing the override below clears the last error too */
    if (status != CLATTN_SUCCESS)
        fprintf(stderr, "clattn-bench: tuning %s: %s: %s\n", op, clattn_status_name(status),
                clattn_last_error());
    clattn_tuning_override(op, NULL);
    tune_cases_free(cases, count);
    return status;
}

int bench_tuning(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                 bench_report *report) {
    if ((opt->op && strcmp(opt->op, "tuning") != 0) || opt->only) return CLATTN_SUCCESS;
    int status = CLATTN_SUCCESS;
    for (size_t i = 0; i < sizeof tuned_ops / sizeof tuned_ops[0] && status == CLATTN_SUCCESS; ++i)
        status = measure_op(opt, env, ceilings, &tuned_ops[i], report);
    return status;
}
