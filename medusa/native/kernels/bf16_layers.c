/* A whole decoder body's pass in one call: the layers of medusa/modeling/native_body.py driven from C.
 *
 * Each layer runs the very ops native_body.py calls one by one from Python (the AMX product, the rotary
 * embedding, the cache append, attention, RMSNorm with its residual add, SiLU * up), in the same order on
 * the same buffers, so the results are bit for bit those of the layer-by-layer path; what goes is the
 * ~10 Python and ctypes calls a layer costs between the products (~6 ms of a SmolLM2-135M step).
 *
 * A layer's weights come as a row of PLAN_FIELDS int64s (a packed matrix: data, np, k, bias, n for q/k/v,
 * o, gate/up and down; then the input and post-attention norm weights), built once in Python. */
#include <stdint.h>
#include <string.h>

#include "medusa_ops.h"

enum { PLAN_FIELDS = 22 };

typedef struct { const uint16_t *w; long np, k; const float *bias; long n; } packed;

static packed matrix(const int64_t *p) {
    packed m = { (const uint16_t *)(intptr_t)p[0], (long)p[1], (long)p[2], (const float *)(intptr_t)p[3],
                 (long)p[4] };
    return m;
}

static void product(const uint16_t *x, long rows, packed m, uint16_t *y) {
    medusa_bf16_rows(x, rows, m.k, m.w, m.np, m.k, m.bias, y, m.n, m.n);
}

/* The body over rows = batch * t tokens. In: h [rows, d] the embeddings, x [rows, d] their RMSNorm by the
 * first layer's input norm; out: x = the last hidden state (after final_norm), h the residual stream.
 * cos / sin [rows, hd] (rows ldc apart); mask [B, 1, t, >= cols] additive bfloat16 (mb, mt strides); kv
 * [2 * layers]: each layer's key and value buffers [B, hkv, capacity, hd] (strides sb, sh, ss) taking the
 * new entries at column start, attention over the first cols columns. work: bfloat16 scratch of
 * rows * (qkv width + hq hd + d + 3 * inter + d); scratch: attention's float32 scratch. states (or NULL):
 * [layers + 1, rows, d], states[i + 1] = h after layer i (the last: x), states[0] left to the caller. */
void medusa_body_forward(const int64_t *plan, long layers, long batch, long t, long d, long hq, long hkv,
                         long hd, long inter, float eps, uint16_t *h, uint16_t *x, const uint16_t *cos,
                         const uint16_t *sin, long ldc, const uint16_t *mask, long mb, long mt, long cols,
                         const int64_t *kv, long sb, long sh, long ss, long start, float scale,
                         uint16_t *work, float *scratch, uint16_t *states, const uint16_t *final_norm) {
    long rows = batch * t, qd = hq * hd, width = (hq + 2 * hkv) * hd;
    uint16_t *qkv = work, *attn = qkv + rows * width, *o = attn + rows * qd, *gu = o + rows * d,
             *act = gu + rows * 2 * inter, *down = act + rows * inter;
    for (long i = 0; i < layers; i++) {
        const int64_t *p = plan + i * PLAN_FIELDS;
        const uint16_t *post = (const uint16_t *)(intptr_t)p[21];
        const uint16_t *next = i + 1 < layers ? (const uint16_t *)(intptr_t)p[PLAN_FIELDS + 20] : final_norm;
        uint16_t *kb = (uint16_t *)(intptr_t)kv[2 * i], *vb = (uint16_t *)(intptr_t)kv[2 * i + 1];
        product(x, rows, matrix(p), qkv);
        medusa_rope(qkv, rows, width, hq + hkv, hd, cos, sin, ldc);
        medusa_kv_append(qkv, width, batch, t, hkv, hd, qd, kb, vb, sb, sh, ss, start);
        medusa_attention(qkv, width, batch, t, hq, hkv, hd, kb, vb, sb, sh, ss, cols, mask, mb, mt, scale,
                         attn, qd, scratch);
        product(attn, rows, matrix(p + 5), o);
        medusa_add_rms_norm(h, o, rows, d, post, eps, h, x);
        product(x, rows, matrix(p + 10), gu);
        medusa_silu_mul(gu, rows, inter, 2 * inter, act, inter);
        product(act, rows, matrix(p + 15), down);
        medusa_add_rms_norm(h, down, rows, d, next, eps, h, x);
        if (states) memcpy(states + (i + 1) * rows * d, i + 1 < layers ? h : x, rows * d * 2);
    }
}

enum { DRAFT_PLAN_FIELDS = 23 };

/* The EAGLE-3 draft layer's pass (medusa/modeling/native_draft.py's ops in its order) over rows = batch *
 * t entries: x = [RMSNorm(embeds) | RMSNorm(hidden)] [rows, 2d] -> q/k/v -> rotary -> the drafter's cache
 * (buffers kb / vb, strides sb, sh, ss, new entries at column start) -> attention over cols columns under
 * mask -> o -> h = hidden + o and its post-attention RMSNorm -> the MLP on every row, or with at (int64
 * [batch], else NULL) on each batch row's entry at[b] alone -> out = h + MLP, [rows, d] or [batch, d].
 * plan: the q/k/v, o, gate/up and down matrices (data, np, k, bias, n), then the input, hidden and
 * post-attention norm weights. work: bfloat16 scratch of rows * (2d + qkv width + hq hd + 5d + 3 inter). */
void medusa_draft_layer(const int64_t *plan, long batch, long t, long d, long hq, long hkv, long hd,
                        long inter, float eps, const uint16_t *embeds, const uint16_t *hidden,
                        const uint16_t *cos, const uint16_t *sin, long ldc, const uint16_t *mask, long mb,
                        long mt, long cols, uint16_t *kb, uint16_t *vb, long sb, long sh, long ss,
                        long start, float scale, const int64_t *at, uint16_t *work, float *scratch,
                        uint16_t *out) {
    long rows = batch * t, qd = hq * hd, width = (hq + 2 * hkv) * hd;
    const uint16_t *input_norm = (const uint16_t *)(intptr_t)plan[20];
    const uint16_t *hidden_norm = (const uint16_t *)(intptr_t)plan[21];
    const uint16_t *post = (const uint16_t *)(intptr_t)plan[22];
    uint16_t *x = work, *qkv = x + rows * 2 * d, *attn = qkv + rows * width, *o = attn + rows * qd,
             *h = o + rows * d, *normed = h + rows * d, *gu = normed + rows * d, *act = gu + rows * 2 * inter,
             *down = act + rows * inter;
    for (long r = 0; r < rows; r++) {
        medusa_rms_norm(embeds + r * d, 1, d, input_norm, eps, x + r * 2 * d);
        medusa_rms_norm(hidden + r * d, 1, d, hidden_norm, eps, x + r * 2 * d + d);
    }
    product(x, rows, matrix(plan), qkv);
    medusa_rope(qkv, rows, width, hq + hkv, hd, cos, sin, ldc);
    medusa_kv_append(qkv, width, batch, t, hkv, hd, qd, kb, vb, sb, sh, ss, start);
    medusa_attention(qkv, width, batch, t, hq, hkv, hd, kb, vb, sb, sh, ss, cols, mask, mb, mt, scale, attn,
                     qd, scratch);
    product(attn, rows, matrix(plan + 5), o);
    medusa_add_rms_norm(hidden, o, rows, d, post, eps, h, normed);
    long m = rows;
    if (at) { /* the MLP at each batch row's entry at[b] alone: those rows moved to the front */
        for (long b = 0; b < batch; b++) {
            memmove(h + b * d, h + (b * t + at[b]) * d, d * 2);
            memmove(normed + b * d, normed + (b * t + at[b]) * d, d * 2);
        }
        m = batch;
    }
    product(normed, m, matrix(plan + 10), gu);
    medusa_silu_mul(gu, m, inter, 2 * inter, act, inter);
    product(act, m, matrix(plan + 15), down);
    medusa_add(h, down, m * d, out);
}
