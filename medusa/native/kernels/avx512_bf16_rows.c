/* y[M, N] = x[M, K] @ W[N, K]^T (+ bias[N]) for bfloat16 x, W, y with float32 accumulation, through AVX-512
 * BF16 (vdpbf16ps), one thread: the same packed weight and the same call as amx_bf16_rows.c, for CPUs with
 * AVX-512 BF16 and no AMX (AMD Zen 4 / Zen 5, Intel Cooper Lake).
 *
 * Packed layout (medusa_bf16_pack): block j, pair p holds (W[o][2p], W[o][2p+1]) for o = 16j .. 16j+15, 64
 * bytes: one zmm register. One vdpbf16ps adds x[m][2p] W[o][2p] + x[m][2p+1] W[o][2p+1] to 16 outputs'
 * accumulators, x's pair broadcast to every lane.
 *
 * Up to 16 rows are one register tile (rows x blocks accumulators: 1-2 rows x 8 blocks, ..., 9-14 x 2,
 * 15-16 x 1): each weight line is loaded once for all of them. More rows go in groups against panels of PANEL
 * blocks (192 outputs, kept in the core's L2): each panel runs over every group before the next, so the
 * weight streams from memory once for all rows. Each output y[m][o] is the same chain of vdpbf16ps over
 * p = 0 .. K/2 - 1 whatever M is and whichever rows share a tile, so a row's result does not depend on its
 * batch. */
#include <immintrin.h>
#include <stdint.h>

#include "bf16_simd.h"

#define PANEL 12  /* output blocks of 16 per panel: 192 outputs, at most ~600 KB of weight (kept in L2) */
#define ROWS 16   /* rows per register tile at most; more rows go in groups of at most GROUP_ROWS */
#define GROUP_ROWS 14
#define MAXB 8    /* blocks per register tile at most */
#define AHEAD 64  /* pairs (64-byte lines) prefetched ahead in a tile's own weight streams */

/* Accumulator (16 outputs of row m, float32) + bias -> y[m][o .. o+15] in bfloat16 (outputs past n
 * dropped). */
static inline void write_block(__m512 acc, long m, long o, long n, const float *bias, uint16_t *y, long ldy) {
    if (o >= n) return;
    long left = n - o;
    __mmask16 mask = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
    if (bias) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(mask, bias + o));
    __m256bh r = _mm512_cvtneps_pbh(acc);
    _mm256_mask_storeu_epi16((void *)(y + m * ldy + o), mask, (__m256i)r);
}

/* R rows (m0 ..) against B blocks (j0 ..): R x B accumulators over every pair. R and B are constants where it
 * is inlined, so the accumulators stay in registers. Prefetches (measured on an AMD EPYC, Zen 5): one row
 * none (the hardware prefetcher streams eight blocks at the memory's speed); from two rows AHEAD lines ahead
 * in each of the tile's own streams; from nine rows also the same blocks of the next panel into L2 (pf; NULL:
 * none), so the memory streams while the core multiplies. */
static inline __attribute__((always_inline)) void tile(const uint16_t *x, long ldx, long m0, int R,
                                                       const uint16_t *wp, long pairs, long j0, int B,
                                                       const uint16_t *pf, const float *bias, uint16_t *y,
                                                       long n, long ldy) {
    __m512 acc[ROWS][MAXB];
    const bf16_pair *xr[ROWS];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) {
        xr[r] = (const bf16_pair *)(x + (m0 + r) * ldx);
#pragma GCC unroll 16
        for (int b = 0; b < B; b++) acc[r][b] = _mm512_setzero_ps();
    }
    const uint16_t *w = wp + j0 * pairs * 32;
    for (long p = 0; p < pairs; p++) {
        __m512bh wv[MAXB];
#pragma GCC unroll 16
        for (int b = 0; b < B; b++) {
            wv[b] = (__m512bh)_mm512_loadu_si512((const void *)(w + (b * pairs + p) * 32));
            if (R >= 2) _mm_prefetch((const char *)(w + (b * pairs + p + AHEAD) * 32), _MM_HINT_T0);
            if (R >= 9 && pf) _mm_prefetch((const char *)(pf + (b * pairs + p) * 32), _MM_HINT_T1);
        }
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            __m512bh xv = (__m512bh)_mm512_set1_epi32(xr[r][p]);
#pragma GCC unroll 16
            for (int b = 0; b < B; b++) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], xv, wv[b]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int b = 0; b < B; b++) write_block(acc[r][b], m0 + r, (j0 + b) * 16, n, bias, y, ldy);
}

/* Blocks per tile for R rows: R x B accumulators + B weights + one broadcast within 32 registers. */
static int blocks_for(int R) {
    return R <= 2 ? 8 : (R <= 4 ? 6 : (R <= 6 ? 4 : (R <= 8 ? 3 : (R <= 14 ? 2 : 1))));
}

/* R (1 .. ROWS) rows against B <= blocks_for(R) blocks (fewer at a panel's end): a tile of constant shape. */
static void group(const uint16_t *x, long ldx, long m0, int R, const uint16_t *wp, long pairs, long j0, int B,
                  const uint16_t *pf, const float *bias, uint16_t *y, long n, long ldy) {
#define T(r, b) tile(x, ldx, m0, r, wp, pairs, j0, b, pf, bias, y, n, ldy)
#define B1(r) T(r, 1)
#define B2(r) switch (B) { case 1: T(r, 1); break; default: T(r, 2); break; }
#define B3(r) switch (B) { case 1: T(r, 1); break; case 2: T(r, 2); break; default: T(r, 3); break; }
#define B4(r) switch (B) { case 1: T(r, 1); break; case 2: T(r, 2); break; case 3: T(r, 3); break; \
                           default: T(r, 4); break; }
#define B6(r) switch (B) { case 1: T(r, 1); break; case 2: T(r, 2); break; case 3: T(r, 3); break; \
                           case 4: T(r, 4); break; case 5: T(r, 5); break; default: T(r, 6); break; }
#define B8(r) switch (B) { case 1: T(r, 1); break; case 2: T(r, 2); break; case 3: T(r, 3); break; \
                           case 4: T(r, 4); break; case 5: T(r, 5); break; case 6: T(r, 6); break; \
                           case 7: T(r, 7); break; default: T(r, 8); break; }
    switch (R) {
    case 1: B8(1); break;
    case 2: B8(2); break;
    case 3: B6(3); break;
    case 4: B6(4); break;
    case 5: B4(5); break;
    case 6: B4(6); break;
    case 7: B3(7); break;
    case 8: B3(8); break;
    case 9: B2(9); break;
    case 10: B2(10); break;
    case 11: B2(11); break;
    case 12: B2(12); break;
    case 13: B2(13); break;
    case 14: B2(14); break;
    case 15: B1(15); break;
    default: B1(16); break;
    }
#undef B1
#undef B2
#undef B3
#undef B4
#undef B6
#undef B8
#undef T
}

/* x [M, K] (row stride ldx elements; K = kp, a multiple of 32), packed weight [np/16][kp/2][16][2], bias NULL
 * or float32 [N], y [M, N] (row stride ldy elements), any M. Up to 16 rows are one group; more go in
 * ceil(M / 14) groups of nearly equal size. Each panel runs over every group before the next panel. */
void medusa_bf16_rows_avx512(const uint16_t *x, long M, long ldx, const uint16_t *wp, long np, long kp,
                             const float *bias, uint16_t *y, long n, long ldy) {
    if (M <= 0) return; /* no rows: nothing to read or write (group() has no 0-row tile) */
    long pairs = kp / 2, blocks = np / 16, groups = M <= ROWS ? 1 : (M + GROUP_ROWS - 1) / GROUP_ROWS;
    for (long j0 = 0; j0 < blocks; j0 += PANEL) {
        long end = j0 + PANEL < blocks ? j0 + PANEL : blocks;
        for (long g = 0, m0 = 0; g < groups; g++) {
            int R = (int)((M - m0) / (groups - g)); /* the rows left, shared evenly by the groups left */
            int step = blocks_for(R);
            for (long b0 = j0; b0 < end; b0 += step) {
                int B = (int)(end - b0 < step ? end - b0 : step);
                long ahead = b0 + PANEL; /* the same blocks of the next panel, while the first group runs */
                const uint16_t *pf = g == 0 && ahead + B <= blocks ? wp + ahead * pairs * 32 : 0;
                group(x, ldx, m0, R, wp, pairs, b0, B, pf, bias, y, n, ldy);
            }
            m0 += R;
        }
    }
}
