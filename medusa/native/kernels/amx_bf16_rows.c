/* y[M, N] = x[M, K] @ W[N, K]^T (+ bias[N]) for bfloat16 x, W, y with float32 accumulation, through Intel
 * AMX tiles (tdpbf16ps), one thread. Built once per machine by medusa/modeling/bf16_kernel.py.
 *
 * The weight is packed once (medusa_bf16_pack) into 16-column blocks of k-pairs: block j,
 * pair p holds (W[o][2p], W[o][2p+1]) for o = 16j .. 16j+15 -- 64 bytes, so 16 consecutive pairs of a block
 * are one 16 x 64-byte B tile, read straight from the packed weight as it streams from memory.
 *
 * Up to 16 rows go into one A tile against four C tiles (64 outputs); 17-32 rows into two A tiles against
 * two output blocks (the weight streams once for all rows). Each output y[m][o] is computed by the
 * same sequence of tile products over k whatever M is and whichever rows share the tile (AMX multiplies each
 * row of A on its own), so a row's result does not depend on its batch. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Ask the kernel for the AMX tile state (once per process); 0 when granted. */
int medusa_amx_init(void) {
    return (int)syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
}

/* Pack W [N, K] (bfloat16, row stride ldw) into out [Np/16][Kp/2][16][2]; Np, Kp padded with
 * zeros (Np a multiple of 16, Kp of 32). */
void medusa_bf16_pack(const uint16_t *w, long n, long k, long ldw, uint16_t *out, long np, long kp) {
    for (long j = 0; j < np / 16; j++)
        for (long p = 0; p < kp / 2; p++)
            for (long l = 0; l < 16; l++)
                for (long h = 0; h < 2; h++) {
                    long o = 16 * j + l, c = 2 * p + h;
                    out[((j * (kp / 2) + p) * 16 + l) * 2 + h] = (o < n && c < k) ? w[o * ldw + c] : 0;
                }
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Load a tile configuration: tile t has rows[t] rows of 64 bytes. */
static void configure(const int rows[8]) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = (uint8_t)rows[t];
    }
    _tile_loadconfig(&cfg);
}

static void store(int t, float *buf) {
    switch (t) {
    case 0: _tile_stored(0, buf, 64); break;
    case 1: _tile_stored(1, buf, 64); break;
    case 2: _tile_stored(2, buf, 64); break;
    default: _tile_stored(3, buf, 64); break;
    }
}

/* C tile t ([rows, 16] float32) + bias -> y[m0 .. m0+rows-1][o .. o+15] in bfloat16 (outputs past n dropped). */
static void write_tile(int t, int rows, long m0, long o, long n, const float *bias, uint16_t *y, long ldy) {
    float buf[16 * 16];
    if (o >= n || rows == 0) return;
    long left = n - o;
    __mmask16 mask = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
    __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + o) : _mm512_setzero_ps();
    store(t, buf);
    for (int m = 0; m < rows; m++) {
        __m256bh r = _mm512_cvtneps_pbh(_mm512_add_ps(_mm512_loadu_ps(buf + 16 * m), b));
        _mm256_mask_storeu_epi16((void *)(y + (m0 + m) * ldy + o), mask, (__m256i)r);
    }
}

/* Up to 16 rows (one A tile, tile 4) against four output blocks per pass (C0-C3; B in tiles 5-7): four
 * weight streams at once, what one-row decoding needs to reach the memory's speed. */
static void rows16(const uint16_t *xa, long ldx, int ra, const uint16_t *wp, long pairs, long blocks,
                   const float *bias, uint16_t *y, long m0, long n, long ldy) {
    const int rows[8] = {ra, ra, ra, ra, ra, 16, 16, 16};
    configure(rows);
    for (long j0 = 0; j0 < blocks; j0 += 4) {
        long ub = blocks - j0 < 4 ? blocks - j0 : 4;
        const uint16_t *w0 = wp + j0 * pairs * 32, *w1 = w0 + pairs * 32, *w2 = w1 + pairs * 32,
                       *w3 = w2 + pairs * 32;
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (long p0 = 0; p0 < pairs; p0 += 16) {
            long off = p0 * 32;
            _tile_loadd(4, xa + 2 * p0, ldx * 2);
            if (ub == 4) {
                _tile_loadd(5, w0 + off, 64); _tile_loadd(6, w1 + off, 64); _tile_loadd(7, w2 + off, 64);
                _tile_dpbf16ps(0, 4, 5); _tile_dpbf16ps(1, 4, 6); _tile_dpbf16ps(2, 4, 7);
                _tile_loadd(5, w3 + off, 64);
                _tile_dpbf16ps(3, 4, 5);
            } else {
                _tile_loadd(5, w0 + off, 64); _tile_dpbf16ps(0, 4, 5);
                if (ub > 1) { _tile_loadd(6, w1 + off, 64); _tile_dpbf16ps(1, 4, 6); }
                if (ub > 2) { _tile_loadd(7, w2 + off, 64); _tile_dpbf16ps(2, 4, 7); }
            }
        }
        for (int u = 0; u < ub; u++) write_tile(u, ra, m0, (j0 + u) * 16, n, bias, y, ldy);
    }
}

/* 17 to 32 rows at once (two A tiles against the same B tiles: the weight streams once for both), two
 * output blocks per pass. */
static void rows32(const uint16_t *xa, long ldx, int ra, int rb, const uint16_t *wp, long pairs, long blocks,
                   const float *bias, uint16_t *y, long m0, long n, long ldy) {
    /* C0, C1, A0 (tile 4): ra rows; C2, C3, A1 (tile 5): rb rows (at least one: unused when rb == 0); B: 6, 7 */
    const int rows[8] = {ra, ra, rb ? rb : 1, rb ? rb : 1, ra, rb ? rb : 1, 16, 16};
    configure(rows);
    for (long j0 = 0; j0 < blocks; j0 += 2) {
        int two = j0 + 1 < blocks;
        const uint16_t *w0 = wp + j0 * pairs * 32, *w1 = w0 + pairs * 32;
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (long p0 = 0; p0 < pairs; p0 += 16) {
            long off = p0 * 32;
            _tile_loadd(4, xa + 2 * p0, ldx * 2);
            _tile_loadd(6, w0 + off, 64);
            _tile_dpbf16ps(0, 4, 6);
            if (rb) { _tile_loadd(5, xa + 16 * ldx + 2 * p0, ldx * 2); _tile_dpbf16ps(2, 5, 6); }
            if (two) {
                _tile_loadd(7, w1 + off, 64);
                _tile_dpbf16ps(1, 4, 7);
                if (rb) _tile_dpbf16ps(3, 5, 7);
            }
        }
        write_tile(0, ra, m0, j0 * 16, n, bias, y, ldy);
        write_tile(2, rb, m0 + 16, j0 * 16, n, bias, y, ldy);
        if (two) {
            write_tile(1, ra, m0, (j0 + 1) * 16, n, bias, y, ldy);
            write_tile(3, rb, m0 + 16, (j0 + 1) * 16, n, bias, y, ldy);
        }
    }
}

/* Whole groups of 32 rows against the weight in panels: each pass of two output blocks (their B tiles a few
 * tens of KB, kept in the core's caches) runs over every group before the next pass, so the weight streams
 * from memory once for all of them (a prompt's prefill: compute-bound instead of one weight stream per 32
 * rows). Each output is the same chain of tile products over k as in rows32: the same bits. */
static void rows_panel(const uint16_t *x, long ldx, long groups, const uint16_t *wp, long pairs, long blocks,
                       const float *bias, uint16_t *y, long n, long ldy) {
    const int rows[8] = {16, 16, 16, 16, 16, 16, 16, 16};
    configure(rows);
    for (long j0 = 0; j0 < blocks; j0 += 2) {
        int two = j0 + 1 < blocks;
        const uint16_t *w0 = wp + j0 * pairs * 32, *w1 = w0 + pairs * 32;
        for (long g = 0; g < groups; g++) {
            const uint16_t *xa = x + g * 32 * ldx;
            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
            for (long p0 = 0; p0 < pairs; p0 += 16) {
                long off = p0 * 32;
                _tile_loadd(4, xa + 2 * p0, ldx * 2);
                _tile_loadd(5, xa + 16 * ldx + 2 * p0, ldx * 2);
                _tile_loadd(6, w0 + off, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(2, 5, 6);
                if (two) {
                    _tile_loadd(7, w1 + off, 64);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_dpbf16ps(3, 5, 7);
                }
            }
            write_tile(0, 16, g * 32, j0 * 16, n, bias, y, ldy);
            write_tile(2, 16, g * 32 + 16, j0 * 16, n, bias, y, ldy);
            if (two) {
                write_tile(1, 16, g * 32, (j0 + 1) * 16, n, bias, y, ldy);
                write_tile(3, 16, g * 32 + 16, (j0 + 1) * 16, n, bias, y, ldy);
            }
        }
    }
}

/* x [M, K] (row stride ldx elements; K = kp, a multiple of 32), packed weight [np/16][kp/2][16][2], bias NULL
 * or float32 [N], y [M, N] (row stride ldy elements), any M. Up to 63 rows go 32 at a time (the weight
 * streams once per 32: the decoder's steps); from 64 rows the whole groups of 32 go through rows_panel (one
 * stream for all), the rest as before. A row's outputs are the same bits either way. */
void medusa_bf16_rows_amx(const uint16_t *x, long M, long ldx, const uint16_t *wp, long np, long kp,
                          const float *bias, uint16_t *y, long n, long ldy) {
    long pairs = kp / 2, blocks = np / 16, start = 0;
    if (M >= 64) {
        long groups = M / 32;
        rows_panel(x, ldx, groups, wp, pairs, blocks, bias, y, n, ldy);
        start = groups * 32;
    }
    for (long m0 = start; m0 < M; m0 += 32) {
        long left = M - m0;
        int ra = (int)(left < 16 ? left : 16), rb = (int)(left > 32 ? 16 : (left > 16 ? left - 16 : 0));
        if (rb == 0)
            rows16(x + m0 * ldx, ldx, ra, wp, pairs, blocks, bias, y, m0, n, ldy);
        else
            rows32(x + m0 * ldx, ldx, ra, rb, wp, pairs, blocks, bias, y, m0, n, ldy);
    }
    _tile_release();
}
