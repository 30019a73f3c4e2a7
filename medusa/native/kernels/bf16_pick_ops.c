/* Picks made from bfloat16 logits, one thread, AVX-512: each row's first maximum (greedy acceptance over a
 * verified tree's rows) and each row's top-k log-softmax values (a drafter's children). Built into the same
 * library as amx_bf16_rows.c by medusa/native/library.py and called from medusa/native/pick.py.
 *
 * PyTorch's CPU argmax / max with indices over bfloat16 runs at ~1.5 G values/s (a 14 x 49,152 block:
 * 0.6 ms of a ~50 ms decode step); these read the values at the memory's speed. Values are compared as the
 * float32 they convert to exactly; NaN counts as larger than every number (torch's rule), the first NaN
 * of a row winning. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "bf16_simd.h"

static inline float value(const uint16_t *p, long i) { /* one bfloat16 -> float32 */
    union { uint32_t u; float f; } v = { (uint32_t)p[i] << 16 };
    return v.f;
}

/* The index of the first maximum of p[0 .. n-1] (the first NaN if any). */
static long first_max_row(const uint16_t *p, long n) {
    long best = 0, start = 0;
    float top = value(p, 0);
    if (isnan(top)) return 0;
    long full = n & ~15L;
    if (full >= 16) {
        const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        __m512 m = load16(p);
        __mmask16 nan = _mm512_cmp_ps_mask(m, m, _CMP_UNORD_Q);
        if (nan) return __builtin_ctz(nan);
        __m512i at = lanes; /* lane l: index of its first maximum so far */
        for (long i = 16; i < full; i += 16) {
            __m512 v = load16(p + i);
            nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            if (nan) return i + __builtin_ctz(nan);
            __mmask16 up = _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ); /* strictly larger: a lane keeps its first */
            m = _mm512_mask_blend_ps(up, m, v);
            at = _mm512_mask_blend_epi32(up, at, _mm512_add_epi32(lanes, _mm512_set1_epi32((int)i)));
        }
        top = _mm512_reduce_max_ps(m);
        __mmask16 tied = _mm512_cmp_ps_mask(m, _mm512_set1_ps(top), _CMP_EQ_OQ);
        best = _mm512_mask_reduce_min_epi32(tied, at); /* the first of the lanes' first maxima */
        start = full;
    }
    for (long i = start; i < n; i++) {
        float v = value(p, i);
        if (isnan(v)) return i;
        if (v > top) { top = v; best = i; }
    }
    return best;
}

/* out[r] = the index of row r's first maximum, rows of x [rows, n] ld apart. */
void medusa_first_max(const uint16_t *x, long rows, long n, long ld, int64_t *out) {
    for (long r = 0; r < rows; r++) out[r] = n > 0 ? first_max_row(x + r * ld, n) : 0;
}

/* Row top-k kept in descending order (ties: the earlier index stays first). */
typedef struct { float v[64]; long at[64]; long held, k; } top_k;

static inline void offer(top_k *t, float v, long i) {
    if (t->held == t->k && !(v > t->v[t->k - 1])) return;
    long j = t->held < t->k ? t->held++ : t->k - 1;
    while (j > 0 && v > t->v[j - 1]) { t->v[j] = t->v[j - 1]; t->at[j] = t->at[j - 1]; j--; }
    t->v[j] = v;
    t->at[j] = i;
}

/* The k best of p[0 .. n-1] into t; returns whether p holds a NaN (never offered). */
static int top_row(const uint16_t *p, long n, top_k *t) {
    int has_nan = 0;
    long i = 0;
    for (; i < n && t->held < t->k; i++) {
        float v = value(p, i);
        if (isnan(v)) has_nan = 1; else offer(t, v, i);
    }
    for (; i + 16 <= n; i += 16) { /* only lanes above the k-th best go one by one */
        __m512 v = load16(p + i);
        has_nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0;
        __mmask16 up = _mm512_cmp_ps_mask(v, _mm512_set1_ps(t->v[t->k - 1]), _CMP_GT_OQ);
        while (up) {
            long l = __builtin_ctz(up);
            offer(t, value(p, i + l), i + l);
            up &= up - 1;
        }
    }
    for (; i < n; i++) {
        float v = value(p, i);
        if (isnan(v)) has_nan = 1; else offer(t, v, i);
    }
    return has_nan;
}

/* log(sum exp(p[i] - mx)) + mx over p[0 .. n-1]. */
static float log_sum_exp(const uint16_t *p, long n, float mx) {
    __m512 acc = _mm512_setzero_ps(), shift = _mm512_set1_ps(mx);
    long i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_add_ps(acc, exp16(_mm512_sub_ps(load16(p + i), shift)));
    float sum = _mm512_reduce_add_ps(acc);
    for (; i < n; i++) sum += expf(value(p, i) - mx);
    return mx + logf(sum);
}

/* For each row of x [rows, n] (ld apart): its k largest values (ties to the lower index), in descending
 * order, as log-softmax values x - max - log(sum exp(x - max)) into values [rows, k] (float32) and their
 * indices into idx [rows, k]. 1 <= k <= min(n, 64) (the caller checks). A row holding NaN gets NaN
 * values. */
void medusa_top_log_softmax(const uint16_t *x, long rows, long n, long ld, long k, float *values,
                            int64_t *idx) {
    for (long r = 0; r < rows; r++) {
        const uint16_t *p = x + r * ld;
        top_k t;
        t.held = 0;
        t.k = k;
        int has_nan = top_row(p, n, &t);
        float lse = t.held ? log_sum_exp(p, n, t.v[0]) : NAN;
        for (long j = 0; j < k; j++) {
            int real = j < t.held;
            values[r * k + j] = (has_nan || !real) ? NAN : t.v[j] - lse;
            idx[r * k + j] = real ? t.at[j] : 0;
        }
    }
}
