/*
 * libFuzzer target: the library's text parsers.
 *
 * The first byte picks the parser (byte % 3) and a variant ((byte / 3) & 1); the rest is text,
 * up to its first NUL, split at newlines into fields:
 *
 *   0  device spec (src/runtime/device.c): clattn_select_device(text), or (variant 1) with the
 *      text in CLATTN_DEVICE and a NULL spec. Success picks the device the spec names ("P:D"
 *      indices or a case-insensitive substring of the platform or device name).
 *   1  tuning (src/runtime/tuning.c): OP \n PARAMS \n CLATTN_TUNE \n LOOKUP_OP.
 *      clattn_tuning_override(OP, PARAMS), then CLATTN_TUNE set to its field, then
 *      clattn_tuning_lookup(LOOKUP_OP or OP) into a CLATTN_TUNING_PARAMS_MAX-byte buffer
 *      (variant 1: a short one). A lookup that succeeds must give a parameter string that is
 *      itself a valid override of that op. Every override is reset after the input.
 *   2  build options (src/runtime/kernel.c, static full_options): CLATTN_BUILD_OPTIONS \n
 *      OPTIONS, reached through clattn__create_kernel on an op file that does not exist, so that
 *      no program is ever built: the call must fail, with CLATTN_ERR_INVALID_ARGUMENT when the
 *      options relax IEEE math (docs/design.md, Numerics: IEEE semantics are required), else with
 *      that or CLATTN_ERR_KERNEL_SOURCE.
 *
 *   first byte 0xF0-0xFF: the work-group cap (src/runtime/config.c, clattn__parse_group_cap, the
 *      CLATTN_MAX_WORK_GROUP parser): success only for decimal digits naming 1..65536, which
 *      must be the cap it gives, or for empty text (no cap).
 *
 * Invariants: no sanitizer report; every failure is a CLATTN_ERR_* status the function documents,
 * with a message.
 */
#include "common.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static const char *const tuning_ops[] = {"copy", "softmax", "attention", "linear_attention",
                                         "gemm"};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_env();
    /* Sources come from the embedded copies, so a missing op file fails before any build. */
    fuzz_setenv("CLATTN_KERNEL_DIR", NULL);
    return 0;
}

/* Splits `text` in place at newlines into at most `max` fields; the rest are NULL. */
static void split_fields(char *text, char **fields, int max) {
    for (int i = 0; i < max; ++i) {
        fields[i] = text;
        char *nl = text ? strchr(text, '\n') : NULL;
        if (nl) *nl = '\0';
        text = nl ? nl + 1 : NULL;
    }
}

static bool contains_nocase(const char *haystack, const char *needle) {
    size_t n = strlen(needle);
    for (const char *h = haystack; *h; ++h)
        if (strlen(h) >= n) {
            size_t i = 0;
            while (i < n && tolower((unsigned char)h[i]) == tolower((unsigned char)needle[i])) ++i;
            if (i == n) return true;
        }
    return n == 0;
}

/* "P:D", both decimal, at most 1000 each (the parser's bound). */
static bool index_spec(const char *s, long *p, long *d) {
    char *end;
    if (!isdigit((unsigned char)s[0])) return false;
    *p = strtol(s, &end, 10);
    if (*end != ':' || !isdigit((unsigned char)end[1])) return false;
    *d = strtol(end + 1, &end, 10);
    return *end == '\0' && *p <= 1000 && *d <= 1000;
}

static void fuzz_device(char *text, bool via_env) {
    clattn_device_desc desc;
    if (via_env) fuzz_setenv("CLATTN_DEVICE", text);
    clattn__clear_error();
    int status = clattn_select_device(via_env ? NULL : text, &desc);
    const char *spec = via_env || !*text ? getenv("CLATTN_DEVICE") : text;
    if (via_env) fuzz_restore_env("CLATTN_DEVICE");
    FUZZ_EXPECT(status, "clattn_select_device", CLATTN_ERR_INVALID_DEVICE_SPEC,
                CLATTN_ERR_DEVICE_NOT_FOUND);
    if (status != CLATTN_SUCCESS) return;
    if (!desc.device || !desc.platform) fuzz_fail("clattn_select_device: success without a device");
    long p, d;
    if (!spec || !*spec) return; /* the default rule */
    if (index_spec(spec, &p, &d)
            ? desc.platform_index != p || desc.device_index != d
            : !contains_nocase(desc.platform_name, spec) && !contains_nocase(desc.name, spec))
        fuzz_fail("clattn_select_device(\"%s\") chose %d:%d %s / %s", spec, desc.platform_index,
                  desc.device_index, desc.platform_name, desc.name);
}

static void fuzz_tuning(char *text, bool short_buffer, clattn_dtype dtype) {
    char *f[4];
    split_fields(text, f, 4);
    const char *op = f[0], *params = f[1], *tune = f[2], *lookup_op = f[3] ? f[3] : f[0];
    clattn__clear_error();
    int status = clattn_tuning_override(op, params);
    FUZZ_EXPECT(status, "clattn_tuning_override", CLATTN_ERR_INVALID_ARGUMENT,
                CLATTN_ERR_INVALID_TUNING);

    fuzz_setenv("CLATTN_TUNE", tune);
    char found[CLATTN_TUNING_PARAMS_MAX];
    size_t capacity = short_buffer ? 1 + strlen(text) % 48 : sizeof found;
    cl_device_id device = clattn_env_device(fuzz_env());
    clattn__clear_error();
    status = clattn_tuning_lookup(device, lookup_op, dtype, found, capacity);
    FUZZ_EXPECT(status, "clattn_tuning_lookup", CLATTN_ERR_INVALID_ARGUMENT,
                CLATTN_ERR_INVALID_TUNING);
    if (status == CLATTN_SUCCESS) {
        if (strnlen(found, capacity) >= capacity)
            fuzz_fail("clattn_tuning_lookup: an unterminated result");
        /* what a lookup gives is a valid override of its op */
        clattn__clear_error();
        status = clattn_tuning_override(lookup_op, found);
        if (status != CLATTN_SUCCESS)
            fuzz_fail("clattn_tuning_lookup(%s) gave \"%s\", which clattn_tuning_override "
                      "refuses: %s",
                      lookup_op, found, clattn_last_error());
    }

    fuzz_restore_env("CLATTN_TUNE");
    for (size_t i = 0; i < sizeof tuning_ops / sizeof tuning_ops[0]; ++i)
        if (clattn_tuning_override(tuning_ops[i], NULL) != CLATTN_SUCCESS)
            fuzz_fail("resetting the %s override failed: %s", tuning_ops[i], clattn_last_error());
}

static void fuzz_build_options(char *text, bool unset) {
    char *f[2];
    split_fields(text, f, 2);
    const char *extra = unset ? NULL : f[0], *options = f[1] ? f[1] : "-DCLATTN_FUZZ";
    fuzz_setenv("CLATTN_BUILD_OPTIONS", extra);
    cl_kernel kernel = NULL;
    clattn_env *env = fuzz_env();
    clattn__clear_error();
    int status = clattn__create_kernel(clattn_env_context(env), clattn_env_device(env),
                                       "fuzz-no-such-op.cl", options, "fuzz", &kernel);
    fuzz_restore_env("CLATTN_BUILD_OPTIONS");
    if (status == CLATTN_SUCCESS) fuzz_fail("a kernel from an op file that does not exist");
    if (extra && (strstr(extra, "-cl-fast-relaxed-math") || strstr(extra, "-cl-finite-math-only")))
        FUZZ_EXPECT(status, "clattn__create_kernel (IEEE-relaxing options)",
                    CLATTN_ERR_INVALID_ARGUMENT);
    else
        FUZZ_EXPECT(status, "clattn__create_kernel", CLATTN_ERR_INVALID_ARGUMENT,
                    CLATTN_ERR_KERNEL_SOURCE);
}

static void fuzz_group_cap(const char *text) {
    size_t cap = 0;
    clattn__clear_error();
    int status = clattn__parse_group_cap(text, &cap);
    FUZZ_EXPECT(status, "clattn__parse_group_cap", CLATTN_ERR_INVALID_ARGUMENT);
    if (status != CLATTN_SUCCESS) return;
    bool digits = *text != '\0';
    for (const char *p = text; *p; ++p) digits = digits && *p >= '0' && *p <= '9';
    const unsigned long value = digits ? strtoul(text, NULL, 10) : 0;
    if (*text == '\0' ? cap != SIZE_MAX : !digits || value < 1 || value > 65536 || cap != value)
        fuzz_fail("clattn__parse_group_cap(\"%s\") accepted, cap %zu", text, cap);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    char *text = malloc(size);
    if (!text) fuzz_fail("out of memory");
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    bool variant = (data[0] / 3) & 1;
    switch (data[0] >= 0xF0 ? 3 : data[0] % 3) {
    case 0:
        fuzz_device(text, variant);
        break;
    case 1:
        fuzz_tuning(text, variant, (clattn_dtype)((data[0] / 6) % 6));
        break;
    case 2:
        fuzz_build_options(text, variant);
        break;
    default:
        fuzz_group_cap(text);
    }
    free(text);
    return 0;
}
