/* The native library's entry points that other sources of it call (bf16_layers.c and bf16_draft_step.c
 * drive the others). */
#ifndef MEDUSA_OPS_H
#define MEDUSA_OPS_H

#include <stdint.h>

int medusa_amx_init(void);
void medusa_bf16_rows_amx(const uint16_t *x, long M, long ldx, const uint16_t *wp, long np, long kp,
                          const float *bias, uint16_t *y, long n, long ldy);
void medusa_bf16_rows_avx512(const uint16_t *x, long M, long ldx, const uint16_t *wp, long np, long kp,
                             const float *bias, uint16_t *y, long n, long ldy);
/* the chosen one of the two (bf16_rows.c); medusa_amx_on: whether it is AMX */
extern int medusa_amx_on;
void medusa_bf16_rows(const uint16_t *x, long M, long ldx, const uint16_t *wp, long np, long kp,
                      const float *bias, uint16_t *y, long n, long ldy);
void medusa_rms_norm(const uint16_t *x, long rows, long d, const uint16_t *w, float eps, uint16_t *out);
void medusa_add_rms_norm(const uint16_t *h, const uint16_t *delta, long rows, long d, const uint16_t *w,
                         float eps, uint16_t *h_out, uint16_t *out);
void medusa_rope(uint16_t *x, long rows, long ldx, long heads, long hd, const uint16_t *cos,
                 const uint16_t *sin, long ldc);
void medusa_attention(const uint16_t *q, long ldq, long batch, long t, long hq, long hkv, long hd,
                      const uint16_t *kc, const uint16_t *vc, long sb, long sh, long ss, long cols,
                      const uint16_t *mask, long mb, long mt, float scale, uint16_t *out, long ldo,
                      float *scratch);
void medusa_silu_mul(const uint16_t *gu, long rows, long inter, long ldg, uint16_t *out, long ldo);
void medusa_kv_append(const uint16_t *qkv, long ldq, long batch, long t, long hkv, long hd, long qd,
                      uint16_t *kb, uint16_t *vb, long sb, long sh, long ss, long start);
void medusa_add(const uint16_t *a, const uint16_t *b, long n, uint16_t *out);
void medusa_top_log_softmax(const uint16_t *x, long rows, long n, long ld, long k, float *values,
                            int64_t *idx);
void medusa_draft_layer(const int64_t *plan, long batch, long t, long d, long hq, long hkv, long hd,
                        long inter, float eps, const uint16_t *embeds, const uint16_t *hidden,
                        const uint16_t *cos, const uint16_t *sin, long ldc, const uint16_t *mask, long mb,
                        long mt, long cols, uint16_t *kb, uint16_t *vb, long sb, long sh, long ss,
                        long start, float scale, const int64_t *at, uint16_t *work, float *scratch,
                        uint16_t *out);

#endif
