/*
 * clattn-tune: searches the launch parameters of clattn's kernels on one device and prints the
 * winning rows in the tuning table's own format (src/runtime/tuning_table.def), ready to paste.
 * Every candidate is checked against the float64 reference at the tests' tolerance before it is
 * timed; a candidate past the device's limits is skipped (the table's own check).
 *
 *   clattn-tune [--device SPEC] [--op NAME] [--key KEY] [--repeats N] [--budget S] [--quiet]
 */
#include "search.h"

#include <stdlib.h>
#include <string.h>

static void usage(FILE *out) {
    fprintf(out,
            "usage: clattn-tune [--device SPEC] [--op NAME] [--key KEY] [--repeats N] "
            "[--budget S] [--quiet]\n"
            "  SPEC: P:D or a name substring (as CLATTN_DEVICE)\n"
            "  NAME: copy | softmax | attention | linear_attention | gemm | matmul (default: all)\n"
            "  KEY:  the device key of the printed rows (default name:<device name>;\n"
            "        vendor:<vendor>/<type>, type:<type>, default)\n"
            "  --repeats: timed calls per candidate, each beside the current row "
            "(default 7)\n"
            "  --budget: seconds each op's search may take; past them it stops trying\n"
            "            candidates and prints the best so far (default: no limit)\n"
            "  --quiet: print the rows only, not every candidate\n");
}

/* The softmax group variant ignores SCRATCH and the rows variant HOLD: one value of each (0 and
 * the default 8) stands for all. */
static bool softmax_redundant(const long *v) {
    return (v[0] == 1 && v[3] != 0) || (v[0] == 0 && v[4] != 8);
}

/* BM shapes attention_blocks and attention_lanes, BN blocks only, MQ and MK micro only: while
 * no variant of the candidate uses one, one value of it stands for all. */
static bool attention_redundant(const long *v) {
    const bool blocks = v[0] == 0 || v[1] == 0, lanes = v[0] == 3 || v[1] == 3;
    const bool micro = v[0] == 4 || v[1] == 4;
    return (!blocks && !lanes && v[7] != 4) || (!blocks && v[8] != 16) ||
           (!micro && (v[9] != 4 || v[10] != 2));
}

/* The Xgemm kernel's A and B tiles load in the shape of the work-group (MDIMA = MDIMC, NDIMB
 * = NDIMC): the other shapes multiply the grid for little (CLBlast's own first tuning pass
 * makes the same cut). */
static bool gemm_redundant(const long *v) {
    return v[5] != v[3] || v[6] != v[4];
}

/* The grids: powers of two around each row in the table, wide enough for a CPU (wide vectors,
 * small groups) and a GPU (narrow vectors, large groups). */
static const tune_space spaces[] = {
    {.spec = &clattn__tuning_copy,
     .stages = {"VEC=4|8|16 RUN=4|64|512|4096 GROUP=16|64|256"},
     .cases = tune_copy_cases},
    {.spec = &clattn__tuning_softmax,
     .stages = {"VARIANT=0|1 VEC=4|8|16 GROUP=4|16|64|128|256 SCRATCH=0|4096|8192",
                "HOLD=0|2|4|8|16"},
     .redundant = softmax_redundant,
     .cases = tune_softmax_cases},
    {.spec = &clattn__tuning_attention,
     .stages = {"PREFILL=0|1|3|4 LANES=4|8|16 GROUP=16|32|64|128 TK=16|32", "BM=2|4|8 BN=8|16|32",
                "MQ=2|4|8 MK=1|2|4", "DECODE=0|1|2|3 SPLIT_TARGET=2|8|32 SPLIT_MIN=64|256|1024"},
     .redundant = attention_redundant,
     .cases = tune_attention_cases},
    {.spec = &clattn__tuning_linear_attention,
     .stages = {"LANES=4|8|16 ROWS=0|1|4 GROUP=16|64 ITEMS=64|512|2048",
                "BM=0|1|2|4 CHUNK=32|64|128"},
     .cases = tune_linear_cases},
    /* around the type:cpu row: 16-wide vectors along M and wide N tiles won on PoCL, local
     * memory and unrolling lost (src/runtime/tuning_table.def) */
    {.spec = &clattn__tuning_gemm,
     .stages = {"MWG=64|128|256 NWG=64|128|256 VWM=4|8|16 VWN=4|8",
                "KWG=16|32 MDIMC=4|8|16 NDIMC=8|16 MDIMA=4|8|16 NDIMB=8|16", "SA=0|1 SB=0|1"},
     .redundant = gemm_redundant,
     .cases = tune_gemm_cases,
     .sequential = true,
     .seed = "MWG=128 NWG=256 KWG=16 MDIMC=8 NDIMC=16 MDIMA=8 NDIMB=16 KWI=1 VWM=16 VWN=8 "
             "STRM=0 STRN=0 SA=0 SB=0 MIN_INDIRECT=256"},
    /* clattn's kernel: the register tile (MR x NV vectors of VEC) and the panels a work-item
     * walks */
    {.spec = &clattn__tuning_matmul,
     .stages = {"KERNEL=1 MR=4|6|8|12 NV=1|2|4 VEC=8|16", "PANELS=1|2|4|16"},
     .cases = tune_matmul_cases},
};
#define SPACES (int)(sizeof spaces / sizeof spaces[0])

typedef struct tune_args {
    const char *device, *op, *key;
    tune_settings settings;
} tune_args;

static int parse_args(int argc, char **argv, tune_args *a) {
    *a = (tune_args){NULL, NULL, NULL, {7, 1e9, stdout}};
    for (int i = 1; i < argc; ++i) {
        const char *arg = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0)
            return 1;
        else if (strcmp(arg, "--quiet") == 0)
            a->settings.log = NULL;
        else if (next && strcmp(arg, "--device") == 0)
            a->device = argv[++i];
        else if (next && strcmp(arg, "--op") == 0)
            a->op = argv[++i];
        else if (next && strcmp(arg, "--key") == 0)
            a->key = argv[++i];
        else if (next && strcmp(arg, "--repeats") == 0)
            a->settings.repeats = atoi(argv[++i]);
        else if (next && strcmp(arg, "--budget") == 0)
            a->settings.budget = atof(argv[++i]);
        else {
            fprintf(stderr, "clattn-tune: unknown or incomplete option %s\n", arg);
            return 2;
        }
    }
    return a->settings.repeats > 0 && a->settings.budget > 0 ? 0 : 2;
}

/* The row, with a comment saying what it was measured against. A gain within the noise
 * (TUNE_MARGIN) keeps the row the device has; a gemm search that does not beat CLBlast's own
 * parameters prints its best commented out (no row: CLBlast keeps its database). */
static void print_row(const tune_space *space, const tune_result *r, const char *device,
                      const char *key) {
    char start[CLATTN_TUNING_PARAMS_MAX] = "CLBlast's own parameters",
         best[CLATTN_TUNING_PARAMS_MAX];
    if (r->start_known) clattn__tuning_format(space->spec, r->start, start, sizeof start);
    clattn__tuning_format(space->spec, r->best, best, sizeof best);
    const bool no_gain = r->ratio >= TUNE_MARGIN, keep = r->start_known && no_gain;
    printf("/* %s: clattn-tune on %s, %.0f s; %.2fx the time of %s (", space->spec->name, device,
           r->seconds, r->ratio, start);
    for (int i = 0; i < r->cases; ++i)
        printf("%s%s %.2fx", i ? ", " : "", r->case_shape[i], r->case_ratio[i]);
    printf(")%s%s%s */\n", keep ? ": within the noise, the row stays" : "",
           no_gain && !r->start_known ? ": no row, CLBlast's own stay" : "",
           r->out_of_time ? "; the budget ran out before the grid" : "");
    printf("%sTUNING_ROW(\"%s\", \"%s\", \"%s\", \"%s\")\n",
           no_gain && !r->start_known ? "// " : "", space->spec->name,
           space->sequential ? "f32" : "*", key, keep ? start : best);
}

static int tune_op(clattn_env *env, const tune_args *a, const tune_space *space,
                   tune_result *result) {
    if (a->settings.log) fprintf(a->settings.log, "%s:\n", space->spec->name);
    int status = tune_search(env, space, &a->settings, result);
    if (status != CLATTN_SUCCESS)
        fprintf(stderr, "clattn-tune: %s: %s: %s\n", space->spec->name, clattn_status_name(status),
                clattn_last_error());
    else if (a->settings.log)
        fprintf(a->settings.log,
                " %d candidates tried (%d rejected: a wrong result or a failed call), "
                "%d past the device's limits, %.1f s%s\n",
                result->tried, result->rejected, result->unfit, result->seconds,
                result->out_of_time ? " (the budget ran out before the grid)" : "");
    return status;
}

int main(int argc, char **argv) {
    tune_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) {
        usage(rc == 1 ? stdout : stderr);
        return rc == 1 ? 0 : 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress, line by line, also into a file */
    clattn_env *env = NULL;
    int status = clattn_env_create(a.device, &env);
    if (status != CLATTN_SUCCESS) {
        fprintf(stderr, "clattn-tune: %s: %s\n", clattn_status_name(status), clattn_last_error());
        return 1;
    }
    const clattn_device_desc *d = clattn_env_device_desc(env);
    char key[300];
    snprintf(key, sizeof key, a.key ? "%s" : "name:%s", a.key ? a.key : d->name);
    printf("== %s / %s (%s, driver %s)\n", d->platform_name, d->name, d->version, d->driver);
    tune_result results[SPACES];
    bool done[SPACES] = {false}, known = a.op == NULL;
    int failures = 0;
    for (int i = 0; i < SPACES; ++i) {
        if (a.op && strcmp(a.op, spaces[i].spec->name) != 0) continue;
        known = true;
        done[i] = tune_op(env, &a, &spaces[i], &results[i]) == CLATTN_SUCCESS;
        failures += !done[i];
    }
    if (!known) fprintf(stderr, "clattn-tune: unknown op %s\n", a.op);
    printf("\n");
    for (int i = 0; i < SPACES; ++i)
        if (done[i]) print_row(&spaces[i], &results[i], d->name, key);
    clattn_env_release(env);
    return failures || !known ? 1 : 0;
}
