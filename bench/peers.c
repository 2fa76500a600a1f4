/* Runs bench/peers/torch_ops.py (PyTorch on the CPU, the way its users write each op) on the same
 * cases in one process, and reads back one line per case: "<key> <median_ms> <min_ms>". */
#include "bench.h"

#include <stdlib.h>
#include <string.h>

static bool append(char *buffer, size_t capacity, const char *text) {
    size_t used = strlen(buffer), n = strlen(text);
    if (used + n + 1 > capacity) return false;
    memcpy(buffer + used, text, n + 1);
    return true;
}

void bench_run_peers(const bench_options *opt, const char *const *keys, int count,
                     bench_peer_results *out) {
    memset(out, 0, sizeof *out);
    if (!opt->peer_script) {
        snprintf(out->error, sizeof out->error, "peers disabled");
        return;
    }
    char command[8192] = "";
    char head[1024];
    snprintf(head, sizeof head, "'%s' '%s' --repeats %d --warmup %d", opt->python, opt->peer_script,
             opt->repeats, opt->warmup);
    bool ok = append(command, sizeof command, head);
    for (int i = 0; i < count && ok; ++i)
        ok = append(command, sizeof command, " --case '") &&
             append(command, sizeof command, keys[i]) && append(command, sizeof command, "'");
    ok = ok && append(command, sizeof command, " 2>&1");
    FILE *pipe = ok ? popen(command, "r") : NULL;
    if (!pipe) {
        snprintf(out->error, sizeof out->error, "cannot run %s", opt->peer_script);
        return;
    }
    char line[512];
    while (fgets(line, sizeof line, pipe)) {
        /* the key holds spaces, so the two numbers are read from the end of the line */
        char *last = strrchr(line, ' ');
        if (!last || out->count >= BENCH_MAX_CASES) continue;
        *last = '\0';
        char *middle = strrchr(line, ' ');
        if (!middle) continue;
        *middle = '\0';
        char *end1, *end2;
        double median = strtod(middle + 1, &end1), min = strtod(last + 1, &end2);
        if (end1 == middle + 1 || end2 == last + 1) {
            snprintf(out->error, sizeof out->error, "%.200s", line);
            continue;
        }
        snprintf(out->key[out->count], sizeof out->key[0], "%.90s", line);
        out->median_ms[out->count] = median;
        out->min_ms[out->count] = min;
        ++out->count;
    }
    int rc = pclose(pipe);
    if (rc != 0 && out->error[0] == '\0')
        snprintf(out->error, sizeof out->error, "peer script exited with %d", rc);
}

double bench_peer_median(const bench_peer_results *peers, const char *key) {
    for (int i = 0; i < peers->count; ++i)
        if (strcmp(peers->key[i], key) == 0) return peers->median_ms[i];
    return -1.0;
}
