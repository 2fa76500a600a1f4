/* clattn-bench internals: timing, the device's ceilings, peer runs, records and the report. */
#ifndef CLATTN_BENCH_H
#define CLATTN_BENCH_H

#include "clattn.h"

#include <stdbool.h>
#include <stdio.h>

typedef struct bench_options {
    bool quick;
    int repeats, warmup;
    const char *op;   /* run only this op (NULL: all) */
    const char *only; /* and of its families' rows those whose key holds this text (NULL: all;
                       * set, the tuning, crossover and cold-start runs, which have no keys,
                       * are left out) */
    const char *peer_script; /* bench/peers/torch_ops.py; NULL: no peers */
    const char *python;      /* interpreter for the peer script */
    /* --apart: a row's calls back to back, then its ceiling's, not alternated (on a GPU the FMA
     * and matrix-unit ceilings draw the most power, and may lower the clocks the row then gets) */
    bool apart;
} bench_options;

#define BENCH_KERNELS 8
typedef struct bench_timing {
    double first_ms; /* the first call: program build + first run */
    double min_ms, median_ms;
    /* the median time until the call returned, before clFinish: the library's and the driver's
     * host work (argument checks, the program cache, enqueues); the rest of median_ms is the
     * device's and the queue's (launch latency) */
    double host_ms;
    /* with CLATTN_BENCH_KERNELS=1, one more call's kernels, by name in the order of their first
     * launch, and each one's device time (profiling events; those of a name summed) */
    int kernels;
    char kernel[BENCH_KERNELS][64]; /* as clattn__traced_kernel's names */
    double kernel_ms[BENCH_KERNELS];
    /* with those, where a ceiling was timed beside: the ceiling kernel's work per ns by its own
     * device time (the median of as many profiled runs as the row's repeats), so that the row's
     * kernels can be set against the ceiling's kernel, neither counting the host or the launch
     * (a call of tens of microseconds on a GPU spends a third of its time there); 0: none */
    double ceiling_device_rate;
} bench_timing;

/* One measured op call: enqueue on `queue` and return a clattn status. */
typedef int (*bench_fn)(void *ctx, cl_command_queue queue);

/* Times fn: one cold call, warm-up calls, then `repeats` calls each waited for with clFinish. */
int bench_time(const bench_options *opt, bench_fn fn, void *ctx, cl_command_queue queue,
               bench_timing *out);
/* The same, alternating each call of fn with a call of ref, so both see the same machine: on a
 * shared machine the bandwidth moves by half from one second to the next. */
int bench_time_beside(const bench_options *opt, bench_fn fn, void *ctx, bench_fn ref, void *ref_ctx,
                      cl_command_queue queue, bench_timing *out, bench_timing *ref_out);
/* One call of fn under the library's kernel trace: the name of its first kernel into `name`
 * (left as it was where the call ran none), so a row names the variant the library chose. */
int bench_kernel_that_ran(bench_fn fn, void *ctx, cl_command_queue queue, char name[64]);
double bench_now_ms(void);

/* The device's own ceilings (bench/roofline.cl): a copy kernel, an FMA kernel and, where
 * clattn_matrix_units found the f16 unit, a matrix-unit kernel, measured once at the start and
 * kept ready, so each op row can time its ceiling beside itself. */
typedef struct bench_ceiling_run bench_ceiling_run;
struct bench_ceiling_run {
    cl_kernel kernel;
    size_t global, local; /* local 0: the driver's choice */
    cl_mem buffers[2];
    double work; /* bytes moved (copy) or flops (FMA) per run */
};
typedef struct bench_ceilings {
    double copy_gbs, fma_gflops; /* measured at the start */
    double matrix_gflops;        /* the f16 matrix-unit kernel, 0 where it is not built */
    double launch_us;            /* one empty kernel, enqueue to clFinish (median) */
    /* the first call of every op family, program builds included (bench/first_calls.c), with
     * the driver's cache warm and empty; < 0: not measured */
    double first_warm_ms, first_cold_ms;
    char matrix_units[96]; /* clattn_matrix_units, in words: "mma-f16 mma-bf16", "none" */
    bench_timing copy, fma, launch, matrix;
    bench_ceiling_run copy_run, fma_run, nop_run, matrix_run;
} bench_ceilings;

int bench_ceilings_open(const bench_options *opt, clattn_env *env, bench_ceilings *out);
void bench_ceilings_close(bench_ceilings *c);
/* Times fn alternating with the FMA kernel; *fma_gflops is the FMA rate of those runs. */
int bench_time_vs_fma(const bench_options *opt, bench_ceilings *c, bench_fn fn, void *ctx,
                      cl_command_queue queue, bench_timing *out, double *fma_gflops);
/* A compute row of `dtype`: 16-bit rows alternate with the matrix-unit kernel where it was built
 * (*gflops its rate), the others (and every row elsewhere) with the FMA kernel. */
int bench_time_vs_compute(const bench_options *opt, bench_ceilings *c, clattn_dtype dtype,
                          bench_fn fn, void *ctx, cl_command_queue queue, bench_timing *out,
                          double *gflops);
/* Times fn alternating with the copy kernel; *copy_gbs is the copy bandwidth of those runs. */
int bench_time_vs_copy(const bench_options *opt, bench_ceilings *c, bench_fn fn, void *ctx,
                       cl_command_queue queue, bench_timing *out, double *copy_gbs);

/* A peer's timing of the same case, found by the case key ("split_heads f32 8,2048,1024,16"). */
#define BENCH_MAX_CASES 64
typedef struct bench_peer_results {
    int count;
    char key[BENCH_MAX_CASES][96];
    double median_ms[BENCH_MAX_CASES], min_ms[BENCH_MAX_CASES];
    char error[256]; /* why there are no results, if so */
} bench_peer_results;

/* Runs the torch peer script once for all keys (one process, one torch import). */
void bench_run_peers(const bench_options *opt, const char *const *keys, int count,
                     bench_peer_results *out);
/* The peer's median for `key`, or a negative value. */
double bench_peer_median(const bench_peer_results *peers, const char *key);

typedef struct bench_record {
    char op[32], variant[32], device[160], shape[96], dtype[8], metric[16];
    /* "ok", "wrong" (then not timed), "ablated" (wrong, timed: --time-wrong) or "-" (not
     * checked) */
    char check[8];
    bench_timing timing;
    double value;        /* in `metric` units */
    double ceiling;      /* the device's ceiling in the same units, timed beside this row */
    double roofline_pct; /* value / ceiling */
    /* with CLATTN_BENCH_KERNELS=1: the same by device times alone, the row's traced kernels'
     * (their first BENCH_KERNELS names) against the ceiling kernel's (0: not measured) */
    double device_roofline_pct;
    double torch_ms; /* the peer's median; < 0 when not measured */
} bench_record;

typedef struct bench_report {
    bench_record *records;
    int count, capacity;
    /* the verdict of the check before the next row (bench_check_row), and its first
     * mismatch */
    char check[8], check_detail[256];
    bool time_wrong; /* --time-wrong: a wrong row is timed too, its check "ablated" */
} bench_report;

bench_record *bench_report_add(bench_report *report);
/* Adds and prints the row of a memory-bound op: GB/s from `bytes` moved per call, against the
 * copy bandwidth timed beside it, and the peer's median (< 0: none). */
int bench_add_memory_row(bench_report *report, const clattn_env *env, const char *op,
                         const char *variant, clattn_dtype dtype, const char *shape,
                         const bench_timing *timing, double bytes, double copy_gbs,
                         double torch_ms);
/* The same for a compute-bound op: GFLOP/s from `flops` per call against the FMA rate. */
int bench_add_compute_row(bench_report *report, const clattn_env *env, const char *op,
                          const char *variant, clattn_dtype dtype, const char *shape,
                          const bench_timing *timing, double flops, double fma_gflops,
                          double torch_ms);
/* Adds and prints a row whose result was wrong: no timing, no value. */
int bench_add_wrong_row(bench_report *report, const clattn_env *env, const char *op,
                        const char *variant, clattn_dtype dtype, const char *shape);
void bench_print_header(FILE *out);
void bench_print_record(FILE *out, const bench_record *r);
int bench_write_json(const char *path, const bench_report *report,
                     const clattn_device_desc *devices, const bench_ceilings *ceilings,
                     int num_devices);

/* ---- the correctness check before each row (bench/check.c) ---- */

/* Fills a contiguous tensor with uniform values in [-scale, scale) from `seed`, rounded to its
 * dtype; *host (when not NULL) receives them as floats, dense, for the caller to free. */
int bench_fill_random(clattn_env *env, const clattn_tensor *t, uint64_t seed, float scale,
                      float **host);
/* A contiguous tensor's values as dense floats (*host malloc'ed). */
int bench_read(clattn_env *env, const clattn_tensor *t, float **host);
/* |got - want| <= tol (|want| + scale): scale is the size of the terms a sum cancelled. False
 * records the mismatch in report->check_detail. */
bool bench_close(bench_report *report, const char *what, size_t index, double got, double want,
                 double scale, clattn_dtype dtype);
/* A random index below n. */
size_t bench_sample(uint64_t *state, size_t n);
/* Checks the output of the call just made: *ok says whether it matched; a status otherwise. */
typedef int (*bench_check_fn)(void *ctx, clattn_env *env, bench_report *report, bool *ok);
/* One query row of attention in float64: out = softmax(q k_j / sqrt(d)) v over the first
 * `keys` rows of k and v (d wide each); w holds `keys` scratch doubles. */
void bench_attention_row(const float *q, const float *k, const float *v, int64_t d, int64_t keys,
                         double *w, double *out);

/* What names a row in the table. */
typedef struct bench_row_name {
    const char *op, *variant;
    clattn_dtype dtype;
    const char *shape;
} bench_row_name;
/* Runs fn once, waits, and checks its result: report->check becomes "ok" or "wrong" (then the
 * untimed row is added and *wrong says to skip the timing; with report->time_wrong, "ablated"
 * and the row is timed); the first mismatch goes to stderr. */
int bench_check_row(bench_report *report, clattn_env *env, bench_fn fn, void *ctx,
                    bench_check_fn check, const bench_row_name *row, bool *wrong);

/* ---- the cold-start cost (bench/first_calls.c) ---- */

/* Clears clattn's and CLBlast's program caches and times one small call of every op family. */
int bench_first_calls(clattn_env *env, double *ms);
/* The same in a child process (this executable, --first-calls-only) whose driver caches start
 * empty; < 0 when it could not be measured. */
double bench_first_calls_empty_cache(const char *spec);

/* One op family: its cases by index, how --op and the peer name them, and how one is measured
 * (allocate, time beside a ceiling, add the row, free). */
typedef struct bench_family {
    int count;
    const char *(*op)(const void *cases, int i);
    void (*key)(const void *cases, int i, char *key, size_t capacity);
    int (*measure)(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                   const void *cases, int i, double torch_ms, bench_report *report);
} bench_family;

/* A caller workspace of `bytes` for the ops that take one (an OpenCL status). */
int bench_workspace(clattn_env *env, size_t bytes, cl_mem *out);

int bench_run_family(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                     bench_report *report, const bench_family *family, const void *cases);

/* The op families. Each adds its rows for one device. */
int bench_heads(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                bench_report *report);
int bench_softmax(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                  bench_report *report);
int bench_attention(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                    bench_report *report);
/* The attention backward (bench/bench_attention_backward.c). */
int bench_attention_backward(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                             bench_report *report);
int bench_linear(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                 bench_report *report);
/* GEMMs (CLBlast's database, then the tuning table's gemm row) and the MHA forward
 * (bench/bench_mha.c); it runs first, while CLBlast still has its own parameters. */
int bench_mha(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
              bench_report *report);
/* The tuning table's default row beside this device's own (bench/bench_tuning.c). */
int bench_tuning(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                 bench_report *report);

#endif
