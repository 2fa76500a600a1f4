/* The benchmark's table (stdout) and JSON file. */
#include "bench.h"

#include <stdlib.h>
#include <string.h>

bench_record *bench_report_add(bench_report *report) {
    if (report->count == report->capacity) {
        int capacity = report->capacity ? report->capacity * 2 : 32;
        bench_record *grown = realloc(report->records, (size_t)capacity * sizeof *grown);
        if (!grown) return NULL;
        report->records = grown;
        report->capacity = capacity;
    }
    bench_record *r = &report->records[report->count++];
    memset(r, 0, sizeof *r);
    r->torch_ms = -1.0;
    return r;
}

static int add_row(bench_report *report, const clattn_env *env, const char *op, const char *variant,
                   clattn_dtype dtype, const char *shape, const bench_timing *timing,
                   const char *metric, double work, double ceiling, double torch_ms) {
    bench_record *r = bench_report_add(report);
    if (!r) return CLATTN_ERR_OUT_OF_HOST_MEMORY;
    snprintf(r->op, sizeof r->op, "%s", op);
    snprintf(r->variant, sizeof r->variant, "%s", variant);
    snprintf(r->device, sizeof r->device, "%s", clattn_env_device_desc(env)->name);
    snprintf(r->dtype, sizeof r->dtype, "%s", clattn_dtype_name(dtype));
    snprintf(r->shape, sizeof r->shape, "%s", shape);
    snprintf(r->metric, sizeof r->metric, "%s", metric);
    r->timing = *timing;
    r->value = timing->median_ms > 0 ? work / (timing->median_ms * 1e6) : 0.0;
    r->ceiling = ceiling;
    r->roofline_pct = 100.0 * r->value / ceiling;
    double device_ms = 0.0;
    for (int k = 0; k < timing->kernels; ++k) device_ms += timing->kernel_ms[k];
    if (device_ms > 0.0 && timing->ceiling_device_rate > 0.0)
        r->device_roofline_pct = 100.0 * work / (device_ms * 1e6) / timing->ceiling_device_rate;
    r->torch_ms = torch_ms;
    snprintf(r->check, sizeof r->check, "%s", report->check[0] ? report->check : "-");
    report->check[0] = '\0';
    bench_print_record(stdout, r);
    return CLATTN_SUCCESS;
}

int bench_add_wrong_row(bench_report *report, const clattn_env *env, const char *op,
                        const char *variant, clattn_dtype dtype, const char *shape) {
    const bench_timing none = {0};
    snprintf(report->check, sizeof report->check, "wrong");
    return add_row(report, env, op, variant, dtype, shape, &none, "-", 0.0, 1.0, -1.0);
}

int bench_add_memory_row(bench_report *report, const clattn_env *env, const char *op,
                         const char *variant, clattn_dtype dtype, const char *shape,
                         const bench_timing *timing, double bytes, double copy_gbs,
                         double torch_ms) {
    return add_row(report, env, op, variant, dtype, shape, timing, "GB/s", bytes, copy_gbs,
                   torch_ms);
}

int bench_add_compute_row(bench_report *report, const clattn_env *env, const char *op,
                          const char *variant, clattn_dtype dtype, const char *shape,
                          const bench_timing *timing, double flops, double fma_gflops,
                          double torch_ms) {
    return add_row(report, env, op, variant, dtype, shape, timing, "GFLOP/s", flops, fma_gflops,
                   torch_ms);
}

void bench_print_header(FILE *out) {
    fprintf(out, "%-13s %-15s %-5s %-24s %-7s %9s %9s %9s %11s %11s %6s %9s %8s\n", "op", "variant",
            "dtype", "shape", "check", "median_ms", "min_ms", "first_ms", "value", "ceiling",
            "%roof", "torch_ms", "torch/us");
}

void bench_print_record(FILE *out, const bench_record *r) {
    char value[32], ceiling[32], torch[16] = "n/a", ratio[16] = "n/a";
    snprintf(value, sizeof value, "%.1f %s", r->value, r->metric);
    snprintf(ceiling, sizeof ceiling, "%.1f %s", r->ceiling, r->metric);
    if (strcmp(r->check, "wrong") == 0) {
        fprintf(out, "%-13s %-15s %-5s %-24s %-7s (wrong result: not timed)\n", r->op, r->variant,
                r->dtype, r->shape, "WRONG");
        fflush(out);
        return;
    }
    if (r->torch_ms >= 0) {
        snprintf(torch, sizeof torch, "%.3f", r->torch_ms);
        snprintf(ratio, sizeof ratio, "%.2fx", r->torch_ms / r->timing.median_ms);
    }
    fprintf(out, "%-13s %-15s %-5s %-24s %-7s %9.3f %9.3f %9.1f %11s %11s %5.0f%% %9s %8s\n", r->op,
            r->variant, r->dtype, r->shape, r->check, r->timing.median_ms, r->timing.min_ms,
            r->timing.first_ms, value, ceiling, r->roofline_pct, torch, ratio);
    for (int k = 0; k < r->timing.kernels; ++k)
        fprintf(out, "%s%s %.3f ms", k ? ", " : "  kernels: ", r->timing.kernel[k],
                r->timing.kernel_ms[k]);
    if (r->timing.kernels > 0) fprintf(out, "; on the host %.3f ms", r->timing.host_ms);
    if (r->device_roofline_pct > 0.0)
        fprintf(out, "; by device times %.0f%% of the ceiling's kernel", r->device_roofline_pct);
    if (r->timing.kernels > 0) fprintf(out, "\n");
    fflush(out);
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; ++s) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        if ((unsigned char)*s >= 0x20) fputc(*s, f);
    }
    fputc('"', f);
}

static const char *device_type(cl_device_type type) {
    return type & CL_DEVICE_TYPE_GPU ? "gpu" : type & CL_DEVICE_TYPE_CPU ? "cpu" : "other";
}

/* The device's metadata and ceilings. clattn's kernels use no OpenCL extension (f16 storage is
 * vload_half/vstore_half, core OpenCL), so extensions_used is always empty. */
static void json_device(FILE *f, const clattn_device_desc *d, const bench_ceilings *c) {
    char opencl_c[128] = "";
    if (d->device)
        clGetDeviceInfo(d->device, CL_DEVICE_OPENCL_C_VERSION, sizeof opencl_c - 1, opencl_c, NULL);
    char facts[8192] = ""; /* clattn's device facts line (clattn_device_facts) */
    if (d->device) clattn_device_facts(d->device, facts, sizeof facts);
    const char *keys[8] = {"device", "platform", "vendor", "driver",
                           "opencl", "opencl_c", "facts",  "matrix_units"};
    const char *values[8] = {d->name,    d->platform_name, d->vendor, d->driver,
                             d->version, opencl_c,         facts,     c->matrix_units};
    fputc('{', f);
    for (int k = 0; k < 8; ++k) {
        fprintf(f, "%s\"%s\": ", k ? ", " : "", keys[k]);
        json_string(f, values[k]);
    }
    char warm[32] = "null", cold[32] = "null"; /* null: not measured */
    if (c->first_warm_ms >= 0) snprintf(warm, sizeof warm, "%.1f", c->first_warm_ms);
    if (c->first_cold_ms >= 0) snprintf(cold, sizeof cold, "%.1f", c->first_cold_ms);
    /* Where the PyTorch peer ran: torch_ops.py reads the same variable (unset: the CPU). */
    const char *peer = getenv("CLATTN_PEER_DEVICE");
    fputs(", \"peer_device\": ", f);
    json_string(f, peer && *peer ? peer : "cpu");
    fprintf(f,
            ", \"type\": \"%s\", \"extensions_used\": [], \"copy_gbs\": %.3f, \"fma_gflops\": "
            "%.3f, \"matrix_gflops\": %.3f, \"launch_us\": %.1f, \"first_calls_ms\": "
            "{\"warm_cache\": %s, \"empty_cache\": %s}}",
            device_type(d->type), c->copy_gbs, c->fma_gflops, c->matrix_gflops, c->launch_us, warm,
            cold);
}

int bench_write_json(const char *path, const bench_report *report,
                     const clattn_device_desc *devices, const bench_ceilings *ceilings,
                     int num_devices) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "{\n  \"devices\": [");
    for (int i = 0; i < num_devices; ++i) {
        fprintf(f, "%s\n    ", i ? "," : "");
        json_device(f, &devices[i], &ceilings[i]);
    }
    fprintf(f, "\n  ],\n  \"records\": [");
    for (int i = 0; i < report->count; ++i) {
        const bench_record *r = &report->records[i];
        fprintf(f, "%s\n    {\"op\": ", i ? "," : "");
        json_string(f, r->op);
        fprintf(f, ", \"variant\": ");
        json_string(f, r->variant);
        fprintf(f, ", \"device\": ");
        json_string(f, r->device);
        fprintf(f, ", \"shape\": ");
        json_string(f, r->shape);
        fprintf(f, ", \"dtype\": ");
        json_string(f, r->dtype);
        fprintf(f, ", \"check\": ");
        json_string(f, r->check);
        fprintf(f, ", \"median_ms\": %.6f, \"min_ms\": %.6f, \"host_ms\": %.6f",
                r->timing.median_ms, r->timing.min_ms, r->timing.host_ms);
        fprintf(f, ", \"first_call_ms\": %.3f", r->timing.first_ms);
        fprintf(f, ", \"metric\": ");
        json_string(f, r->metric);
        fprintf(f, ", \"value\": %.4f, \"ceiling\": %.4f, \"roofline_pct\": %.2f", r->value,
                r->ceiling, r->roofline_pct);
        if (r->device_roofline_pct > 0.0)
            fprintf(f, ", \"device_roofline_pct\": %.2f", r->device_roofline_pct);
        fprintf(f, ", \"peer_ratio\": {");
        if (r->torch_ms >= 0) fprintf(f, "\"torch\": %.4f", r->torch_ms / r->timing.median_ms);
        fprintf(f, "}, \"peer_ms\": {");
        if (r->torch_ms >= 0) fprintf(f, "\"torch\": %.6f", r->torch_ms);
        fprintf(f, "}");
        if (r->timing.kernels > 0) fprintf(f, ", \"kernels_ms\": {");
        for (int k = 0; k < r->timing.kernels; ++k) {
            fprintf(f, "%s", k ? ", " : "");
            json_string(f, r->timing.kernel[k]);
            fprintf(f, ": %.6f%s", r->timing.kernel_ms[k], k + 1 == r->timing.kernels ? "}" : "");
        }
        fprintf(f, "}");
    }
    fprintf(f, "\n  ]\n}\n");
    return fclose(f) == 0 ? 0 : -1;
}
