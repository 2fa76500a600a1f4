/* clattn-bench internals: timing, the device's ceilings, peer runs, records and the report. */
#ifndef CLATTN_BENCH_H
#define CLATTN_BENCH_H

#include "clattn.h"

#include <stdbool.h>
#include <stdio.h>

typedef struct bench_options {
    bool quick;
    int repeats, warmup;
    const char *op;          /* run only this op (NULL: all) */
    const char *peer_script; /* bench/peers/torch_ops.py; NULL: no peers */
    const char *python;      /* interpreter for the peer script */
} bench_options;

typedef struct bench_timing {
    double first_ms; /* the first call: program build + first run */
    double min_ms, median_ms;
} bench_timing;

/* One measured op call: enqueue on `queue` and return a clattn status. */
typedef int (*bench_fn)(void *ctx, cl_command_queue queue);

/* Times fn: one cold call, warm-up calls, then `repeats` calls each waited for with clFinish. */
int bench_time(const bench_options *opt, bench_fn fn, void *ctx, cl_command_queue queue,
               bench_timing *out);
double bench_now_ms(void);

typedef struct bench_ceilings {
    double copy_gbs, fma_gflops;
    bench_timing copy, fma;
} bench_ceilings;

int bench_measure_ceilings(const bench_options *opt, clattn_env *env, bench_ceilings *out);

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
    bench_timing timing;
    double value;        /* in `metric` units */
    double roofline_pct; /* of the measured copy bandwidth or FMA peak */
    double torch_ms;     /* the peer's median; < 0 when not measured */
} bench_record;

typedef struct bench_report {
    bench_record *records;
    int count, capacity;
} bench_report;

bench_record *bench_report_add(bench_report *report);
void bench_print_header(FILE *out);
void bench_print_record(FILE *out, const bench_record *r);
int bench_write_json(const char *path, const bench_report *report, const char *const *devices,
                     const bench_ceilings *ceilings, int num_devices);

/* The op families. Each adds its rows for one device. */
int bench_heads(const bench_options *opt, clattn_env *env, const bench_ceilings *ceilings,
                bench_report *report);

#endif
