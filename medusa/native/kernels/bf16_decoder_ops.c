/* The bfloat16 decoder layer's small operations between its matmuls, one thread, AVX-512 (+ BF16 dot
 * products): RMSNorm (with the residual add before it), rotary embedding in place, grouped-query attention
 * of a few query rows over the KV cache, and SiLU(gate) * up. Built into the same library as
 * amx_bf16_rows.c by medusa/modeling/bf16_kernel.py and driven by medusa/modeling/native_body.py.
 *
 * Each op rounds to bfloat16 where Hugging Face's Llama code does (an op's output is a bfloat16 tensor) and
 * computes in float32 in between. Every output row depends on that row's inputs only, in one fixed order of
 * operations: a token's result does not depend on which rows share the call. Attention skips the columns
 * its mask sets below -1e30 and sums the others in column order, so a query attends over the same values
 * in the same order whether its context sits in the cache or in the same tree step: a chain or a tree
 * verified in one forward computes, bit for bit, what one-token forwards would. Widths are multiples of 16
 * (head_dim of 32); the Python side checks them. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16_simd.h"
#include "medusa_ops.h"

static inline __m256i to_bf16(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); } /* round to nearest even */

static inline __m512 round16(__m512 x) { /* x rounded to bfloat16, as float32 */
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16(x)), 16));
}

static inline void store16(uint16_t *p, __m512 x) { _mm256_storeu_si256((__m256i *)p, to_bf16(x)); }

static inline __m512 negate(__m512 x) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000)));
}

/* out = w * bf16(h * rsqrt(mean(h^2) + eps)) for one row of d values. */
static void norm_row(const uint16_t *h, const uint16_t *w, long d, float eps, uint16_t *out) {
    __m512 acc = _mm512_setzero_ps();
    for (long i = 0; i < d; i += 16) {
        __m512 v = load16(h + i);
        acc = _mm512_fmadd_ps(v, v, acc);
    }
    __m512 s = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)d + eps));
    for (long i = 0; i < d; i += 16)
        store16(out + i, _mm512_mul_ps(load16(w + i), round16(_mm512_mul_ps(load16(h + i), s))));
}

/* out [rows, d] = RMSNorm(x [rows, d]) with weight w [d]; rows contiguous. */
void medusa_rms_norm(const uint16_t *x, long rows, long d, const uint16_t *w, float eps, uint16_t *out) {
    for (long r = 0; r < rows; r++) norm_row(x + r * d, w, d, eps, out + r * d);
}

/* h_out = bf16(h + delta), out = RMSNorm(h_out) with weight w; all [rows, d] contiguous. */
void medusa_add_rms_norm(const uint16_t *h, const uint16_t *delta, long rows, long d, const uint16_t *w,
                         float eps, uint16_t *h_out, uint16_t *out) {
    for (long r = 0; r < rows; r++) {
        const uint16_t *a = h + r * d, *b = delta + r * d;
        uint16_t *s = h_out + r * d;
        for (long i = 0; i < d; i += 16) store16(s + i, _mm512_add_ps(load16(a + i), load16(b + i)));
        norm_row(s, w, d, eps, out + r * d);
    }
}

/* Rotary embedding in place on `heads` heads of head_dim hd at the start of each row of x (row stride ldx):
 * x * cos + rotate_half(x) * sin, each product and the sum rounded to bfloat16; cos / sin [rows, hd]
 * (row stride ldc), bfloat16 as the model's rotary module gives them. */
void medusa_rope(uint16_t *x, long rows, long ldx, long heads, long hd, const uint16_t *cos,
                 const uint16_t *sin, long ldc) {
    long half = hd / 2;
    for (long r = 0; r < rows; r++) {
        const uint16_t *c = cos + r * ldc, *s = sin + r * ldc;
        for (long h = 0; h < heads; h++) {
            uint16_t *p = x + r * ldx + h * hd;
            for (long i = 0; i < half; i += 16) {
                __m512 a = load16(p + i), b = load16(p + half + i);
                __m512 lo = _mm512_add_ps(round16(_mm512_mul_ps(a, load16(c + i))),
                                          round16(_mm512_mul_ps(negate(b), load16(s + i))));
                __m512 hi = _mm512_add_ps(round16(_mm512_mul_ps(b, load16(c + half + i))),
                                          round16(_mm512_mul_ps(a, load16(s + half + i))));
                store16(p + i, lo);
                store16(p + half + i, hi);
            }
        }
    }
}

/* acc[0 .. hd/16-1] += sum over columns j of p[j] * v_j (values vb: bfloat16 rows of hd, ss apart, each
 * value taken as the float32 it converts to exactly), skipping p[j] == 0;
 * returns the sum of the p[j], added in column order (a sum over lanes would depend on where each column
 * falls in its 16-column block: a tree's node and the same token decoded alone would round it differently).
 * (head_dim 64 goes four queries at a time: weigh4_64.) */
static float weigh_values(const float *p, const uint16_t *vb, long ss, long hd, long cols, __m512 *acc) {
    float total = 0.0f;
    for (long j = 0; j < cols; j++) {
        if (p[j] == 0.0f) continue;
        total += p[j];
        __m512 w = _mm512_set1_ps(p[j]);
        for (long v = 0; v < hd / 16; v++)
            acc[v] = _mm512_fmadd_ps(w, load16(vb + j * ss + 16 * v), acc[v]);
    }
    return total;
}

/* One query's scores sc[0 .. cols-1] (-inf where skipped) -> unnormalised probabilities in place (0 where
 * skipped, exp(score - max) elsewhere). */
static void probabilities(float *sc, long cols) {
    long width = (cols + 15) / 16 * 16;
    __m512 ninf = _mm512_set1_ps(-INFINITY), top = ninf;
    for (long j = cols; j < width; j++) sc[j] = -INFINITY;
    for (long j0 = 0; j0 < width; j0 += 16) top = _mm512_max_ps(top, _mm512_loadu_ps(sc + j0));
    __m512 shift = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    for (long j0 = 0; j0 < width; j0 += 16) {
        __m512 s = _mm512_loadu_ps(sc + j0);
        __mmask16 live = _mm512_cmp_ps_mask(s, ninf, _CMP_NEQ_OQ);
        _mm512_storeu_ps(sc + j0, _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(s, shift))));
    }
}

static void store_scaled(uint16_t *out, const __m512 *acc, long nv, float sum) {
    __m512 inv = _mm512_set1_ps(sum > 0.0f ? 1.0f / sum : 0.0f);
    for (long v = 0; v < nv; v++) store16(out + 16 * v, _mm512_mul_ps(acc[v], inv));
}

/* Up to four queries of head_dim 64 over the same values: query e's probabilities at p + e * stride. Each
 * query's accumulators and sum take the same adds, in the same order, as weigh_values gives it alone (a
 * zero probability adds nothing); the four independent chains and the shared value loads keep the core
 * busy where one query waits on its FMA latency. */
static void weigh4_64(const float *p, long stride, long nq, const uint16_t *vb, long ss, long cols,
                      uint16_t *const *outs) {
    __m512 z = _mm512_setzero_ps();
    __m512 a0 = z, a1 = z, a2 = z, a3 = z, b0 = z, b1 = z, b2 = z, b3 = z;
    __m512 c0 = z, c1 = z, c2 = z, c3 = z, d0 = z, d1 = z, d2 = z, d3 = z;
    float t0 = 0.0f, t1 = 0.0f, t2 = 0.0f, t3 = 0.0f;
    const float *p0 = p, *p1 = nq > 1 ? p + stride : NULL, *p2 = nq > 2 ? p + 2 * stride : NULL,
                *p3 = nq > 3 ? p + 3 * stride : NULL;
    for (long j = 0; j < cols; j++) {
        float q0 = p0[j], q1 = p1 ? p1[j] : 0.0f, q2 = p2 ? p2[j] : 0.0f, q3 = p3 ? p3[j] : 0.0f;
        if (q0 == 0.0f && q1 == 0.0f && q2 == 0.0f && q3 == 0.0f) continue;
        const uint16_t *vj = vb + j * ss;
        __m512 v0 = load16(vj), v1 = load16(vj + 16), v2 = load16(vj + 32), v3 = load16(vj + 48);
#define WEIGH(q, t, x0, x1, x2, x3)                                                                       \
    if (q != 0.0f) {                                                                                      \
        __m512 w = _mm512_set1_ps(q);                                                                     \
        t += q;                                                                                           \
        x0 = _mm512_fmadd_ps(w, v0, x0), x1 = _mm512_fmadd_ps(w, v1, x1);                                 \
        x2 = _mm512_fmadd_ps(w, v2, x2), x3 = _mm512_fmadd_ps(w, v3, x3);                                 \
    }
        WEIGH(q0, t0, a0, a1, a2, a3)
        WEIGH(q1, t1, b0, b1, b2, b3)
        WEIGH(q2, t2, c0, c1, c2, c3)
        WEIGH(q3, t3, d0, d1, d2, d3)
#undef WEIGH
    }
    __m512 acc[4][4] = {{a0, a1, a2, a3}, {b0, b1, b2, b3}, {c0, c1, c2, c3}, {d0, d1, d2, d3}};
    float sums[4] = {t0, t1, t2, t3};
    for (long e = 0; e < nq; e++) store_scaled(outs[e], acc[e], 4, sums[e]);
}

/* n queries' scores (query i at sc + i * stride; -inf where skipped) -> out[i] = softmax . values (vb). */
static void softmax_values(float *sc, long stride, long n, const uint16_t *vb, long ss, long hd, long cols,
                           uint16_t *const *outs) {
    for (long i = 0; i < n; i++) probabilities(sc + i * stride, cols);
    if (hd == 64) {
        for (long i = 0; i < n; i += 4)
            weigh4_64(sc + i * stride, stride, n - i < 4 ? n - i : 4, vb, ss, cols, outs + i);
        return;
    }
    for (long i = 0; i < n; i++) {
        __m512 acc[16];
        for (long v = 0; v < 16; v++) acc[v] = _mm512_setzero_ps();
        store_scaled(outs[i], acc, hd / 16, weigh_values(sc + i * stride, vb, ss, hd, cols, acc));
    }
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} score_tiles;

/* Tiles 0 (C: 16 keys x 16 queries, float32), 1 (A: 16 keys x 32 bfloat16), 2 (B: 16 pairs x 16 queries). */
static void configure_score_tiles(void) {
    score_tiles cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 3; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
}

/* Without AMX: the same C tile through AVX-512 BF16. ct[m][i] (16 x 16 float32) = key m (row m of a, stride
 * lda elements) . query i over `pairs` pairs of head_dim, qt laid out [pairs][16 queries][2]; each score is
 * one chain of vdpbf16ps over the pairs, whichever tile row and column it falls in. */
static void scores16(const uint16_t *a, long lda, const uint16_t *qt, long pairs, float *ct) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++) acc[m] = _mm512_setzero_ps();
    for (long p = 0; p < pairs; p++) {
        __m512bh qv = (__m512bh)_mm512_loadu_si512((const void *)(qt + p * 32));
#pragma GCC unroll 16
        for (int m = 0; m < 16; m++) {
            __m512bh kv = (__m512bh)_mm512_set1_epi32(*(const bf16_pair *)(a + m * lda + 2 * p));
            acc[m] = _mm512_dpbf16_ps(acc[m], kv, qv);
        }
    }
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++) _mm512_storeu_ps(ct + 16 * m, acc[m]);
}

/* cq[i][m] = ct[m][i]: 16 rows of 16 32-bit lanes (row m at ct + ld m) read column-major, by register
 * shuffles (the values move, none is computed): the float32 C tile (key-major, ld 16) read query-major, or
 * 16 keys' bfloat16 pairs read pair-major (scores_few). */
static inline void transpose16(const float *ct, long ld, __m512 *cq) {
    __m512 r[16], u[16];
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++) r[m] = _mm512_loadu_ps(ct + ld * m);
#pragma GCC unroll 8
    for (int k = 0; k < 16; k += 2) { /* 2 x 2 blocks of single lanes */
        u[k] = _mm512_unpacklo_ps(r[k], r[k + 1]);
        u[k + 1] = _mm512_unpackhi_ps(r[k], r[k + 1]);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 16; k += 4) { /* 4 x 4 blocks within each 128-bit lane */
        r[k] = _mm512_shuffle_ps(u[k], u[k + 2], 0x44);
        r[k + 1] = _mm512_shuffle_ps(u[k], u[k + 2], 0xEE);
        r[k + 2] = _mm512_shuffle_ps(u[k + 1], u[k + 3], 0x44);
        r[k + 3] = _mm512_shuffle_ps(u[k + 1], u[k + 3], 0xEE);
    }
#pragma GCC unroll 2
    for (int k = 0; k < 16; k += 8) { /* 128-bit lanes: rows k..k+3 with k+4..k+7 */
        for (int e = 0; e < 4; e++) {
            u[k + e] = _mm512_shuffle_f32x4(r[k + e], r[k + 4 + e], 0x88);
            u[k + 4 + e] = _mm512_shuffle_f32x4(r[k + e], r[k + 4 + e], 0xDD);
        }
    }
#pragma GCC unroll 8
    for (int e = 0; e < 8; e++) {
        cq[e] = _mm512_shuffle_f32x4(u[e], u[8 + e], 0x88);
        cq[8 + e] = _mm512_shuffle_f32x4(u[e], u[8 + e], 0xDD);
    }
}

/* The scores of 16 keys (row m of a, stride lda elements) for n few queries (qp[i]: query i's head_dim
 * values), query-major: cq[i] lane m = key m . query i. The keys' pairs are transposed (kt[p] lane m = key
 * m's pair p), then each query is one vdpbf16ps chain over the pairs in order with its pair broadcast: the
 * same products, operands and order as scores16 gives each score (key pair first, query pair second), so a
 * score's bits do not depend on how many queries share its block. Without the 16-query tile, n queries cost
 * n chains instead of 16. */
#define FEW 8 /* query blocks of at most this many take scores_few (without AMX) */
static void scores_few(const uint16_t *a, long lda, const uint16_t *const *qp, long n, long pairs, __m512 *cq) {
    __m512 kt[128];
    for (long c = 0; c < pairs; c += 16) transpose16((const float *)(a + 2 * c), lda / 2, kt + c);
    __m512 acc[FEW];
    for (long i = 0; i < n; i++) acc[i] = _mm512_setzero_ps();
    for (long p = 0; p < pairs; p++) {
        __m512bh kv = (__m512bh)_mm512_castps_si512(kt[p]);
        for (long i = 0; i < n; i++)
            acc[i] = _mm512_dpbf16_ps(acc[i], kv,
                                      (__m512bh)_mm512_set1_epi32(*(const bf16_pair *)(qp[i] + 2 * p)));
    }
    for (long i = 0; i < n; i++) cq[i] = acc[i];
}

/* Ask for a later KV head's keys and values at columns j0 .. j0+15 (into L2) while this head's block j0 is
 * scored: by this head's last block that head's whole cache is on its way. A head's cache is a few KB of
 * each kind streamed from memory, too short for the hardware prefetcher to run ahead: 128 slots x 270
 * columns x 3 KV heads of 64 went at ~8 GB/s, 26-30 us a slot; asking one, two or three heads ahead,
 * 14-19 us (the three alike within the noise; the same cache held in L2: 9-10 us). Prefetches change no
 * result. */
#define AHEAD 2 /* KV heads ahead */
static void prefetch_next(const uint16_t *kn, const uint16_t *vn, long ss, long hd, long j0, long cols) {
    long row = hd * 2; /* bytes */
    for (long j = j0; j < j0 + 16 && j < cols; j++)
        for (long b = 0; b < row; b += 64) {
            _mm_prefetch((const char *)(kn + j * ss) + b, _MM_HINT_T1);
            _mm_prefetch((const char *)(vn + j * ss) + b, _MM_HINT_T1);
        }
}

/* The lanes of columns j0 .. j0+15 (those below cols) of `cols` long bfloat16 additive mask row m as float32
 * (0 past cols), the lanes inside cols in *in. */
static inline __m512 mask16(const uint16_t *m, long j0, long cols, __mmask16 *in) {
    long left = cols - j0 < 16 ? cols - j0 : 16;
    *in = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(*in, m + j0)), 16));
}

/* The columns among j0 .. j0+15 that mask row m lets a query see (inside cols, not below -1e30). */
static inline __mmask16 live16(const uint16_t *m, long j0, long cols) {
    __mmask16 in;
    __m512 mv = mask16(m, j0, cols, &in);
    return in & _mm512_cmp_ps_mask(mv, _mm512_set1_ps(-1e30f), _CMP_GE_OQ);
}

/* The columns n queries attend to (mask rows mrow[i], `cols` long; a column below -1e30 is skipped): returns
 * one past the last such column and sets *first to the first (0 and 0 when there is none). Rows repeated
 * (the queries of one token's heads) are read once. */
static long live_span(const uint16_t *const *mrow, long n, long cols, long *first) {
    long lo = cols, hi = 0;
    for (long i = 0; i < n; i++) {
        if (i > 0 && mrow[i] == mrow[i - 1]) continue;
        const uint16_t *m = mrow[i];
        for (long j0 = 0; j0 < cols; j0 += 16) { /* the first live column */
            __mmask16 live = live16(m, j0, cols);
            if (live) {
                long j = j0 + __builtin_ctz((unsigned)live);
                if (j < lo) lo = j;
                break;
            }
        }
        for (long j0 = (cols - 1) / 16 * 16; j0 >= 0; j0 -= 16) { /* the last live column */
            __mmask16 live = live16(m, j0, cols);
            if (live) {
                long j = j0 + 31 - __builtin_clz((unsigned)live);
                if (j + 1 > hi) hi = j + 1;
                break;
            }
        }
    }
    *first = lo < hi ? lo : 0;
    return lo < hi ? hi : 0;
}

/* Attention of batch x t query rows (row bi * t + ti of q, stride ldq; head h at column h * hd) over
 * `cols` cached columns of keys / values kc / vc ([B, Hkv, S, hd]: strides sb, sh, ss elements, the last 1),
 * query head h reading KV head h / (hq / hkv). mask [B, t, cols] bfloat16 additive (strides mb, mt): a column
 * below -1e30 is skipped. out [rows, hq * hd] (stride ldo) in bfloat16. scratch: cols * (hd + 16) + 512
 * floats. The scores of 16 keys x 16 queries are one pair of AMX tile products per 32 of head_dim (without AMX
 * the same through AVX-512 BF16, scores16; each score
 * the same chain of products whichever tile row and column it falls in), the softmax and the weighted sum of
 * values in float32 per query. */
void medusa_attention(const uint16_t *q, long ldq, long batch, long t, long hq, long hkv, long hd,
                      const uint16_t *kc, const uint16_t *vc, long sb, long sh, long ss, long cols,
                      const uint16_t *mask, long mb, long mt, float scale, uint16_t *out, long ldo,
                      float *scratch) {
    long group = hq / hkv, nq = t * group, width = (cols + 15) / 16 * 16 + 16, chunks = hd / 32;
    float *sc = scratch, ct[256]; /* scores of 16 queries: scratch holds 16 * width floats */
    uint16_t qt[256 * 16], tail[16 * 256];
    if (medusa_amx_on) configure_score_tiles();
    for (long bi = 0; bi < batch; bi++)
        for (long g = 0; g < hkv; g++) {
            const uint16_t *kb = kc + bi * sb + g * sh, *vb = vc + bi * sb + g * sh;
            for (long q0 = 0; q0 < nq; q0 += 16) { /* query i: row i / group, head g * group + i % group */
                long n = nq - q0 < 16 ? nq - q0 : 16;
                const uint16_t *mrow[16], *qp[16]; /* query i's mask row and values */
                uint16_t *outs[16];                /* and where its output goes */
                int few = !medusa_amx_on && n <= FEW && hd % 32 == 0 && hd <= 256;
                if (!few) memset(qt, 0, sizeof qt);
                for (long i = 0; i < n; i++) {
                    long qi = q0 + i;
                    const uint16_t *qh = q + (bi * t + qi / group) * ldq + (g * group + qi % group) * hd;
                    if (!few)
                        for (long c = 0; c < hd; c++) qt[((c / 32) * 16 + (c % 32) / 2) * 32 + i * 2 + c % 2] = qh[c];
                    mrow[i] = mask + bi * mb + (qi / group) * mt;
                    qp[i] = qh;
                    outs[i] = out + (bi * t + qi / group) * ldo + (g * group + qi % group) * hd;
                }
                /* only the 16-column blocks from the first to the last column any of these queries
                 * attends to: the rest is skipped whole (its keys never read) */
                long lo = 0, hi = live_span(mrow, n, cols, &lo), base = lo / 16 * 16;
                for (long j0 = base; j0 < hi; j0 += 16) {
                    long left = cols - j0 < 16 ? cols - j0 : 16;
                    const uint16_t *a = kb + j0 * ss;
                    long ahead = (bi * hkv + g) + AHEAD; /* the head AHEAD after this one (row-major) */
                    if (q0 == 0 && ahead < batch * hkv) {
                        long nb = ahead / hkv, ng = ahead % hkv;
                        prefetch_next(kc + nb * sb + ng * sh, vc + nb * sb + ng * sh, ss, hd, j0, cols);
                    }
                    long lda = ss * 2;
                    if (left < 16) { /* the last keys, zero-padded (nothing read past the cache's columns) */
                        memset(tail + left * hd, 0, (16 - left) * hd * 2); /* the rows read past the keys */
                        for (long m = 0; m < left; m++) memcpy(tail + m * hd, a + m * ss, hd * 2);
                        a = tail;
                        lda = hd * 2;
                    }
                    __m512 cq[16]; /* cq[i]: query i's 16 scores */
                    if (few) {
                        scores_few(a, lda / 2, qp, n, hd / 2, cq);
                    } else if (medusa_amx_on) {
                        _tile_zero(0);
                        for (long c = 0; c < chunks; c++) {
                            _tile_loadd(1, a + 32 * c, lda);
                            _tile_loadd(2, qt + c * 16 * 32, 64);
                            _tile_dpbf16ps(0, 1, 2);
                        }
                        _tile_stored(0, ct, 64);
                        transpose16(ct, 16, cq); /* column i of the C tile */
                    } else {
                        scores16(a, lda / 2, qt, hd / 2, ct);
                        transpose16(ct, 16, cq);
                    }
                    for (long i = 0; i < n; i++) {
                        __m512 raw = cq[i];
                        __mmask16 in;
                        __m512 mv = mask16(mrow[i], j0, cols, &in);
                        __mmask16 live = in & _mm512_cmp_ps_mask(mv, _mm512_set1_ps(-1e30f), _CMP_GE_OQ);
                        __m512 score = _mm512_add_ps(_mm512_mul_ps(raw, _mm512_set1_ps(scale)), mv);
                        score = _mm512_mask_blend_ps(live, _mm512_set1_ps(-INFINITY), score);
                        _mm512_storeu_ps(sc + i * width + j0, score);
                    }
                }
                float *from = sc + base;
                softmax_values(from, width, n, vb + base * ss, ss, hd, hi > base ? hi - base : 0, outs);
            }
        }
    if (medusa_amx_on) _tile_release();
}

/* out [rows, inter] = bf16(SiLU(gate)) * up, gate and up side by side in gu [rows, 2 * inter] (stride ldg). */
void medusa_silu_mul(const uint16_t *gu, long rows, long inter, long ldg, uint16_t *out, long ldo) {
    for (long r = 0; r < rows; r++) {
        const uint16_t *g = gu + r * ldg, *u = g + inter;
        uint16_t *o = out + r * ldo;
        for (long i = 0; i < inter; i += 16) {
            __m512 x = load16(g + i);
            __m512 act = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(negate(x))));
            store16(o + i, _mm512_mul_ps(round16(act), load16(u + i)));
        }
    }
}

/* The keys and values of t new entries per batch row appended to a cache held in buffers kb / vb
 * [B, hkv, capacity, hd] (strides sb, sh, ss; hd contiguous; both laid out alike) at columns start ..
 * start + t - 1: from the fused q/k/v rows qkv [B * t, ldq] (after the rotary embedding), k at column qd,
 * v at qd + hkv * hd. */
void medusa_kv_append(const uint16_t *qkv, long ldq, long batch, long t, long hkv, long hd, long qd,
                      uint16_t *kb, uint16_t *vb, long sb, long sh, long ss, long start) {
    for (long b = 0; b < batch; b++)
        for (long i = 0; i < t; i++) {
            const uint16_t *row = qkv + (b * t + i) * ldq + qd;
            for (long h = 0; h < hkv; h++) {
                long at = b * sb + h * sh + (start + i) * ss;
                memcpy(kb + at, row + h * hd, hd * 2);
                memcpy(vb + at, row + (hkv + h) * hd, hd * 2);
            }
        }
}

/* out = bf16(a + b) over n values (n a multiple of 16), as torch adds two bfloat16 tensors. */
void medusa_add(const uint16_t *a, const uint16_t *b, long n, uint16_t *out) {
    for (long i = 0; i < n; i += 16) store16(out + i, _mm512_add_ps(load16(a + i), load16(b + i)));
}
