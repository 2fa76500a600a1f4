/*
 * clattn-bench: a measurement, never a test. For each device it measures the device's own
 * ceilings (copy GB/s, FMA GFLOP/s), then each op with a warm-up, the first (building) call
 * reported apart, and min and median of the repeats, beside PyTorch on the CPU timed on the same
 * shapes in the same run.
 *
 *   clattn-bench [--device SPEC|all] [--op NAME] [--only TEXT] [--quick] [--json FILE]
 *                [--repeats N] [--peer-script PATH | --no-peers] [--time-wrong]
 */
#include "bench.h"

#include <stdlib.h>
#include <string.h>

#ifndef CLATTN_SOURCE_DIR
#define CLATTN_SOURCE_DIR "."
#endif

static void usage(FILE *out) {
    fprintf(out, "usage: clattn-bench [--device SPEC|all] [--op NAME] [--only TEXT] [--quick]\n"
                 "                    [--json FILE] [--repeats N]\n"
                 "                    [--peer-script PATH | --no-peers] [--time-wrong] [--apart]\n"
                 "  SPEC: P:D or a name substring (as CLATTN_DEVICE); all: every device\n"
                 "  NAME: split_heads | merge_heads | split_qkv | transpose | softmax |\n"
                 "        softmax_masked | attention | attention_causal | attention_memory |\n"
                 "        attention_decode | attention_backward | attention_backward_causal |\n"
                 "        attention_backward_memory | attention_backward_cross |\n"
                 "        attention_backward_gqa | attention_backward_bias |\n"
                 "        linear_attention_backward |\n"
                 "        linear_attention_backward_causal |\n"
                 "        linear_attention | linear_attention_causal | linear_step |\n"
                 "        linear_crossover | gemm | mha | tuning\n"
                 "  TEXT: only the rows whose key holds it (\"f16 4,8,1024,64\")\n"
                 "  --time-wrong: time rows whose check failed too (check: ablated)\n"
                 "  --apart: time a row's calls back to back, then its ceiling's (default:\n"
                 "           alternated, so both see the same machine)\n");
}

typedef struct bench_args {
    bench_options opt;
    const char *device, *json;
    bool first_calls_only; /* the child of bench_first_calls_empty_cache */
    bool time_wrong;
} bench_args;

static int parse_args(int argc, char **argv, bench_args *a) {
    static char default_script[1024];
    snprintf(default_script, sizeof default_script, "%s/bench/peers/torch_ops.py",
             CLATTN_SOURCE_DIR);
    const char *python = getenv("CLATTN_PYTHON");
    a->opt = (bench_options){
        false, 0, 3, NULL, NULL, default_script, python ? python : "/usr/bin/python3", false};
    a->device = NULL;
    a->json = NULL;
    a->first_calls_only = false;
    a->time_wrong = false;
    for (int i = 1; i < argc; ++i) {
        const char *arg = argv[i];
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "--quick") == 0)
            a->opt.quick = true;
        else if (strcmp(arg, "--no-peers") == 0)
            a->opt.peer_script = NULL;
        else if (strcmp(arg, "--time-wrong") == 0)
            a->time_wrong = true;
        else if (strcmp(arg, "--apart") == 0)
            a->opt.apart = true;
        else if (strcmp(arg, "--first-calls-only") == 0)
            a->first_calls_only = true;
        else if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0)
            return 1;
        else if (next && strcmp(arg, "--device") == 0)
            a->device = argv[++i];
        else if (next && strcmp(arg, "--op") == 0)
            a->opt.op = argv[++i];
        else if (next && strcmp(arg, "--only") == 0)
            a->opt.only = argv[++i];
        else if (next && strcmp(arg, "--json") == 0)
            a->json = argv[++i];
        else if (next && strcmp(arg, "--peer-script") == 0)
            a->opt.peer_script = argv[++i];
        else if (next && strcmp(arg, "--repeats") == 0)
            a->opt.repeats = atoi(argv[++i]);
        else {
            fprintf(stderr, "clattn-bench: unknown or incomplete option %s\n", arg);
            return 2;
        }
    }
    if (a->opt.repeats <= 0) a->opt.repeats = a->opt.quick ? 5 : 15;
    return 0;
}

/* The cold-start cost, last: it clears the program caches (CLBlast's with them, so the gemm
 * family's CLBlast-database rows, which come first, are not disturbed). */
static int cold_start(const bench_options *opt, clattn_env *env, const char *spec,
                      bench_ceilings *ceilings) {
    int status = bench_first_calls(env, &ceilings->first_warm_ms);
    /* from an empty cache every program builds from source: on PoCL a minute and a half,
     * which --quick leaves out */
    if (!opt->quick) ceilings->first_cold_ms = bench_first_calls_empty_cache(spec);
    char cold[64] = "not measured with --quick";
    if (ceilings->first_cold_ms >= 0)
        snprintf(cold, sizeof cold, "%.0f ms", ceilings->first_cold_ms);
    if (status == CLATTN_SUCCESS)
        printf("cold start: the first call of every op family (split heads, softmax, attention, "
               "linear attention, MHA with weights) took %.0f ms with the driver's cache warm; "
               "with it empty, %s\n",
               ceilings->first_warm_ms, cold);
    return status;
}

/* --first-calls-only: the child's whole job. */
static int first_calls_only(const char *spec) {
    clattn_env *env = NULL;
    double ms = -1.0;
    int status = clattn_env_create(spec, &env);
    if (status == CLATTN_SUCCESS) status = bench_first_calls(env, &ms);
    if (status == CLATTN_SUCCESS) printf("first_calls_ms %.3f\n", ms);
    if (env) clattn_env_release(env);
    return status == CLATTN_SUCCESS ? 0 : 1;
}

/* The units clattn_matrix_units finds, as words; "none", or the failure. */
static void matrix_unit_words(cl_command_queue queue, char *out, size_t capacity) {
    unsigned units = 0;
    int status = clattn_matrix_units(queue, &units);
    size_t n = (size_t)snprintf(out, capacity, "%s",
                                status != CLATTN_SUCCESS ? clattn_status_name(status) : "");
    for (unsigned bit = 1; bit != 0 && n < capacity; bit <<= 1)
        if (units & bit)
            n += (size_t)snprintf(out + n, capacity - n, "%s%s", n ? " " : "",
                                  clattn_matrix_unit_name(bit));
    if (out[0] == '\0') snprintf(out, capacity, "none");
}

static int bench_device(const bench_args *a, const char *spec, bench_report *report,
                        bench_ceilings *ceilings, clattn_device_desc *desc) {
    clattn_env *env = NULL;
    int status = clattn_env_create(spec, &env);
    if (status != CLATTN_SUCCESS) {
        fprintf(stderr, "clattn-bench: device %s: %s: %s\n", spec ? spec : "(default)",
                clattn_status_name(status), clattn_last_error());
        return status;
    }
    const clattn_device_desc *d = clattn_env_device_desc(env);
    *desc = *d;
    printf("\n== %s / %s (%s, driver %s)\n", d->platform_name, d->name, d->version, d->driver);
    char facts[8192];
    if (clattn_device_facts(d->device, facts, sizeof facts) == CLATTN_SUCCESS)
        printf("facts: %s\n", facts);
    status = bench_ceilings_open(&a->opt, env, ceilings);
    if (status == CLATTN_SUCCESS) {
        matrix_unit_words(clattn_env_queue(env), ceilings->matrix_units,
                          sizeof ceilings->matrix_units);
        printf("matrix units: %s (each probed on an exact product; clattn_matrix_units)\n",
               ceilings->matrix_units);
        printf("ceilings: copy %.1f GB/s (float4 stream, %s each way), FMA %.1f GFLOP/s, launch "
               "%.0f us (an empty kernel, enqueue to finish)\n",
               ceilings->copy_gbs, a->opt.quick ? "16 MiB" : "64 MiB", ceilings->fma_gflops,
               ceilings->launch_us);
        if (ceilings->matrix_gflops > 0)
            printf("matrix-unit ceiling: %.1f GFLOP/s (f16 products back to back; the 16-bit "
                   "fused attention rows' ceiling)\n",
                   ceilings->matrix_gflops);
        printf("value: GB/s counts one read and one write of every element, GFLOP/s 4*B*H*Sq*Sk*D "
               "(halved when causal), linear attention\n4*B*H*S*D*Dv (causal too);\nceiling: the "
               "copy (GB/s) or FMA (GFLOP/s; 16-bit fused attention: the matrix-unit kernel "
               "where built) kernel timed alternately with the row; %%roof: value / "
               "ceiling;\ntorch/us: PyTorch median / "
               "ours (> 1: we are faster)\n\n");
        bench_print_header(stdout);
        status = bench_mha(&a->opt, env, ceilings, report);
        if (status == CLATTN_SUCCESS) status = bench_heads(&a->opt, env, ceilings, report);
        if (status == CLATTN_SUCCESS) status = bench_softmax(&a->opt, env, ceilings, report);
        if (status == CLATTN_SUCCESS) status = bench_attention(&a->opt, env, ceilings, report);
        if (status == CLATTN_SUCCESS)
            status = bench_attention_backward(&a->opt, env, ceilings, report);
        if (status == CLATTN_SUCCESS) status = bench_linear(&a->opt, env, ceilings, report);
        if (status == CLATTN_SUCCESS) status = bench_tuning(&a->opt, env, ceilings, report);
        if (status == CLATTN_SUCCESS && !a->opt.op && !a->opt.only)
            status = cold_start(&a->opt, env, spec, ceilings);
        bench_ceilings_close(ceilings);
    }
    if (status != CLATTN_SUCCESS)
        fprintf(stderr, "clattn-bench: %s: %s: %s\n", d->name, clattn_status_name(status),
                clattn_last_error());
    clattn_env_release(env);
    return status;
}

int main(int argc, char **argv) {
    bench_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) {
        usage(rc == 1 ? stdout : stderr);
        return rc == 1 ? 0 : 2;
    }
    if (a.first_calls_only) return first_calls_only(a.device);
    enum { MAX_DEVICES = 16 };
    char specs[MAX_DEVICES][32];
    clattn_device_desc descs[MAX_DEVICES];
    bench_ceilings ceilings[MAX_DEVICES];
    int num_devices = 0;
    if (a.device && strcmp(a.device, "all") == 0) {
        clattn_device_desc list[MAX_DEVICES];
        size_t count = 0;
        if (clattn_list_devices(list, MAX_DEVICES, &count) != CLATTN_SUCCESS || count == 0) {
            fprintf(stderr, "clattn-bench: no OpenCL device: %s\n", clattn_last_error());
            return 1;
        }
        for (size_t i = 0; i < count && i < MAX_DEVICES; ++i)
            snprintf(specs[num_devices++], sizeof specs[0], "%d:%d", list[i].platform_index,
                     list[i].device_index);
    } else {
        snprintf(specs[num_devices++], sizeof specs[0], "%s", a.device ? a.device : "");
    }
    bench_report report;
    memset(&report, 0, sizeof report);
    report.time_wrong = a.time_wrong;
    int failures = 0;
    for (int i = 0; i < num_devices; ++i) {
        memset(&descs[i], 0, sizeof descs[i]);
        memset(&ceilings[i], 0, sizeof ceilings[i]);
        if (bench_device(&a, specs[i][0] ? specs[i] : NULL, &report, &ceilings[i], &descs[i]) !=
            CLATTN_SUCCESS)
            ++failures;
    }
    if (a.json && bench_write_json(a.json, &report, descs, ceilings, num_devices) != 0) {
        fprintf(stderr, "clattn-bench: cannot write %s\n", a.json);
        ++failures;
    }
    free(report.records);
    return failures ? 1 : 0;
}
