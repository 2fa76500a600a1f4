/* clattn-tune internals: the cases each tuned op runs (tensors on the device, the float64
 * reference of the output, the tests' tolerance for it) and the search over the tuning table's
 * parameters. The benchmark's default-vs-tuned rows run the same cases. */
#ifndef CLATTN_TUNE_H
#define CLATTN_TUNE_H

#include "clattn.h"
#include "runtime/tuning.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TUNE_MAX_CASES 4

typedef struct tune_case tune_case;

/* One shape of an op, ready to run. */
struct tune_case {
    char shape[96];
    clattn_env *env;
    clattn_tensor in[3], out;
    clattn_mask mask;
    int64_t heads;    /* split heads: H */
    cl_mem workspace; /* grown as a candidate asks for more (tune_workspace) */
    size_t workspace_bytes;
    double *ref;       /* float64 reference of out (NULL: not computed) */
    double *err_scale; /* NULL, or each element's error scale (atol applies times it) */
    double atol, rtol; /* |out - ref| <= atol (* err_scale) + rtol * |ref| */
    double work;       /* per call: flops (compute) or bytes moved (not compute) */
    bool compute;
    int (*enqueue)(tune_case *c, cl_command_queue queue);
};

/* The cases of one op. with_reference: compute the float64 references (the tuner checks every
 * candidate; the benchmark only times). Each returns a clattn status; on failure the cases
 * made so far are freed and *count is 0. */
typedef int (*tune_cases_fn)(clattn_env *env, bool with_reference, tune_case *cases, int *count);
int tune_copy_cases(clattn_env *env, bool with_reference, tune_case *cases, int *count);
int tune_softmax_cases(clattn_env *env, bool with_reference, tune_case *cases, int *count);
int tune_attention_cases(clattn_env *env, bool with_reference, tune_case *cases, int *count);
int tune_linear_cases(clattn_env *env, bool with_reference, tune_case *cases, int *count);
int tune_gemm_cases(clattn_env *env, bool with_reference, tune_case *cases, int *count);
int tune_matmul_cases(clattn_env *env, bool with_reference, tune_case *cases, int *count);

/* One call of c's op with `params` ("NAME=VALUE,..." of tuning op `op`) in force: the override
 * is set on every call, so two parameter sets can alternate call by call. A bench_fn. */
typedef struct tune_run {
    tune_case *c;
    const char *op, *params;
} tune_run;
int tune_run_with(void *run, cl_command_queue queue);

/* ---- shared by the op files (tune/cases.c) ---- */

/* Makes `n` cases with make(case, with_reference, index) (c->env set, the rest zero); on a
 * failure frees those made and leaves *count 0. */
int tune_make_cases(clattn_env *env, bool with_reference, int n,
                    int (*make)(tune_case *c, bool with_reference, int index), tune_case *cases,
                    int *count);

/* Uniform floats in [lo, hi), from a fixed seed (the same inputs every run). */
float *tune_random(size_t n, uint64_t *seed, float lo, float hi);
/* A contiguous f32 tensor of `shape` in c's env, holding `host` (NULL: left unwritten). */
int tune_tensor(tune_case *c, const int64_t shape[4], const float *host, clattn_tensor *out);
/* Makes c->workspace at least `bytes` (0: keeps what is there). */
int tune_workspace(tune_case *c, size_t bytes);
/* Downloads c->out and compares it with c->ref: *match says whether every element is within the
 * tolerance; if not, `why` names the first that is not. */
int tune_check(tune_case *c, bool *match, char *why, size_t capacity);
void tune_case_free(tune_case *c);
void tune_cases_free(tune_case *cases, int count);

#endif
