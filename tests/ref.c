#include "ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint32_t bits_of(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return x;
}

static float float_of(uint32_t x) {
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

/* Drops the low `shift` bits of `value`, rounding to nearest, ties to even. */
static uint32_t round_shift(uint32_t value, int shift) {
    uint32_t kept = value >> shift;
    uint32_t rest = value & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (kept & 1u))) ++kept;
    return kept;
}

uint16_t ref_f32_to_f16(float f) {
    uint32_t x = bits_of(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    int exponent = (int)((x >> 23) & 0xffu);
    uint32_t mantissa = x & 0x7fffffu;
    if (exponent == 0xff) /* Inf, or NaN made quiet */
        return sign | 0x7c00u | (mantissa ? 0x200u | (uint16_t)(mantissa >> 13) : 0u);
    int e = exponent - 127 + 15;
    if (e >= 31) return sign | 0x7c00u; /* >= 2^16 overflows whatever the rounding */
    if (e <= 0) {                       /* half subnormal, or zero */
        if (e < -10) return sign;       /* below half the smallest subnormal */
        return sign | (uint16_t)round_shift(mantissa | 0x800000u, 14 - e);
    }
    /* A carry out of the mantissa correctly bumps the exponent (up to Inf at 65520). */
    return sign | (uint16_t)round_shift(((uint32_t)e << 23) | mantissa, 13);
}

float ref_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu;
    uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0) {
        float magnitude = ldexpf((float)mantissa, -24);
        return sign ? -magnitude : magnitude;
    }
    if (exponent == 31) return float_of(sign | 0x7f800000u | (mantissa << 13));
    return float_of(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

uint16_t ref_f32_to_bf16(float f) {
    uint32_t x = bits_of(f);
    if (isnan(f)) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)round_shift(x, 16);
}

float ref_bf16_to_f32(uint16_t h) {
    return float_of((uint32_t)h << 16);
}

float ref_load(const void *base, clattn_dtype dtype, uint64_t index) {
    switch (dtype) {
    case CLATTN_F16:
        return ref_f16_to_f32(((const uint16_t *)base)[index]);
    case CLATTN_BF16:
        return ref_bf16_to_f32(((const uint16_t *)base)[index]);
    default:
        return ((const float *)base)[index];
    }
}

void ref_store(void *base, clattn_dtype dtype, uint64_t index, float v) {
    switch (dtype) {
    case CLATTN_F16:
        ((uint16_t *)base)[index] = ref_f32_to_f16(v);
        break;
    case CLATTN_BF16:
        ((uint16_t *)base)[index] = ref_f32_to_bf16(v);
        break;
    default:
        ((float *)base)[index] = v;
        break;
    }
}

static bool element_is_nan(const void *base, clattn_dtype dtype, uint64_t index) {
    return isnan(ref_load(base, dtype, index));
}

bool ref_same_element(const void *a, const void *b, clattn_dtype dtype, uint64_t index,
                      bool nan_equal) {
    size_t size = clattn_dtype_size(dtype);
    if (memcmp((const char *)a + index * size, (const char *)b + index * size, size) == 0)
        return true;
    return nan_equal && element_is_nan(a, dtype, index) && element_is_nan(b, dtype, index);
}

static uint64_t element_at(const clattn_tensor *t, const int64_t i[4]) {
    uint64_t at = t->offset;
    for (int d = 0; d < 4; ++d) at += (uint64_t)(i[d] * t->strides[d]);
    return at;
}

void ref_copy(const void *src, const clattn_tensor *src_view, const void *bias,
              const clattn_tensor *bias_view, void *dst, const clattn_tensor *dst_view) {
    /* Same dtype and no bias: the library moves bits, so the reference does too. */
    bool raw = !bias && src_view->dtype == dst_view->dtype;
    size_t size = clattn_dtype_size(dst_view->dtype);
    int64_t i[4];
    for (i[0] = 0; i[0] < dst_view->shape[0]; ++i[0])
        for (i[1] = 0; i[1] < dst_view->shape[1]; ++i[1])
            for (i[2] = 0; i[2] < dst_view->shape[2]; ++i[2])
                for (i[3] = 0; i[3] < dst_view->shape[3]; ++i[3]) {
                    uint64_t s = element_at(src_view, i), d = element_at(dst_view, i);
                    if (raw) {
                        memcpy((char *)dst + d * size, (const char *)src + s * size, size);
                        continue;
                    }
                    float v = ref_load(src, src_view->dtype, s);
                    if (bias) v += ref_load(bias, bias_view->dtype, element_at(bias_view, i));
                    ref_store(dst, dst_view->dtype, d, v);
                }
}

/* ---- mask and softmax ---- */

static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

/* pos = i + off, off = key_len - query_len under bottom-right alignment. */
static int64_t ref_pos(const ref_mask *m, int64_t b, int64_t i, int64_t Sq, int64_t Sk) {
    int64_t klen = m->key_lengths ? clamp64(m->key_lengths[b], 0, Sk) : Sk;
    int64_t qlen = m->query_lengths ? clamp64(m->query_lengths[b], 0, Sq) : Sq;
    return m->bottom_right ? i + klen - qlen : i;
}

static int64_t at4(const int64_t s[4], int64_t b, int64_t h, int64_t i, int64_t j) {
    return b * s[0] + h * s[1] + i * s[2] + j * s[3];
}

bool ref_visible(const ref_mask *m, int64_t b, int64_t h, int64_t i, int64_t j, int64_t Sq,
                 int64_t Sk) {
    int64_t pos = ref_pos(m, b, i, Sq, Sk);
    bool lengths_ok = (!m->key_lengths || j < m->key_lengths[b]) &&
                      (!m->query_lengths || i < m->query_lengths[b]);
    bool causal_ok = !m->causal || j <= pos;
    bool window_ok = !m->window ||
                     ((m->left < 0 || pos - m->left <= j) && (m->right < 0 || j <= pos + m->right));
    bool global_ok =
        m->global_stride > 0 && (j % m->global_stride == 0 || pos % m->global_stride == 0);
    bool keep_ok = !m->keep || m->keep[at4(m->keep_strides, b, h, i, j)] != 0;
    return lengths_ok && causal_ok && keep_ok && (window_ok || global_ok);
}

double ref_score(const ref_mask *m, double scale, double x, int64_t b, int64_t h, int64_t i,
                 int64_t j, int64_t Sq, int64_t Sk) {
    double s = scale * x;
    if (m->softcap > 0) s = m->softcap * tanh(s / m->softcap);
    if (m->bias) s += m->bias[at4(m->bias_strides, b, h, i, j)];
    if (m->alibi) s -= m->alibi[h] * fabs((double)(ref_pos(m, b, i, Sq, Sk) - j));
    return s;
}

void ref_softmax(const double *x, int64_t B, int64_t H, int64_t Sq, int64_t Sk, double scale,
                 const ref_mask *m, double *y, double *lse, uint8_t *visible) {
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < Sq; ++i) {
                int64_t row = ((b * H + h) * Sq + i) * Sk;
                double max = -INFINITY, sum = 0;
                bool nan = false;
                for (int64_t j = 0; j < Sk; ++j) {
                    bool v = ref_visible(m, b, h, i, j, Sq, Sk);
                    if (visible) visible[row + j] = v;
                    double s = v ? ref_score(m, scale, x[row + j], b, h, i, j, Sq, Sk) : -INFINITY;
                    y[row + j] = s;
                    nan |= isnan(s);
                    if (s > max) max = s;
                }
                bool empty = max == -INFINITY && !nan;
                for (int64_t j = 0; j < Sk; ++j)
                    if (!empty && y[row + j] != -INFINITY) sum += exp(y[row + j] - max);
                for (int64_t j = 0; j < Sk; ++j) {
                    double s = y[row + j];
                    if (empty)
                        y[row + j] = m->empty_nan ? NAN : 0.0;
                    else
                        y[row + j] = s == -INFINITY ? 0.0 : exp(s - max) / sum;
                }
                if (lse) lse[(b * H + h) * Sq + i] = empty ? -INFINITY : nan ? NAN : max + log(sum);
            }
}

void ref_attention_scores(const float *q, const float *k, int64_t B, int64_t Hq, int64_t Hkv,
                          int64_t Sq, int64_t Sk, int64_t D, double *x) {
    const int64_t group = Hq / Hkv;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hq; ++h)
            for (int64_t i = 0; i < Sq; ++i)
                for (int64_t j = 0; j < Sk; ++j) {
                    const float *qi = q + ((b * Hq + h) * Sq + i) * D;
                    const float *kj = k + ((b * Hkv + h / group) * Sk + j) * D;
                    double dot = 0;
                    for (int64_t e = 0; e < D; ++e) dot += (double)qi[e] * kj[e];
                    x[((b * Hq + h) * Sq + i) * Sk + j] = dot;
                }
}

bool ref_attention(const float *q, const float *k, const float *v, int64_t B, int64_t Hq,
                   int64_t Hkv, int64_t Sq, int64_t Sk, int64_t D, int64_t Dv, double scale,
                   const ref_mask *m, double *out, double *p, double *lse) {
    double *x = malloc((size_t)(B * Hq * Sq * Sk) * sizeof *x);
    if (!x) return false;
    ref_attention_scores(q, k, B, Hq, Hkv, Sq, Sk, D, x);
    ref_softmax(x, B, Hq, Sq, Sk, scale, m, p, lse, NULL);
    free(x);
    const int64_t group = Hq / Hkv;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hq; ++h)
            for (int64_t i = 0; i < Sq; ++i)
                for (int64_t e = 0; e < Dv; ++e) {
                    const double *pi = p + ((b * Hq + h) * Sq + i) * Sk;
                    double sum = 0;
                    for (int64_t j = 0; j < Sk; ++j)
                        sum += pi[j] * v[((b * Hkv + h / group) * Sk + j) * Dv + e];
                    out[((b * Hq + h) * Sq + i) * Dv + e] = sum;
                }
    return true;
}

/* dS_ij = P_ij (dP_ij - D_i) of one row, into ds [Sk], with dP = dO v^T and D_i = sum_j P_ij dP_ij
 * (= rowsum(dO o O)); a row with no visible key gets zeros. */
static void row_score_grads(const double *p, const float *dout_i, const float *v, int64_t Sk,
                            int64_t Dv, double *ds) {
    double d = 0;
    bool empty = true;
    for (int64_t j = 0; j < Sk; ++j) {
        double dp = 0;
        for (int64_t e = 0; e < Dv; ++e) dp += (double)dout_i[e] * v[j * Dv + e];
        ds[j] = dp;
        if (p[j] > 0) d += p[j] * dp, empty = false;
    }
    for (int64_t j = 0; j < Sk; ++j) ds[j] = empty || !(p[j] > 0) ? 0.0 : p[j] * (ds[j] - d);
}

bool ref_attention_backward(const float *q, const float *k, const float *v, const float *dout,
                            int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Sk, int64_t D,
                            int64_t Dv, double scale, const ref_mask *m, double *dq, double *dk,
                            double *dv, double *dbias) {
    const size_t scores = (size_t)(B * Hq * Sq * Sk);
    double *x = malloc(scores * sizeof *x), *p = malloc(scores * sizeof *p);
    double *ds = malloc((size_t)Sk * sizeof *ds);
    bool ok = x && p && ds;
    if (ok) {
        ref_attention_scores(q, k, B, Hq, Hkv, Sq, Sk, D, x);
        ref_softmax(x, B, Hq, Sq, Sk, scale, m, p, NULL, NULL);
        memset(dq, 0, (size_t)(B * Hq * Sq * D) * sizeof *dq);
        memset(dk, 0, (size_t)(B * Hkv * Sk * D) * sizeof *dk);
        memset(dv, 0, (size_t)(B * Hkv * Sk * Dv) * sizeof *dv);
    }
    const int64_t group = Hq / Hkv;
    for (int64_t b = 0; ok && b < B; ++b)
        for (int64_t h = 0; h < Hq; ++h)
            for (int64_t i = 0; i < Sq; ++i) {
                const int64_t row = (b * Hq + h) * Sq + i, kv = b * Hkv + h / group;
                const double *pi = p + row * Sk;
                const float *qi = q + row * D, *doi = dout + row * Dv;
                const float *kh = k + kv * Sk * D, *vh = v + kv * Sk * Dv;
                row_score_grads(pi, doi, vh, Sk, Dv, ds);
                for (int64_t j = 0; j < Sk; ++j) {
                    if (!(pi[j] > 0)) continue; /* invisible, or a row with none (0 or NaN) */
                    for (int64_t e = 0; e < Dv; ++e) dv[(kv * Sk + j) * Dv + e] += pi[j] * doi[e];
                    if (dbias) dbias[at4(m->bias_strides, b, h, i, j)] += ds[j];
                    double dx = ds[j] * scale; /* through scale x, then the softcap's tanh */
                    if (m->softcap > 0) {
                        const double t = tanh(scale * x[row * Sk + j] / m->softcap);
                        dx *= 1 - t * t;
                    }
                    for (int64_t e = 0; e < D; ++e) {
                        dq[row * D + e] += dx * kh[j * D + e];
                        dk[(kv * Sk + j) * D + e] += dx * qi[e];
                    }
                }
            }
    free(x), free(p), free(ds);
    return ok;
}

double ref_feature(int feature_map, double x) {
    switch (feature_map) {
    case CLATTN_FEATURE_ELU1:
        return x > 0 ? x + 1 : exp(x);
    case CLATTN_FEATURE_RELU:
        return x > 0 ? x : 0;
    default:
        return x;
    }
}

static double feature_dot(const ref_linear *p, const float *q, const float *k) {
    double dot = 0;
    for (int64_t d = 0; d < p->D; ++d)
        dot += ref_feature(p->feature_map, q[d]) * ref_feature(p->feature_map, k[d]);
    return dot;
}

void ref_linear_attention(const ref_linear *p, const float *q, const float *k, const float *v,
                          double *out, double *scale) {
    const int64_t group = p->Hq / p->Hkv;
    double *num = malloc(sizeof(double) * (size_t)p->Dv);
    double *mag = malloc(sizeof(double) * (size_t)p->Dv);
    for (int64_t b = 0; b < p->B; ++b)
        for (int64_t h = 0; h < p->Hq; ++h)
            for (int64_t i = 0; i < p->Sq; ++i) {
                const int64_t row = ((b * p->Hq + h) * p->Sq + i), kv = b * p->Hkv + h / group;
                double den = 0;
                bool seen = false;
                for (int64_t e = 0; e < p->Dv; ++e) num[e] = mag[e] = 0;
                for (int64_t j = 0; j < p->Sk; ++j) {
                    if (!ref_visible(p->mask, b, h, i, j, p->Sq, p->Sk)) continue;
                    const double w = feature_dot(p, q + row * p->D, k + (kv * p->Sk + j) * p->D);
                    const float *vj = v + (kv * p->Sk + j) * p->Dv;
                    for (int64_t e = 0; e < p->Dv; ++e) num[e] += w * vj[e];
                    for (int64_t e = 0; e < p->Dv; ++e) mag[e] += fabs(w * vj[e]);
                    den += w;
                    seen = true;
                }
                for (int64_t e = 0; e < p->Dv; ++e) {
                    out[row * p->Dv + e] = seen ? num[e] / (den + p->eps) : 0.0;
                    if (scale) scale[row * p->Dv + e] = seen ? mag[e] / fabs(den + p->eps) : 0.0;
                }
            }
    free(num);
    free(mag);
}

static double feature_slope(int feature_map, double x) {
    switch (feature_map) {
    case CLATTN_FEATURE_ELU1:
        return x > 0 ? 1 : exp(x);
    case CLATTN_FEATURE_RELU:
        return x > 0 ? 1 : 0;
    default:
        return 1;
    }
}

bool ref_linear_attention_backward(const ref_linear *p, const float *q, const float *k,
                                   const float *v, const float *dout, double *dq, double *dk,
                                   double *dv) {
    const int64_t group = p->Hq / p->Hkv, D = p->D, Dv = p->Dv;
    double *out = malloc(sizeof(double) * (size_t)(p->B * p->Hq * p->Sq * Dv));
    double *dnum = malloc(sizeof(double) * (size_t)Dv),
           *dphi_q = malloc(sizeof(double) * (size_t)D);
    const bool ok = out && dnum && dphi_q;
    if (ok) {
        ref_linear_attention(p, q, k, v, out, NULL);
        memset(dq, 0, sizeof(double) * (size_t)(p->B * p->Hq * p->Sq * D));
        memset(dk, 0, sizeof(double) * (size_t)(p->B * p->Hkv * p->Sk * D));
        memset(dv, 0, sizeof(double) * (size_t)(p->B * p->Hkv * p->Sk * Dv));
    }
    for (int64_t b = 0; ok && b < p->B; ++b)
        for (int64_t h = 0; h < p->Hq; ++h)
            for (int64_t i = 0; i < p->Sq; ++i) {
                const int64_t row = (b * p->Hq + h) * p->Sq + i, kv = b * p->Hkv + h / group;
                const float *qi = q + row * D, *doi = dout + row * Dv;
                double den = p->eps, dden = 0;
                bool seen = false;
                for (int64_t j = 0; j < p->Sk; ++j)
                    if (ref_visible(p->mask, b, h, i, j, p->Sq, p->Sk))
                        den += feature_dot(p, qi, k + (kv * p->Sk + j) * D), seen = true;
                if (!seen) continue;
                for (int64_t e = 0; e < Dv; ++e) {
                    dnum[e] = doi[e] / den;
                    dden -= doi[e] * out[row * Dv + e] / den;
                }
                for (int64_t d = 0; d < D; ++d) dphi_q[d] = 0;
                for (int64_t j = 0; j < p->Sk; ++j) {
                    if (!ref_visible(p->mask, b, h, i, j, p->Sq, p->Sk)) continue;
                    const float *kj = k + (kv * p->Sk + j) * D, *vj = v + (kv * p->Sk + j) * Dv;
                    const double w = feature_dot(p, qi, kj);
                    double dw = dden;
                    for (int64_t e = 0; e < Dv; ++e) {
                        dw += dnum[e] * vj[e];
                        dv[(kv * p->Sk + j) * Dv + e] += w * dnum[e];
                    }
                    for (int64_t d = 0; d < D; ++d) {
                        dphi_q[d] += dw * ref_feature(p->feature_map, kj[d]);
                        dk[(kv * p->Sk + j) * D + d] += dw * ref_feature(p->feature_map, qi[d]) *
                                                        feature_slope(p->feature_map, kj[d]);
                    }
                }
                for (int64_t d = 0; d < D; ++d)
                    dq[row * D + d] = dphi_q[d] * feature_slope(p->feature_map, qi[d]);
            }
    free(out), free(dnum), free(dphi_q);
    return ok;
}

/* Query i's visible keys [0, end): the end of the prefix, checked to be one. */
static int64_t visible_end(const ref_linear *p, int64_t b, int64_t h, int64_t i) {
    int64_t end = 0;
    while (end < p->Sk && ref_visible(p->mask, b, h, i, end, p->Sq, p->Sk)) ++end;
    for (int64_t j = end; j < p->Sk; ++j)
        if (ref_visible(p->mask, b, h, i, j, p->Sq, p->Sk)) abort(); /* not a prefix: a test bug */
    return end;
}

void ref_linear_attention_cumsum(const ref_linear *p, const float *q, const float *k,
                                 const float *v, double *out) {
    const int64_t group = p->Hq / p->Hkv, D = p->D, Dv = p->Dv;
    double *S = malloc(sizeof(double) * (size_t)(D * Dv)), *z = malloc(sizeof(double) * (size_t)D);
    for (int64_t b = 0; b < p->B; ++b)
        for (int64_t h = 0; h < p->Hq; ++h) {
            const int64_t kv = b * p->Hkv + h / group;
            int64_t have = -1; /* keys [0, have) are in S and z; -1: not started */
            for (int64_t i = 0; i < p->Sq; ++i) {
                const int64_t row = (b * p->Hq + h) * p->Sq + i, end = visible_end(p, b, h, i);
                if (end < have || have < 0) {
                    memset(S, 0, sizeof(double) * (size_t)(D * Dv));
                    memset(z, 0, sizeof(double) * (size_t)D);
                    have = 0;
                }
                for (; have < end; ++have)
                    for (int64_t d = 0; d < D; ++d) {
                        const double f =
                            ref_feature(p->feature_map, k[(kv * p->Sk + have) * D + d]);
                        z[d] += f;
                        for (int64_t e = 0; e < Dv; ++e)
                            S[d * Dv + e] += f * v[(kv * p->Sk + have) * Dv + e];
                    }
                double den = p->eps;
                for (int64_t d = 0; d < D; ++d)
                    den += ref_feature(p->feature_map, q[row * D + d]) * z[d];
                for (int64_t e = 0; e < Dv; ++e) {
                    double num = 0;
                    for (int64_t d = 0; d < D; ++d)
                        num += ref_feature(p->feature_map, q[row * D + d]) * S[d * Dv + e];
                    out[row * Dv + e] = end > 0 ? num / den : 0.0;
                }
            }
        }
    free(S);
    free(z);
}

/* ---- multi-head attention ---- */

/* y [rows, n] = x [rows, k] w^T (w [n, k]) + bias, in float64. */
static void ref_linear_rows(const double *x, const float *w, const float *bias, int64_t rows,
                            int64_t n, int64_t k, double *y) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < n; ++c) {
            double sum = bias ? bias[c] : 0.0;
            for (int64_t e = 0; e < k; ++e) sum += x[r * k + e] * (double)w[c * k + e];
            y[r * n + c] = sum;
        }
}

static double *ref_widen(const float *x, int64_t n) {
    double *y = malloc((size_t)n * sizeof(double));
    for (int64_t i = 0; y && i < n; ++i) y[i] = x[i];
    return y;
}

/* torch's merged additive mask for score (b, h, i, j). */
static double ref_mha_mask(const ref_mha *p, int64_t b, int64_t h, int64_t i, int64_t j) {
    double m = 0.0;
    const int64_t *s = p->attn_strides, at = b * s[0] + h * s[1] + i * s[2] + j * s[3];
    if (p->kpm_keep && !p->kpm_keep[b * p->Sk + j]) m = -INFINITY;
    if (p->kpm_add) m += p->kpm_add[b * p->Sk + j];
    if (p->attn_keep && !p->attn_keep[at]) m = -INFINITY;
    if (p->attn_add) m += p->attn_add[at];
    if (p->causal && j > i) m = -INFINITY;
    return m;
}

/* x rounded to the dtype of the 16-bit path the reference stands for (as is without one). */
static double ref_mha_round(const ref_mha *p, double x) {
    if (p->rounding == CLATTN_F32) return x;
    float cell; /* room for any dtype's element */
    ref_store(&cell, p->rounding, 0, (float)x);
    return ref_load(&cell, p->rounding, 0);
}

static void ref_mha_round_all(const ref_mha *p, double *x, int64_t n) {
    for (int64_t i = 0; p->rounding != CLATTN_F32 && i < n; ++i) x[i] = ref_mha_round(p, x[i]);
}

/* One head's attention for query i: probabilities into w [Sk], output into ctx row (the
 * weights before their sum's division rounded for p v, and the outputs, under `rounding`). */
static void ref_mha_row(const ref_mha *p, const double *q, const double *k, const double *v,
                        int64_t b, int64_t h, int64_t i, double *w, double *ctx) {
    const int64_t D = p->E / p->H, E = p->E;
    const double scale = 1.0 / sqrt((double)D);
    double top = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < p->Sk; ++j) {
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d)
            dot += q[(b * p->Sq + i) * E + h * D + d] * k[(b * p->Sk + j) * E + h * D + d];
        w[j] = dot * scale + ref_mha_mask(p, b, h, i, j);
        if (w[j] > top) top = w[j];
    }
    for (int64_t j = 0; j < p->Sk; ++j) {
        w[j] = top == -INFINITY ? 0.0 : exp(w[j] - top);
        sum += w[j];
    }
    for (int64_t d = 0; d < D; ++d) {
        double acc = 0.0;
        for (int64_t j = 0; j < p->Sk; ++j)
            acc += ref_mha_round(p, w[j]) * v[(b * p->Sk + j) * E + h * D + d];
        ctx[(b * p->Sq + i) * E + h * D + d] = ref_mha_round(p, sum > 0 ? acc / sum : 0.0);
    }
    for (int64_t j = 0; j < p->Sk; ++j) w[j] = sum > 0 ? w[j] / sum : 0.0;
}

bool ref_mha_forward(const ref_mha *p, double *out, double *weights) {
    const int64_t E = p->E, rq = p->B * p->Sq, rk = p->B * p->Sk;
    double *xq = ref_widen(p->query, rq * E), *xk = ref_widen(p->key, rk * p->kdim),
           *xv = ref_widen(p->value, rk * p->vdim);
    double *q = malloc((size_t)(rq * E) * sizeof(double)),
           *k = malloc((size_t)(rk * E) * sizeof(double)),
           *v = malloc((size_t)(rk * E) * sizeof(double)),
           *ctx = malloc((size_t)(rq * E) * sizeof(double)),
           *w = malloc((size_t)p->Sk * sizeof(double));
    const bool ok = xq && xk && xv && q && k && v && ctx && w;
    if (ok) {
        ref_linear_rows(xq, p->wq, p->bq, rq, E, E, q);
        ref_linear_rows(xk, p->wk, p->bk, rk, E, p->kdim, k);
        ref_linear_rows(xv, p->wv, p->bv, rk, E, p->vdim, v);
        ref_mha_round_all(p, q, rq * E), ref_mha_round_all(p, k, rk * E);
        ref_mha_round_all(p, v, rk * E);
        for (int64_t b = 0; b < p->B; ++b)
            for (int64_t h = 0; h < p->H; ++h)
                for (int64_t i = 0; i < p->Sq; ++i) {
                    ref_mha_row(p, q, k, v, b, h, i, w, ctx);
                    if (weights)
                        memcpy(weights + ((b * p->H + h) * p->Sq + i) * p->Sk, w,
                               (size_t)p->Sk * sizeof(double));
                }
        ref_linear_rows(ctx, p->wo, p->bo, rq, E, E, out);
    }
    free(xq), free(xk), free(xv), free(q), free(k), free(v), free(ctx), free(w);
    return ok;
}
