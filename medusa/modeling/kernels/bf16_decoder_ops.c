/* The bfloat16 decoder layer's small operations between its matmuls, one thread, AVX-512 (+ BF16 dot
 * products): RMSNorm (with the residual add before it), rotary embedding in place, grouped-query attention
 * of a few query rows over the KV cache, and SiLU(gate) * up. Built into the same library as
 * amx_bf16_rows.c by medusa/modeling/amx_kernel.py and driven by medusa/modeling/native_body.py.
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

static inline __m512 load16(const uint16_t *p) { /* 16 bfloat16 -> float32 */
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

static inline __m256i to_bf16(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); } /* round to nearest even */

static inline __m512 round16(__m512 x) { /* x rounded to bfloat16, as float32 */
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16(x)), 16));
}

static inline void store16(uint16_t *p, __m512 x) { _mm256_storeu_si256((__m256i *)p, to_bf16(x)); }

static inline __m512 negate(__m512 x) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000)));
}

/* e^x in float32 (Cephes' polynomial, ~1 ulp), x clamped to [-87.3, 88.7]. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, n);
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

/* The 16 lane sums of d[0..15] as one vector (lane c: the sum of d[c]'s lanes), by a fixed tree of adds:
 * each level pairs vectors lane block by lane block (halving the blocks), leaving the owners in bit-reversed
 * lane order, which a last permutation undoes. Each sum's order of adds is the same whatever the others. */
typedef struct {
    __m512i lo[4], hi[4], unreverse;
} lane_sums;

static void lane_sums_init(lane_sums *t) {
    int32_t a[16], b[16], u[16];
    for (int level = 0; level < 4; level++) {
        int s = 8 >> level;
        for (int l = 0; l < 16; l++) {
            int g = l / (2 * s), w = l % (2 * s);
            a[l] = w < s ? g * 2 * s + w : 16 + g * 2 * s + (w - s);
            b[l] = a[l] + s;
        }
        t->lo[level] = _mm512_loadu_si512(a);
        t->hi[level] = _mm512_loadu_si512(b);
    }
    for (int c = 0; c < 16; c++) u[c] = ((c & 1) << 3) | ((c & 2) << 1) | ((c & 4) >> 1) | ((c & 8) >> 3);
    t->unreverse = _mm512_loadu_si512(u);
}

static inline __m512 sums16(__m512 d[16], const lane_sums *t) {
#pragma GCC unroll 4
    for (int level = 0, n = 16; level < 4; level++, n /= 2)
#pragma GCC unroll 8
        for (int i = 0; i < n / 2; i++)
            d[i] = _mm512_add_ps(_mm512_permutex2var_ps(d[2 * i], t->lo[level], d[2 * i + 1]),
                                 _mm512_permutex2var_ps(d[2 * i], t->hi[level], d[2 * i + 1]));
    return _mm512_permutexvar_ps(t->unreverse, d[0]);
}

/* Scores of query head qh against columns j0 .. j0+15 (fewer at the end: `left`) of keys kb (column stride
 * ss): (q . k) * scale + mask, -inf where the mask is below -1e30 or past the end; written to sc[0..15]. */
static void scores16(const uint16_t *qh, const uint16_t *kb, long ss, long hd, long j0, long left,
                     const uint16_t *m, float scale, float *sc, const lane_sums *t) {
    __m512 d[16];
    __mmask16 in = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
#pragma GCC unroll 16
    for (int c = 0; c < 16; c++) {
        d[c] = _mm512_setzero_ps();
        if (c >= left) continue;
        const uint16_t *kj = kb + (j0 + c) * ss;
#pragma GCC unroll 2
        for (long i = 0; i < hd; i += 32)
            d[c] = _mm512_dpbf16_ps(d[c], (__m512bh)_mm512_loadu_si512(qh + i), (__m512bh)_mm512_loadu_si512(kj + i));
    }
    __m512 mv = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(in, m + j0)), 16));
    __mmask16 live = in & _mm512_cmp_ps_mask(mv, _mm512_set1_ps(-1e30f), _CMP_GE_OQ);
    __m512 s = _mm512_fmadd_ps(sums16(d, t), _mm512_set1_ps(scale), mv);
    _mm512_storeu_ps(sc, _mm512_mask_blend_ps(live, _mm512_set1_ps(-INFINITY), s));
}

/* acc[0 .. NV-1] += sum over columns j of p[j] * v_j (values vb, column stride ss), skipping p[j] == 0; returns
 * the sum of the p[j], added in column order (a sum over lanes would depend on where each column falls in
 * its 16-column block: a tree's node and the same token decoded alone would round it differently). NV is a
 * constant where it is inlined, so the accumulators stay in registers. */
static inline __attribute__((always_inline)) float weigh_values(const float *p, const uint16_t *vb, long ss,
                                                               long cols, const long NV, __m512 *acc) {
    float total = 0.0f;
    for (long j = 0; j < cols; j++) {
        if (p[j] == 0.0f) continue;
        total += p[j];
        __m512 w = _mm512_set1_ps(p[j]);
        const uint16_t *vj = vb + j * ss;
        for (long v = 0; v < NV; v++) acc[v] = _mm512_fmadd_ps(w, load16(vj + 16 * v), acc[v]);
    }
    return total;
}

/* One query row's head qh against `cols` columns: out[0 .. hd-1] = softmax(q . k * scale + mask) . v.
 * sc: scratch of cols + 16 floats. */
static void attend(const uint16_t *qh, const uint16_t *kb, const uint16_t *vb, long ss, long hd, long cols,
                   const uint16_t *m, float scale, uint16_t *out, float *sc, const lane_sums *t) {
    long width = (cols + 15) / 16 * 16, nv = hd / 16;
    __m512 ninf = _mm512_set1_ps(-INFINITY), top = ninf;
    for (long j0 = 0; j0 < cols; j0 += 16) {
        scores16(qh, kb, ss, hd, j0, cols - j0, m, scale, sc + j0, t);
        top = _mm512_max_ps(top, _mm512_loadu_ps(sc + j0));
    }
    __m512 shift = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    for (long j0 = 0; j0 < width; j0 += 16) { /* scores -> unnormalised probabilities, 0 where skipped */
        __m512 s = _mm512_loadu_ps(sc + j0);
        __mmask16 live = _mm512_cmp_ps_mask(s, ninf, _CMP_NEQ_OQ);
        _mm512_storeu_ps(sc + j0, _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(s, shift))));
    }
    __m512 acc[16];
    for (long v = 0; v < 16; v++) acc[v] = _mm512_setzero_ps();
    float sum = nv == 4 ? weigh_values(sc, vb, ss, cols, 4, acc)
              : nv == 8 ? weigh_values(sc, vb, ss, cols, 8, acc) : weigh_values(sc, vb, ss, cols, nv, acc);
    __m512 inv = _mm512_set1_ps(sum > 0.0f ? 1.0f / sum : 0.0f);
    for (long v = 0; v < nv; v++) store16(out + 16 * v, _mm512_mul_ps(acc[v], inv));
}

/* Attention of batch x t query rows (row bi * t + ti of q, stride ldq; head h at column h * hd) over
 * `cols` cached columns of keys / values kc / vc ([B, Hkv, S, hd]: strides sb, sh, ss elements, the last 1),
 * query head h reading KV head h / (hq / hkv). mask [B, t, cols] bfloat16 additive (strides mb, mt): a column
 * below -1e30 is skipped. Scores in float32 (BF16 dot products), softmax, the weighted sum of values in
 * float32, out [rows, hq * hd] (stride ldo) in bfloat16. scores: scratch of cols + 16 floats; hd <= 256. */
void medusa_attention(const uint16_t *q, long ldq, long batch, long t, long hq, long hkv, long hd,
                      const uint16_t *kc, const uint16_t *vc, long sb, long sh, long ss, long cols,
                      const uint16_t *mask, long mb, long mt, float scale, uint16_t *out, long ldo,
                      float *scores) {
    long group = hq / hkv;
    lane_sums sums;
    lane_sums_init(&sums);
    for (long bi = 0; bi < batch; bi++)
        for (long ti = 0; ti < t; ti++) {
            long row = bi * t + ti;
            for (long h = 0; h < hq; h++) {
                long off = bi * sb + (h / group) * sh;
                attend(q + row * ldq + h * hd, kc + off, vc + off, ss, hd, cols, mask + bi * mb + ti * mt,
                       scale, out + row * ldo + h * hd, scores, &sums);
            }
        }
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
