/* The part every op family of the benchmark shares: pick the cases --op selects, time them all
 * in PyTorch in one peer process, then measure each beside its ceiling. */
#include "bench.h"

#include <string.h>

/* Case i is one --op and --only select. */
static bool selected_case(const bench_options *opt, const bench_family *family, const void *cases,
                          int i, const char *key) {
    return (!opt->op || strcmp(opt->op, family->op(cases, i)) == 0) &&
           (!opt->only || strstr(key, opt->only));
}

int bench_run_family(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                     bench_report *report, const bench_family *family, const void *cases) {
    char keys[BENCH_MAX_CASES][96];
    const char *key_ptrs[BENCH_MAX_CASES];
    int selected = 0;
    for (int i = 0; i < family->count && i < BENCH_MAX_CASES; ++i) {
        family->key(cases, i, keys[i], sizeof keys[i]);
        if (selected_case(opt, family, cases, i, keys[i])) key_ptrs[selected++] = keys[i];
    }
    if (selected == 0) return CLATTN_SUCCESS;
    bench_peer_results peers;
    bench_run_peers(opt, key_ptrs, selected, &peers);
    if (peers.error[0] && opt->peer_script) fprintf(stderr, "torch peer: %s\n", peers.error);
    int status = CLATTN_SUCCESS;
    for (int i = 0; i < family->count && i < BENCH_MAX_CASES && status == CLATTN_SUCCESS; ++i)
        if (selected_case(opt, family, cases, i, keys[i])) {
            fprintf(stderr, "clattn-bench: %s\n", keys[i]); /* progress, apart from the table */
            status = family->measure(opt, env, ceilings, cases, i,
                                     bench_peer_median(&peers, keys[i]), report);
        }
    return status;
}

int bench_workspace(clattn_env *env, size_t bytes, cl_mem *out) {
    cl_int err = CL_SUCCESS;
    *out = clCreateBuffer(clattn_env_context(env), CL_MEM_READ_WRITE, bytes, NULL, &err);
    return err;
}
