/* Host reference: storage conversions and the reference ops, written from the semantics in the
 * design (not from the kernels), in float64 where an op computes and in f32 where the library
 * promises f32 rounding (a copy with a bias add rounds once in f32). */
#ifndef CLATTN_TEST_REF_H
#define CLATTN_TEST_REF_H

#include "clattn.h"

#include <stdbool.h>
#include <stdint.h>

uint16_t ref_f32_to_f16(float f); /* round to nearest even */
float ref_f16_to_f32(uint16_t h);
uint16_t ref_f32_to_bf16(float f); /* round to nearest even, NaN kept quiet */
float ref_bf16_to_f32(uint16_t h);

/* Element `index` of a host array of `dtype` (f32/f16/bf16), as f32. */
float ref_load(const void *base, clattn_dtype dtype, uint64_t index);
/* Stores v, converted to `dtype`, at element `index`. */
void ref_store(void *base, clattn_dtype dtype, uint64_t index, float v);
/* True when the elements are the same bits, or (when `nan_equal`) both NaN. */
bool ref_same_element(const void *a, const void *b, clattn_dtype dtype, uint64_t index,
                      bool nan_equal);

/* clattn_copy on host images of the buffers: dst[i] = convert(src[i] (+ bias[i])) over dst's
 * shape, with each tensor's own offset and strides (bias may be NULL). */
void ref_copy(const void *src, const clattn_tensor *src_view, const void *bias,
              const clattn_tensor *bias_view, void *dst, const clattn_tensor *dst_view);

/* ---- the attention mask and softmax, straight from the design's formulas, in float64 ---- */

typedef struct ref_mask {
    int causal, bottom_right, window, empty_nan;
    int64_t left, right, global_stride; /* window sides < 0: unbounded */
    double softcap;
    const int32_t *key_lengths, *query_lengths; /* [B] or NULL */
    const uint8_t *keep;                        /* NULL, or indexed with keep_strides */
    int64_t keep_strides[4];
    const double *bias; /* NULL, or indexed with bias_strides */
    int64_t bias_strides[4];
    const double *alibi; /* [H] or NULL */
} ref_mask;

/* Whether key j is visible to query i of batch b, head h. */
bool ref_visible(const ref_mask *m, int64_t b, int64_t h, int64_t i, int64_t j, int64_t Sq,
                 int64_t Sk);
/* The masked logit before visibility: scale*x, softcap, bias, ALiBi. */
double ref_score(const ref_mask *m, double scale, double x, int64_t b, int64_t h, int64_t i,
                 int64_t j, int64_t Sq, int64_t Sk);
/* y = softmax(mask(scale * x)) over the last axis of dense [B,H,Sq,Sk]; lse [B,H,Sq] may be
 * NULL; visible (dense, may be NULL) receives the visibility of each entry. */
void ref_softmax(const double *x, int64_t B, int64_t H, int64_t Sq, int64_t Sk, double scale,
                 const ref_mask *m, double *y, double *lse, uint8_t *visible);

/* ---- attention, in float64 ---- */

/* The raw scores x [B,Hq,Sq,Sk] = q k^T of dense q [B,Hq,Sq,D] and k [B,Hkv,Sk,D]; query head h
 * reads key head h / (Hq / Hkv). */
void ref_attention_scores(const float *q, const float *k, int64_t B, int64_t Hq, int64_t Hkv,
                          int64_t Sq, int64_t Sk, int64_t D, double *x);
/* out [B,Hq,Sq,Dv] = softmax(mask(scale q k^T)) v over dense tensors (v [B,Hkv,Sk,Dv]); p
 * [B,Hq,Sq,Sk] receives the probabilities, lse [B,Hq,Sq] (may be NULL) the log-sum-exp, as
 * ref_softmax gives them. False when host memory runs out. */
bool ref_attention(const float *q, const float *k, const float *v, int64_t B, int64_t Hq,
                   int64_t Hkv, int64_t Sq, int64_t Sk, int64_t D, int64_t Dv, double scale,
                   const ref_mask *m, double *out, double *p, double *lse);

/* The gradients of ref_attention's out, given dout [B,Hq,Sq,Dv], straight from the formulas:
 * dP = dO v^T, dS = P (dP - rowsum(dO o O)), then through the softcap (ds/dx = scale (1 -
 * tanh^2)) to dq = dX k and dk = dX^T q, dv = P^T dO; kv heads sum over their query heads. Keys a
 * query cannot see, and rows with no visible key (empty_nan too), contribute nothing. dbias (may
 * be NULL) is accumulated at m->bias_strides, so that a broadcast dim (stride 0) sums, as
 * autograd sums it: the caller zeroes it. dq [B,Hq,Sq,D], dk [B,Hkv,Sk,D], dv [B,Hkv,Sk,Dv].
 * False when host memory runs out. */
bool ref_attention_backward(const float *q, const float *k, const float *v, const float *dout,
                            int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Sk, int64_t D,
                            int64_t Dv, double scale, const ref_mask *m, double *dq, double *dk,
                            double *dv, double *dbias);

/* ---- linear attention, in float64: the naive masked O(S^2) form and the cumsum form ---- */

typedef struct ref_linear {
    int64_t B, Hq, Hkv, Sq, Sk, D, Dv;
    int feature_map; /* clattn_feature_map */
    double eps;
    const ref_mask *mask; /* causal, alignment and lengths only */
} ref_linear;

double ref_feature(int feature_map, double x);
/* out[b,h,i,:] = sum_j w_ij v_j / (sum_j w_ij + eps) over the visible j (ref_visible), with
 * w_ij = phi(q_i).phi(k_j); 0 for a row that sees no key. q, k, v, out, scale are dense
 * [B,H,S,D]. scale (may be NULL) receives each element's error scale, sum_j |w_ij v_j[e]| /
 * |sum_j w_ij + eps|: what f32 rounding of the sums is relative to. */
void ref_linear_attention(const ref_linear *p, const float *q, const float *k, const float *v,
                          double *out, double *scale);
/* The same from running sums: S and z over the keys in order, each query reading them at the
 * end of its visible prefix (which the mask makes a prefix). */
void ref_linear_attention_cumsum(const ref_linear *p, const float *q, const float *k,
                                 const float *v, double *out);
/* The gradients of ref_linear_attention's out, given dout [B,Hq,Sq,Dv]: with w_ij = phi(q_i) .
 * phi(k_j), out_i = num_i / (den_i + eps), dnum_i = dO_i / (den_i + eps), dden_i = -dO_i . out_i
 * / (den_i + eps), dw_ij = dnum_i . v_j + dden_i, then through phi' (elu1: 1 above 0, exp below;
 * relu: 1 above 0, else 0; identity: 1). kv heads sum over their query heads; a query that sees
 * no key contributes nothing. dq [B,Hq,Sq,D], dk [B,Hkv,Sk,D], dv [B,Hkv,Sk,Dv]. False when host
 * memory runs out. */
bool ref_linear_attention_backward(const ref_linear *p, const float *q, const float *k,
                                   const float *v, const float *dout, double *dq, double *dk,
                                   double *dv);

/* ---- multi-head attention: torch.nn.MultiheadAttention's forward (eval), in float64 ---- */

typedef struct ref_mha {
    int64_t B, Sq, Sk, E, H, kdim, vdim;
    const float *query, *key, *value; /* dense [B,Sq,E], [B,Sk,kdim], [B,Sk,vdim] */
    const float *wq, *wk, *wv, *wo;   /* dense [E,E], [E,kdim], [E,vdim], [E,E] */
    const float *bq, *bk, *bv, *bo;   /* [E] each, or NULL */
    const uint8_t *kpm_keep;          /* [B,Sk], non-zero attends; or NULL */
    const float *kpm_add;             /* [B,Sk] added to the scores; or NULL */
    const uint8_t *attn_keep;         /* indexed [b,h,i,j] with attn_strides; or NULL */
    const float *attn_add;            /* likewise, added to the scores; or NULL */
    int64_t attn_strides[4];
    int causal; /* key j hidden from query i when j > i */
    /* CLATTN_F32: exact. f16 or bf16: the path that stores its intermediates in that dtype, as
     * clattn's on matrix units and torch's f16 MHA do: q, k and v rounded after projection, the
     * weights (before their sum's division, as attention_mma rounds them) before p v, and the
     * attention's outputs. (Clattn's composed path, taken when weights are asked for, divides
     * first and multiplies in f32: its error stays below this path's.) */
    clattn_dtype rounding;
} ref_mha;

/* out [B,Sq,E] and (when not NULL) the per-head weights [B,H,Sq,Sk], the way torch computes
 * them: the masks become one additive mask (a hidden key adds -inf), softmax of
 * q k^T / sqrt(D) + mask per head; a row whose keys are all hidden gets weights 0 (clattn's
 * semantics; torch 1.13 gives NaN). False when host memory runs out. */
bool ref_mha_forward(const ref_mha *p, double *out, double *weights);
#endif
