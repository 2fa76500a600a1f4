/*
 * The tuning table's lookup (rows in src/runtime/tuning_table.def) and the overrides on top of it:
 * clattn_tuning_override() and the CLATTN_TUNE environment variable,
 * "op:NAME=VALUE,...;op:...". Malformed text is an error, never ignored.
 */
#include "tuning.h"
#include "build_options.h"
#include "config.h"
#include "device_facts.h"
#include "testing.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tuning_row {
    const char *op, *dtype, *device, *params;
} tuning_row;

static const tuning_row table[] = {
#define TUNING_ROW(op, dtype, device, params) {op, dtype, device, params},
#include "tuning_table.def"
#undef TUNING_ROW
};

/* ---- the ops and their device limits ---- */

static bool is_lane_width(long v) {
    return v == 1 || v == 4 || v == 8 || v == 16;
}

/* Each op's device limits, on its typed parameters (tuning_params.h says what each one is). */

static const char *copy_fits(cl_device_id device, const clattn__copy_tuning *t) {
    if (t->VEC != 2 && t->VEC != 4 && t->VEC != 8 && t->VEC != 16)
        return "VEC must be 2, 4, 8 or 16";
    if ((size_t)t->GROUP > clattn__device_max_group(device))
        return "GROUP exceeds the device's work-group size";
    /* (the device's own limit: transpose_tiles requires groups of 256, which a compiler may
     * refuse beyond it, while the caps only make the call fall back to transpose4d) */
    if (t->TILES && clattn__device_group_limit(device) < 256)
        return "TILES=1 needs work-groups of 256";
    return NULL;
}

/* The rows variant keeps SCRATCH floats per row of its group in local memory, with room to
 * spare (half of it). */
static const char *softmax_fits(cl_device_id device, const clattn__softmax_tuning *t) {
    if ((size_t)t->GROUP > clattn__device_max_group(device))
        return "GROUP exceeds the device's work-group size";
    if (t->VARIANT == 0 && !is_lane_width(t->VEC)) return "VEC must be 1, 4, 8 or 16";
    if (t->VARIANT == 0 &&
        (cl_ulong)t->GROUP * (cl_ulong)t->SCRATCH * 4 * 2 > clattn__device_local_bytes(device))
        return "GROUP x SCRATCH floats exceed half the device's local memory";
    return NULL;
}

static const char *linear_attention_fits(cl_device_id device,
                                         const clattn__linear_attention_tuning *t) {
    if (!is_lane_width(t->LANES)) return "LANES must be 1, 4, 8 or 16";
    if ((size_t)t->GROUP > clattn__device_max_group(device))
        return "GROUP exceeds the device's work-group size";
    return NULL;
}

/* Variants: 0 blocks, 1 tiles, 2 keys, 3 lanes, 4 micro. */
static const char *attention_fits(cl_device_id device, const clattn__attention_tuning *t) {
    if (t->PREFILL == 2) return "PREFILL cannot be the keys variant (a group per query row)";
    if (!is_lane_width(t->LANES)) return "LANES must be 1, 4, 8 or 16";
    if ((size_t)t->GROUP > clattn__device_max_group(device))
        return "GROUP exceeds the device's work-group size";
    if ((t->DECODE == 2 || t->PREFILL == 2) && clattn__device_max_group(device) < 128)
        return "the keys variant needs groups of 128";
    if (t->BN != 4 && t->BN != 8 && t->BN != 16 && t->BN != 32) return "BN must be 4, 8, 16 or 32";
    if (t->MK != 1 && t->MK != 2 && t->MK != 4 && t->MK != 8) return "MK must be 1, 2, 4 or 8";
    return NULL;
}

static const char *matmul_fits(cl_device_id device, const clattn__matmul_tuning *t) {
    (void)device; /* matmul_tiles: groups of one, no local memory; matmul_mma: checked at use */
    if (t->VEC != 4 && t->VEC != 8 && t->VEC != 16) return "VEC must be 4, 8 or 16";
    if (t->UNIT_M != 16 && t->UNIT_M != 32) return "UNIT_M must be 16 or 32";
    if (t->UNIT_N != 16 && t->UNIT_N != 32 && t->UNIT_N != 64) return "UNIT_N must be 16, 32 or 64";
    return NULL;
}

/* CLBlast's constraints on its Xgemm kernel. */
static const char *gemm_fits(cl_device_id device, const clattn__gemm_tuning *t) {
    if (!is_lane_width(t->VWM) && t->VWM != 2) return "VWM must be 1, 2, 4, 8 or 16";
    if (!is_lane_width(t->VWN) && t->VWN != 2) return "VWN must be 1, 2, 4, 8 or 16";
    if (t->KWG % t->KWI) return "KWG must be a multiple of KWI";
    if (t->MWG % (t->MDIMC * t->VWM) || t->MWG % (t->MDIMA * t->VWM))
        return "MWG must be a multiple of MDIMC*VWM and MDIMA*VWM";
    if (t->NWG % (t->NDIMC * t->VWN) || t->NWG % (t->NDIMB * t->VWN))
        return "NWG must be a multiple of NDIMC*VWN and NDIMB*VWN";
    const long items = t->MDIMC * t->NDIMC;
    if (items % t->MDIMA || items % t->NDIMB) return "MDIMA and NDIMB must divide MDIMC*NDIMC";
    if (t->KWG % (items / t->MDIMA) || t->KWG % (items / t->NDIMB))
        return "KWG must be a multiple of MDIMC*NDIMC/MDIMA and of MDIMC*NDIMC/NDIMB";
    if ((size_t)items > clattn__device_group_limit(device)) /* CLBlast's: not capped */
        return "MDIMC*NDIMC exceeds the device's work-group size";
    if ((cl_ulong)(t->KWG * (t->SA * t->MWG + t->SB * t->NWG)) * 4 >
        clattn__device_local_bytes(device))
        return "the A and B tiles exceed the device's local memory";
    return NULL;
}

/* ---- each op's descriptor and typed accessors, from tuning_params.h ---- */

/* " -DMACRO=value" for a parameter the kernels see (HOST ones only size the launch). */
static void append_define(char *out, size_t capacity, size_t *used, const char *macro, long value) {
    if (strcmp(macro, "HOST") != 0) clattn__define_int(out, capacity, used, macro, value);
}

#define NAME_OF(NAME, DEFAULT, MIN, MAX, MACRO)    #NAME,
#define DEFAULT_OF(NAME, DEFAULT, MIN, MAX, MACRO) DEFAULT,
#define MIN_OF(NAME, DEFAULT, MIN, MAX, MACRO)     MIN,
#define MAX_OF(NAME, DEFAULT, MIN, MAX, MACRO)     MAX,
#define MACRO_OF(NAME, DEFAULT, MIN, MAX, MACRO)   #MACRO,
#define ONE(NAME, DEFAULT, MIN, MAX, MACRO)        +1
#define UNPACK(NAME, DEFAULT, MIN, MAX, MACRO)     t->NAME = v[i++];
#define DEFINE(NAME, DEFAULT, MIN, MAX, MACRO)     append_define(out, capacity, &used, #MACRO, t->NAME);

#define DEFINE_OP(op, PARAMS, has_default_row)                                                     \
    _Static_assert(0 PARAMS(ONE) <= CLATTN__TUNING_MAX_PARAMS,                                     \
                   #op " has more tuning parameters than CLATTN__TUNING_MAX_PARAMS");              \
    static void op##_unpack(const long *v, clattn__##op##_tuning *t) {                             \
        int i = 0;                                                                                 \
        PARAMS(UNPACK)                                                                             \
    }                                                                                              \
    static const char *op##_fits_values(cl_device_id device, const long *v) {                      \
        clattn__##op##_tuning t;                                                                   \
        op##_unpack(v, &t);                                                                        \
        return op##_fits(device, &t);                                                              \
    }                                                                                              \
    const clattn__tuning_op clattn__tuning_##op = {#op,                                            \
                                                   0 PARAMS(ONE),                                  \
                                                   {PARAMS(NAME_OF)},                              \
                                                   {PARAMS(DEFAULT_OF)},                           \
                                                   {PARAMS(MIN_OF)},                               \
                                                   {PARAMS(MAX_OF)},                               \
                                                   {PARAMS(MACRO_OF)},                             \
                                                   has_default_row,                                \
                                                   op##_fits_values};                              \
    int clattn__##op##_tuning_get(cl_device_id device, clattn_dtype dtype,                         \
                                  clattn__##op##_tuning *t) {                                      \
        long v[CLATTN__TUNING_MAX_PARAMS];                                                         \
        int status = clattn__tuning_get(device, &clattn__tuning_##op, dtype, v);                   \
        if (status == CLATTN_SUCCESS) op##_unpack(v, t);                                           \
        return status;                                                                             \
    }                                                                                              \
    int clattn__##op##_tuning_row(clattn_dtype dtype, const char *key, clattn__##op##_tuning *t) { \
        long v[CLATTN__TUNING_MAX_PARAMS];                                                         \
        int status = clattn__tuning_row(&clattn__tuning_##op, dtype, key, v);                      \
        if (status == CLATTN_SUCCESS) op##_unpack(v, t);                                           \
        return status;                                                                             \
    }                                                                                              \
    void clattn__##op##_tuning_options(const clattn__##op##_tuning *t, char *out,                  \
                                       size_t capacity) {                                          \
        size_t used = strlen(out);                                                                 \
        PARAMS(DEFINE)                                                                             \
    }
CLATTN__TUNING_OPS(DEFINE_OP)

#define OP_ADDRESS(op, PARAMS, has_default_row) &clattn__tuning_##op,
static const clattn__tuning_op *const ops[] = {CLATTN__TUNING_OPS(OP_ADDRESS)};

static const clattn__tuning_op *find_op(const char *name, size_t length) {
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; ++i)
        if (strlen(ops[i]->name) == length && strncmp(ops[i]->name, name, length) == 0)
            return ops[i];
    return NULL;
}

/* ---- "NAME=VALUE,..." ---- */

/* Parses `length` characters of `text` into values[] (set[i] says which were given). */
static int parse_params(const clattn__tuning_op *op, const char *text, size_t length,
                        const char *what, long *values, bool *set) {
    const char *p = text, *end = text + length;
    while (p < end) {
        const char *comma = memchr(p, ',', (size_t)(end - p)), *stop = comma ? comma : end;
        const char *eq = memchr(p, '=', (size_t)(stop - p));
        int index = -1;
        for (int i = 0; eq && i < op->count; ++i)
            if (strlen(op->params[i]) == (size_t)(eq - p) &&
                strncmp(op->params[i], p, (size_t)(eq - p)) == 0)
                index = i;
        char *number_end = NULL;
        errno = 0;
        /* digits only: strtol alone would take a sign and leading blanks */
        const bool digits = eq && eq + 1 < stop && isdigit((unsigned char)eq[1]);
        long value = digits ? strtol(eq + 1, &number_end, 10) : 0;
        if (index < 0 || !digits || number_end != stop || errno)
            return clattn__fail(CLATTN_ERR_INVALID_TUNING,
                                "%s: \"%.*s\" is not NAME=DIGITS for a parameter of %s", what,
                                (int)(stop - p), p, op->name);
        if (set[index])
            return clattn__fail(CLATTN_ERR_INVALID_TUNING, "%s: %s.%s is given twice", what,
                                op->name, op->params[index]);
        if (comma && comma + 1 == end)
            return clattn__fail(CLATTN_ERR_INVALID_TUNING, "%s: a trailing comma after %.*s", what,
                                (int)(stop - p), p);
        if (value < op->min[index] || value > op->max[index])
            return clattn__fail(CLATTN_ERR_INVALID_TUNING, "%s: %s.%s = %ld is outside [%ld, %ld]",
                                what, op->name, op->params[index], value, op->min[index],
                                op->max[index]);
        values[index] = value;
        set[index] = true;
        p = comma ? comma + 1 : end;
    }
    return CLATTN_SUCCESS;
}

/* ---- overrides ---- */

static pthread_mutex_t override_lock = PTHREAD_MUTEX_INITIALIZER;
static char overrides[sizeof ops / sizeof ops[0]][CLATTN_TUNING_PARAMS_MAX]; /* (a lookup's) */

int clattn_tuning_override(const char *op_name, const char *params) {
    clattn__clear_error();
    const clattn__tuning_op *op = op_name ? find_op(op_name, strlen(op_name)) : NULL;
    if (!op)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "unknown tuning op \"%s\"",
                            op_name ? op_name : "(null)");
    long values[CLATTN__TUNING_MAX_PARAMS];
    bool set[CLATTN__TUNING_MAX_PARAMS] = {false};
    size_t length = params ? strlen(params) : 0;
    int status = CLATTN_SUCCESS;
    if (length >= sizeof overrides[0])
        status = clattn__fail(CLATTN_ERR_INVALID_TUNING, "the override is over %zu characters",
                              sizeof overrides[0] - 1);
    if (status == CLATTN_SUCCESS)
        status = parse_params(op, params ? params : "", length, "override", values, set);
    if (status != CLATTN_SUCCESS) return status;
    pthread_mutex_lock(&override_lock);
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; ++i)
        if (ops[i] == op) snprintf(overrides[i], sizeof overrides[i], "%s", params ? params : "");
    pthread_mutex_unlock(&override_lock);
    return CLATTN_SUCCESS;
}

/* Applies CLATTN_TUNE's part for `op` ("op:NAME=VALUE,...;..."), after checking all of it. */
static int apply_env(const clattn__tuning_op *op, long *values, bool *set) {
    const char *text = getenv("CLATTN_TUNE");
    bool seen[sizeof ops / sizeof ops[0]] = {false};
    int status = CLATTN_SUCCESS;
    for (const char *p = text; p && *p && status == CLATTN_SUCCESS;) {
        const char *semi = strchr(p, ';'), *stop = semi ? semi : p + strlen(p);
        const char *colon = memchr(p, ':', (size_t)(stop - p));
        const clattn__tuning_op *named = colon ? find_op(p, (size_t)(colon - p)) : NULL;
        size_t index = 0;
        while (named && ops[index] != named) ++index;
        long scratch[CLATTN__TUNING_MAX_PARAMS];
        bool scratch_set[CLATTN__TUNING_MAX_PARAMS] = {false};
        if (!named || colon + 1 == stop || (semi && semi[1] == '\0'))
            status = clattn__fail(CLATTN_ERR_INVALID_TUNING,
                                  "CLATTN_TUNE: \"%.*s\" is not OP:NAME=VALUE,... with a known OP "
                                  "(sections are separated by ';', none empty)",
                                  (int)(stop - p), p);
        else if (seen[index])
            status = clattn__fail(CLATTN_ERR_INVALID_TUNING, "CLATTN_TUNE: %s is given twice",
                                  named->name);
        else
            status = parse_params(named, colon + 1, (size_t)(stop - colon - 1), "CLATTN_TUNE",
                                  named == op ? values : scratch, named == op ? set : scratch_set);
        if (named) seen[index] = true;
        p = semi ? semi + 1 : stop;
    }
    return status;
}

/* Applies the overrides for `op`, CLATTN_TUNE's then clattn_tuning_override's (which wins
 * where both name a parameter); *any says whether one set a parameter, *all whether they set
 * every one. */
static int apply_overrides(const clattn__tuning_op *op, long *values, bool *any, bool *all) {
    bool set[CLATTN__TUNING_MAX_PARAMS] = {false}, set_by_api[CLATTN__TUNING_MAX_PARAMS] = {false};
    int status = apply_env(op, values, set);
    char text[sizeof overrides[0]] = "";
    pthread_mutex_lock(&override_lock);
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; ++i)
        if (ops[i] == op) memcpy(text, overrides[i], strlen(overrides[i]) + 1);
    pthread_mutex_unlock(&override_lock);
    if (status == CLATTN_SUCCESS)
        status = parse_params(op, text, strlen(text), "clattn_tuning_override", values, set_by_api);
    *any = false;
    *all = true;
    for (int i = 0; i < op->count; ++i) {
        set[i] = set[i] || set_by_api[i];
        *any = *any || set[i];
        *all = *all && set[i];
    }
    return status;
}

/* ---- the lookup ---- */

static const char *type_name(cl_device_type type) {
    return type & CL_DEVICE_TYPE_GPU           ? "gpu"
           : type & CL_DEVICE_TYPE_ACCELERATOR ? "accelerator"
           : type & CL_DEVICE_TYPE_CPU         ? "cpu"
                                               : "other";
}

/* What the lookup keys read from the device, queried once a lookup. */
typedef struct device_names {
    char name[256], vendor[256];
    cl_device_type type;
} device_names;

/* False when a query failed (the names are then empty, the type 0). */
static bool device_names_get(cl_device_id device, device_names *d) {
    d->name[0] = d->vendor[0] = '\0';
    d->type = 0;
    return clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof d->name, d->name, NULL) == CL_SUCCESS &&
           clGetDeviceInfo(device, CL_DEVICE_VENDOR, sizeof d->vendor, d->vendor, NULL) ==
               CL_SUCCESS &&
           clGetDeviceInfo(device, CL_DEVICE_TYPE, sizeof d->type, &d->type, NULL) == CL_SUCCESS;
}

/* The device's key at lookup level 0 (name), 1 (vendor/type), 2 (type), 3 (default). */
static void device_key(const device_names *d, int level, char *key, size_t capacity) {
    switch (level) {
    case 0:
        snprintf(key, capacity, "name:%s", d->name);
        break;
    case 1:
        snprintf(key, capacity, "vendor:%s/%s", d->vendor, type_name(d->type));
        break;
    case 2:
        snprintf(key, capacity, "type:%s", type_name(d->type));
        break;
    default:
        snprintf(key, capacity, "default");
    }
}

static const char *test_row_fields[4];

void clattn__tuning_set_test_row(const char *const row[4]) {
    for (int i = 0; i < 4; ++i) test_row_fields[i] = row && row[0] ? row[i] : NULL;
    clattn__tuning_forget();
}

/* A row's parameters: those it gives, the op's defaults for the others (a row names what it
 * changes, so a new parameter is one line in tuning_params.h); an op without a default row
 * (gemm) must give every one. */
static int parse_row(const clattn__tuning_op *op, const tuning_row *row, long *values) {
    bool set[CLATTN__TUNING_MAX_PARAMS] = {false};
    if (op->has_default) memcpy(values, op->defaults, sizeof op->defaults);
    int status = parse_params(op, row->params, strlen(row->params), "tuning table", values, set);
    for (int p = 0; p < op->count && status == CLATTN_SUCCESS && !op->has_default; ++p)
        if (!set[p])
            status =
                clattn__fail(CLATTN_ERR_INVALID_TUNING, "tuning table: the %s row for %s lacks %s",
                             op->name, row->device, op->params[p]);
    return status;
}

/* The first row for op and dtype whose device key is `key`, parsed; *found says whether there
 * was one. */
static int find_row(const char *key, const clattn__tuning_op *op, clattn_dtype dtype, long *values,
                    bool *found) {
    *found = false;
    const size_t rows = sizeof table / sizeof table[0];
    const tuning_row test_row = {test_row_fields[0], test_row_fields[1], test_row_fields[2],
                                 test_row_fields[3]};
    for (size_t i = test_row.op ? 0 : 1; i <= rows; ++i) {
        const tuning_row *row = i == 0 ? &test_row : &table[i - 1];
        if (strcmp(row->op, op->name) != 0 || strcmp(row->device, key) != 0) continue;
        if (strcmp(row->dtype, "*") != 0 && strcmp(row->dtype, clattn_dtype_name(dtype)) != 0)
            continue;
        int status = parse_row(op, row, values);
        *found = status == CLATTN_SUCCESS;
        return status;
    }
    /* the "default" row is the op's DEFAULT column (tuning_params.h) */
    if (op->has_default && strcmp(key, "default") == 0) {
        memcpy(values, op->defaults, sizeof op->defaults);
        *found = true;
    }
    return CLATTN_SUCCESS;
}

int clattn__tuning_check_table(void) {
    int status = CLATTN_SUCCESS;
    for (size_t i = 0; i < sizeof table / sizeof table[0] && status == CLATTN_SUCCESS; ++i) {
        const clattn__tuning_op *op = find_op(table[i].op, strlen(table[i].op));
        long values[CLATTN__TUNING_MAX_PARAMS];
        status = op ? parse_row(op, &table[i], values)
                    : clattn__fail(CLATTN_ERR_INVALID_TUNING, "tuning table: unknown op \"%s\"",
                                   table[i].op);
        if (status == CLATTN_SUCCESS && strcmp(table[i].device, "default") == 0)
            status = clattn__fail(CLATTN_ERR_INVALID_TUNING,
                                  "tuning table: a \"default\" row for %s (the default row is the "
                                  "DEFAULT column of tuning_params.h)",
                                  table[i].op);
    }
    /* and each op's DEFAULT column is a row that parses: within its ranges */
    for (size_t o = 0; o < sizeof ops / sizeof ops[0] && status == CLATTN_SUCCESS; ++o)
        for (int p = 0; p < ops[o]->count && status == CLATTN_SUCCESS; ++p)
            if (ops[o]->defaults[p] < ops[o]->min[p] || ops[o]->defaults[p] > ops[o]->max[p])
                status = clattn__fail(CLATTN_ERR_INVALID_TUNING,
                                      "tuning_params.h: %s.%s's default %ld is outside [%ld, %ld]",
                                      ops[o]->name, ops[o]->params[p], ops[o]->defaults[p],
                                      ops[o]->min[p], ops[o]->max[p]);
    return status;
}

/* The table's answer for the device, before the overrides: the first row by level that fits.
 * *queried says whether the device answered every query. */
static int table_lookup(cl_device_id device, const clattn__tuning_op *op, clattn_dtype dtype,
                        long *values, bool *found, bool *queried) {
    int status = CLATTN_SUCCESS;
    *found = false;
    device_names names;
    *queried = device_names_get(device, &names);
    for (int level = 0; level < 4 && status == CLATTN_SUCCESS; ++level) {
        bool here = false;
        char key[600];
        device_key(&names, level, key, sizeof key);
        status = find_row(key, op, dtype, values, &here);
        const char *why = here ? op->fits(device, values) : NULL;
        if (here && why)
            clattn__warn("tuning: the %s row of level %d does not fit this device (%s); %s",
                         op->name, level, why,
                         level < 3 ? "trying the next level" : "the op clamps it");
        /* a row that does not fit counts only at the last level (the default, which the op
         * clamps); an op without a default row then has none */
        *found = here && (!why || level == 3);
        if (*found) break;
    }
    return status;
}

/* ---- the memo of table lookups ---- */

/* Every op call looks its parameters up, and the table's answer depends only on the device,
 * the op, the dtype, the caps on groups and local memory that the fits checks read
 * (CLATTN_MAX_WORK_GROUP, CLATTN_MAX_LOCAL_MEMORY, kept as their text: tests change them in a
 * run) and the test row: so the answer is kept, per that key, and the lookup (three driver
 * queries, the rows compared and parsed as text: most of an op call's own host work) runs once.
 * A row's warning is given once, when its answer is first kept. Failed lookups, and answers
 * made while a driver query failed, are not kept. The overrides are applied on top at every
 * call. Each entry holds a reference to its device, so that a released sub-device's handle
 * cannot come back as another device's. */
#define CAP_TEXT 24
typedef struct memo_entry {
    cl_device_id device;
    const clattn__tuning_op *op;
    clattn_dtype dtype;
    char group_cap[CAP_TEXT], local_cap[CAP_TEXT]; /* the variables' text ("": unset) */
    bool found;
    long values[CLATTN__TUNING_MAX_PARAMS];
} memo_entry;

#define MEMO_SIZE 64
static pthread_mutex_t memo_lock = PTHREAD_MUTEX_INITIALIZER;
static memo_entry memo[MEMO_SIZE];
static size_t memo_next;         /* the entry the next new answer replaces (round robin) */
static unsigned memo_generation; /* one more at each forget: a lookup begun before is not kept */

void clattn__tuning_forget(void) {
    pthread_mutex_lock(&memo_lock);
    for (size_t i = 0; i < MEMO_SIZE; ++i)
        if (memo[i].device) clReleaseDevice(memo[i].device);
    memset(memo, 0, sizeof memo);
    memo_next = 0;
    ++memo_generation;
    pthread_mutex_unlock(&memo_lock);
}

/* A cap variable's text into the key; false when it is too long to keep (no memo then). */
static bool cap_text(const char *variable, char *out) {
    const char *text = getenv(variable);
    if (!text) text = "";
    if (strlen(text) >= CAP_TEXT) return false;
    strcpy(out, text);
    return true;
}

static bool memo_matches(const memo_entry *e, const memo_entry *key) {
    return e->device == key->device && e->op == key->op && e->dtype == key->dtype &&
           strcmp(e->group_cap, key->group_cap) == 0 && strcmp(e->local_cap, key->local_cap) == 0;
}

/* table_lookup through the memo. */
static int memo_lookup(cl_device_id device, const clattn__tuning_op *op, clattn_dtype dtype,
                       long *values, bool *found) {
    memo_entry key = {.device = device, .op = op, .dtype = dtype};
    const bool keyed = cap_text("CLATTN_MAX_WORK_GROUP", key.group_cap) &&
                       cap_text("CLATTN_MAX_LOCAL_MEMORY", key.local_cap);
    bool hit = false;
    pthread_mutex_lock(&memo_lock);
    const unsigned generation = memo_generation;
    for (size_t i = 0; keyed && i < MEMO_SIZE && !hit; ++i)
        if (memo_matches(&memo[i], &key)) {
            hit = true;
            *found = memo[i].found;
            memcpy(values, memo[i].values, sizeof memo[i].values);
        }
    pthread_mutex_unlock(&memo_lock);
    if (hit) return CLATTN_SUCCESS;
    bool queried = false;
    int status = table_lookup(device, op, dtype, key.values, &key.found, &queried);
    if (status != CLATTN_SUCCESS) return status;
    *found = key.found;
    memcpy(values, key.values, sizeof key.values);
    if (!keyed || !queried || clRetainDevice(device) != CL_SUCCESS) return CLATTN_SUCCESS;
    pthread_mutex_lock(&memo_lock);
    if (generation == memo_generation) {
        memo_entry *slot = &memo[memo_next];
        memo_next = (memo_next + 1) % MEMO_SIZE;
        if (slot->device) clReleaseDevice(slot->device);
        *slot = key;
    } else {
        clReleaseDevice(device);
    }
    pthread_mutex_unlock(&memo_lock);
    return CLATTN_SUCCESS;
}

int clattn__tuning_find(cl_device_id device, const clattn__tuning_op *op, clattn_dtype dtype,
                        long *values, bool *found) {
    int status = memo_lookup(device, op, dtype, values, found);
    bool overridden = false, complete = false;
    if (status == CLATTN_SUCCESS) status = apply_overrides(op, values, &overridden, &complete);
    if (status == CLATTN_SUCCESS && overridden && !*found && !complete)
        status = clattn__fail(CLATTN_ERR_INVALID_TUNING,
                              "the %s override gives some parameters, and this device has no %s "
                              "row for the others: give them all",
                              op->name, op->name);
    *found = *found || complete;
    const char *why = status == CLATTN_SUCCESS && overridden ? op->fits(device, values) : NULL;
    if (why)
        status = clattn__fail(CLATTN_ERR_INVALID_TUNING,
                              "the %s parameters after the overrides do not fit this device: %s",
                              op->name, why);
    return status;
}

int clattn__tuning_get(cl_device_id device, const clattn__tuning_op *op, clattn_dtype dtype,
                       long *values) {
    bool found = false;
    int status = clattn__tuning_find(device, op, dtype, values, &found);
    if (status == CLATTN_SUCCESS && !found)
        status = clattn__fail(CLATTN_ERR_INVALID_TUNING, "the tuning table has no %s row for %s",
                              op->name, clattn_dtype_name(dtype));
    return status;
}

int clattn__tuning_row(const clattn__tuning_op *op, clattn_dtype dtype, const char *key,
                       long *values) {
    bool found = false;
    int status = find_row(key, op, dtype, values, &found);
    if (status == CLATTN_SUCCESS && !found)
        status = clattn__fail(CLATTN_ERR_INVALID_TUNING, "no %s row for %s", op->name, key);
    return status;
}

bool clattn__tuning_format(const clattn__tuning_op *op, const long *values, char *text,
                           size_t capacity) {
    size_t used = 0;
    text[0] = '\0';
    for (int i = 0; i < op->count; ++i) {
        int n = snprintf(text + used, capacity - used, "%s%s=%ld", i ? "," : "", op->params[i],
                         values[i]);
        if (n < 0 || (size_t)n >= capacity - used) {
            text[used] = '\0';
            return false;
        }
        used += (size_t)n;
    }
    return true;
}

int clattn_tuning_lookup(cl_device_id device, const char *op_name, clattn_dtype dtype, char *params,
                         size_t capacity) {
    clattn__clear_error();
    const clattn__tuning_op *op = op_name ? find_op(op_name, strlen(op_name)) : NULL;
    if (!op || !device || !params || capacity == 0)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT,
                            "clattn_tuning_lookup needs a device, a known op and a buffer");
    long values[CLATTN__TUNING_MAX_PARAMS];
    params[0] = '\0';
    int status = clattn__tuning_get(device, op, dtype, values);
    if (status == CLATTN_SUCCESS && !clattn__tuning_format(op, values, params, capacity))
        status =
            clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "params: %zu bytes are too few", capacity);
    return status;
}
