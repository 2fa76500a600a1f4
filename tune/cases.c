/* What every tuned op's cases share: inputs, tensors, the workspace, and the check against the
 * float64 reference. */
#include "tune.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

float *tune_random(size_t n, uint64_t *seed, float lo, float hi) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; x && i < n; ++i) {
        *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = lo + (hi - lo) * (float)((*seed >> 40) * (1.0 / 16777216.0));
    }
    return x;
}

int tune_tensor(tune_case *c, const int64_t shape[4], const float *host, clattn_tensor *out) {
    int status = clattn_env_alloc(c->env, CLATTN_F32, shape, out);
    if (status == CLATTN_SUCCESS && host) status = clattn_env_upload(c->env, out, host);
    return status;
}

int tune_workspace(tune_case *c, size_t bytes) {
    if (bytes <= c->workspace_bytes) return CLATTN_SUCCESS;
    if (c->workspace) clReleaseMemObject(c->workspace);
    c->workspace_bytes = 0;
    cl_int err = CL_SUCCESS;
    c->workspace = clCreateBuffer(clattn_env_context(c->env), CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err == CL_SUCCESS) c->workspace_bytes = bytes;
    return err == CL_SUCCESS ? CLATTN_SUCCESS : err;
}

int tune_run_with(void *run, cl_command_queue queue) {
    tune_run *r = run;
    int status = clattn_tuning_override(r->op, r->params);
    if (status == CLATTN_SUCCESS) status = r->c->enqueue(r->c, queue);
    return status;
}

static bool within(const tune_case *c, size_t i, double got) {
    const double want = c->ref[i];
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return got == want;
    const double atol = c->atol * (c->err_scale ? c->err_scale[i] : 1.0);
    return fabs(got - want) <= atol + c->rtol * fabs(want);
}

int tune_check(tune_case *c, bool *match, char *why, size_t capacity) {
    const size_t n =
        (size_t)(c->out.shape[0] * c->out.shape[1] * c->out.shape[2] * c->out.shape[3]);
    float *got = malloc(n * sizeof *got);
    int status = got ? clattn_env_download(c->env, &c->out, got) : CLATTN_ERR_OUT_OF_HOST_MEMORY;
    *match = status == CLATTN_SUCCESS;
    for (size_t i = 0; *match && i < n; ++i)
        if (!within(c, i, got[i])) {
            snprintf(why, capacity, "%s: out[%zu] = %.9g, expected %.9g", c->shape, i, got[i],
                     c->ref[i]);
            *match = false;
        }
    free(got);
    return status;
}

int tune_make_cases(clattn_env *env, bool with_reference, int n,
                    int (*make)(tune_case *c, bool with_reference, int index), tune_case *cases,
                    int *count) {
    int status = CLATTN_SUCCESS;
    *count = 0;
    for (int i = 0; i < n && i < TUNE_MAX_CASES && status == CLATTN_SUCCESS; ++i) {
        memset(&cases[i], 0, sizeof cases[i]);
        cases[i].env = env;
        status = make(&cases[i], with_reference, i);
        *count = i + 1;
    }
    if (status != CLATTN_SUCCESS) {
        tune_cases_free(cases, *count);
        *count = 0;
    }
    return status;
}

void tune_case_free(tune_case *c) {
    for (int i = 0; i < 3; ++i) clattn_tensor_free(&c->in[i]);
    clattn_tensor_free(&c->out);
    if (c->workspace) clReleaseMemObject(c->workspace);
    free(c->ref);
    free(c->err_scale);
    memset(c, 0, sizeof *c);
}

void tune_cases_free(tune_case *cases, int count) {
    for (int i = 0; i < count; ++i) tune_case_free(&cases[i]);
}
