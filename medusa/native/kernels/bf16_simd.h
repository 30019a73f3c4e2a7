/* Helpers shared by the native library's AVX-512 sources (bf16_decoder_ops.c, bf16_pick_ops.c,
 * avx512_bf16_rows.c): bfloat16 loads and e^x in float32. Static inline: each source gets its own copy. */
#ifndef MEDUSA_BF16_SIMD_H
#define MEDUSA_BF16_SIMD_H

#include <immintrin.h>
#include <stdint.h>

/* A pair of bfloat16 read as one 32-bit lane (vdpbf16ps broadcasts): may_alias, so reading uint16_t data
 * through it is defined under strict aliasing. */
typedef int32_t __attribute__((may_alias)) bf16_pair;

static inline __m512 load16(const uint16_t *p) { /* 16 bfloat16 -> float32 */
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
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

#endif
