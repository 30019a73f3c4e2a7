/* An EAGLE-3 drafter's pass in one call: medusa_draft_layer with what the Python side did around it.
 *
 * Around the layer, medusa/decoding/draft_growth.py and medusa/modeling/eagle3.py made ~15 tensor ops and
 * ctypes calls per drafting level (the embedding lookup, the rotary rows, the final RMSNorm, the LM head, the
 * top-k log-softmax), ~0.1 ms each once a step's weights have pushed the code and data out of the caches.
 * Here they are the same ops on the same values in the same order: the embedding rows and rotary rows are
 * copied (exact), the products go through medusa_bf16_rows, the norms through medusa_rms_norm and the
 * picks through medusa_top_log_softmax, so the results are bit for bit the stepwise path's. */
#include <stdint.h>
#include <string.h>

#include "medusa_ops.h"

static void product(const uint16_t *x, long rows, const int64_t *p, uint16_t *y) {
    medusa_bf16_rows(x, rows, (long)p[2], (const uint16_t *)(intptr_t)p[0], (long)p[1], (long)p[2],
                         (const float *)(intptr_t)p[3], y, (long)p[4], (long)p[4]);
}

/* The drafter's children of g [rows, d]: final RMSNorm (final_norm) -> the LM head (head: data, np, k, bias,
 * n) -> each row's k largest log-softmax values [rows, k] and their draft ids [rows, k]. work: bfloat16
 * scratch of rows * (d + n). */
void medusa_draft_top(const uint16_t *g, long rows, long d, const uint16_t *final_norm, float eps,
                      const int64_t *head, long k, float *values, int64_t *indices, uint16_t *work) {
    long n = (long)head[4];
    uint16_t *normed = work, *logits = work + rows * d;
    medusa_rms_norm(g, rows, d, final_norm, eps, normed);
    product(normed, rows, head, logits);
    medusa_top_log_softmax(logits, rows, n, n, k, values, indices);
}

/* One draft-layer pass over rows = batch * t entries: the embeddings of tokens [rows] (target ids; table [V,
 * d]), the rotary rows of positions [rows] (rope [P, 2 hd]: cos then sin), the hidden input in [rows, d] or,
 * with fc (a matrix row: data, np, k, bias, n), fc's product of the features in [rows, F]; then
 * medusa_draft_layer (plan, mask, cache and at as it takes them) -> out, [rows, d] or [batch, d] with at;
 * with k > 0 medusa_draft_top of out into values / indices. work: bfloat16 scratch of rows * (2d + 2hd) +
 * the layer's rows * (7d + qkv width + hq hd + 3 inter) + (at ? batch : rows) * (d + head n). */
void medusa_draft_step(const int64_t *plan, const int64_t *fc, const int64_t *head, const uint16_t *final_norm,
                       long batch, long t, long d, long hq, long hkv, long hd, long inter, float eps,
                       const uint16_t *table, const int64_t *tokens, const uint16_t *rope,
                       const int64_t *positions, const uint16_t *in, const uint16_t *mask, long mb, long mt,
                       long cols, uint16_t *kb, uint16_t *vb, long sb, long sh, long ss, long start,
                       float scale, const int64_t *at, uint16_t *work, float *scratch, uint16_t *out, long k,
                       float *values, int64_t *indices) {
    long rows = batch * t, width = (hq + 2 * hkv) * hd;
    uint16_t *embeds = work, *cs = embeds + rows * d, *hidden = cs + rows * 2 * hd, *layer = hidden + rows * d;
    uint16_t *top = layer + rows * (7 * d + width + hq * hd + 3 * inter);
    for (long r = 0; r < rows; r++) {
        memcpy(embeds + r * d, table + tokens[r] * d, d * 2);
        memcpy(cs + r * 2 * hd, rope + positions[r] * 2 * hd, hd * 4);
    }
    if (fc) product(in, rows, fc, hidden);
    else memcpy(hidden, in, rows * d * 2);
    medusa_draft_layer(plan, batch, t, d, hq, hkv, hd, inter, eps, embeds, hidden, cs, cs + hd, 2 * hd, mask, mb,
                       mt, cols, kb, vb, sb, sh, ss, start, scale, at, layer, scratch, out);
    if (k > 0) medusa_draft_top(out, at ? batch : rows, d, final_norm, eps, head, k, values, indices, top);
}
