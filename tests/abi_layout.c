/* A test helper, not part of the library: the layout of every public struct of clattn.h as
 * this compiler lays it out, for tests/python/test_abi.py to check python/clattn/_lib.py's
 * ctypes mirrors against. Built by tests/meson.build as a module of its own, never installed.
 *
 * ABI_FIELDS lists every field of every struct in clattn.h; test_abi.py also reads the header
 * and fails when it declares a struct or a field that is missing here. */
#include "clattn.h"

#include <stddef.h>
#include <string.h>

#define ABI_FIELDS(X)                                                                              \
    X(clattn_tensor, buffer)                                                                       \
    X(clattn_tensor, offset)                                                                       \
    X(clattn_tensor, dtype)                                                                        \
    X(clattn_tensor, shape)                                                                        \
    X(clattn_tensor, strides)                                                                      \
    X(clattn_device_desc, platform_index)                                                          \
    X(clattn_device_desc, device_index)                                                            \
    X(clattn_device_desc, platform)                                                                \
    X(clattn_device_desc, device)                                                                  \
    X(clattn_device_desc, type)                                                                    \
    X(clattn_device_desc, platform_name)                                                           \
    X(clattn_device_desc, name)                                                                    \
    X(clattn_device_desc, vendor)                                                                  \
    X(clattn_device_desc, version)                                                                 \
    X(clattn_device_desc, driver)                                                                  \
    X(clattn_mask, causal)                                                                         \
    X(clattn_mask, align)                                                                          \
    X(clattn_mask, window)                                                                         \
    X(clattn_mask, window_left)                                                                    \
    X(clattn_mask, window_right)                                                                   \
    X(clattn_mask, global_stride)                                                                  \
    X(clattn_mask, softcap)                                                                        \
    X(clattn_mask, empty_rows_nan)                                                                 \
    X(clattn_mask, key_lengths)                                                                    \
    X(clattn_mask, query_lengths)                                                                  \
    X(clattn_mask, keep)                                                                           \
    X(clattn_mask, bias)                                                                           \
    X(clattn_mask, alibi_slopes)                                                                   \
    X(clattn_attention_options, path)                                                              \
    X(clattn_attention_options, weights)                                                           \
    X(clattn_attention_options, workspace)                                                         \
    X(clattn_attention_backward_options, path)                                                     \
    X(clattn_attention_backward_options, dbias)                                                    \
    X(clattn_attention_backward_options, workspace)                                                \
    X(clattn_linear_options, feature_map)                                                          \
    X(clattn_linear_options, eps)                                                                  \
    X(clattn_linear_options, workspace)                                                            \
    X(clattn_mha_params, num_heads)                                                                \
    X(clattn_mha_params, in_proj_weight)                                                           \
    X(clattn_mha_params, q_proj_weight)                                                            \
    X(clattn_mha_params, k_proj_weight)                                                            \
    X(clattn_mha_params, v_proj_weight)                                                            \
    X(clattn_mha_params, in_proj_bias)                                                             \
    X(clattn_mha_params, out_proj_weight)                                                          \
    X(clattn_mha_params, out_proj_bias)                                                            \
    X(clattn_mha_options, key_padding_mask)                                                        \
    X(clattn_mha_options, attn_mask)                                                               \
    X(clattn_mha_options, is_causal)                                                               \
    X(clattn_mha_options, weights)                                                                 \
    X(clattn_mha_options, average_attn_weights)                                                    \
    X(clattn_mha_options, workspace)

typedef struct abi_field {
    const char *type, *field;
    long type_size, offset, size;
} abi_field;

#define X(type, field)                                                                             \
    {#type, #field, (long)sizeof(type), (long)offsetof(type, field),                               \
     (long)sizeof(((type *)0)->field)},
static const abi_field fields[] = {ABI_FIELDS(X)};
#undef X
enum { FIELD_COUNT = sizeof fields / sizeof fields[0] };

#if defined(__GNUC__)
#define ABI_EXPORT __attribute__((visibility("default")))
#else
#define ABI_EXPORT
#endif

/* sizeof the struct named `type` ("clattn_mask"), or -1 for a name the table lacks. */
ABI_EXPORT long clattn_test_abi_size(const char *type) {
    for (size_t i = 0; type && i < FIELD_COUNT; ++i)
        if (strcmp(fields[i].type, type) == 0) return fields[i].type_size;
    return -1;
}

/* offsetof(type, field), or -1 for a struct or field the table lacks. */
ABI_EXPORT long clattn_test_abi_offset(const char *type, const char *field) {
    for (size_t i = 0; type && field && i < FIELD_COUNT; ++i)
        if (strcmp(fields[i].type, type) == 0 && strcmp(fields[i].field, field) == 0)
            return fields[i].offset;
    return -1;
}

/* sizeof the field (the whole array for an array field), or -1 as above. */
ABI_EXPORT long clattn_test_abi_field_size(const char *type, const char *field) {
    for (size_t i = 0; type && field && i < FIELD_COUNT; ++i)
        if (strcmp(fields[i].type, type) == 0 && strcmp(fields[i].field, field) == 0)
            return fields[i].size;
    return -1;
}

/* The table's entries in order, for listing: the struct and field names of entry `index`;
 * 0 past the end. */
ABI_EXPORT int clattn_test_abi_entry(long index, const char **type, const char **field) {
    if (index < 0 || index >= FIELD_COUNT) return 0;
    *type = fields[index].type;
    *field = fields[index].field;
    return 1;
}
