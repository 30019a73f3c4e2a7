/* The one matmul entry point of the native library: every product of bf16_layers.c, bf16_draft_step.c and the
 * Python callers goes through medusa_bf16_rows, which runs the implementation chosen once per process by
 * medusa_kernel_init -- AMX tiles (amx_bf16_rows.c) where the CPU has them and the OS grants their state,
 * else AVX-512 BF16 (avx512_bf16_rows.c). Both read the same packed weight (medusa_bf16_pack); on one
 * machine a row's result never depends on its batch, whichever runs. */
#include <stdint.h>

#include "medusa_ops.h"

typedef void (*rows_fn)(const uint16_t *, long, long, const uint16_t *, long, long, const float *, uint16_t *,
                        long, long);

static rows_fn chosen = medusa_bf16_rows_avx512;
int medusa_amx_on = 0; /* read by medusa_attention: its scores through AMX tiles or AVX-512 BF16 */

/* amx != 0: the AMX kernel (asks the OS for the tile state; -1 when refused, the choice left unchanged);
 * 0: AVX-512 BF16. Returns 0 when the choice is made. */
int medusa_kernel_init(int amx) {
    if (!amx) {
        chosen = medusa_bf16_rows_avx512;
        medusa_amx_on = 0;
        return 0;
    }
    if (medusa_amx_init() != 0) return -1;
    chosen = medusa_bf16_rows_amx;
    medusa_amx_on = 1;
    return 0;
}

void medusa_bf16_rows(const uint16_t *x, long M, long ldx, const uint16_t *wp, long np, long kp,
                      const float *bias, uint16_t *y, long n, long ldy) {
    chosen(x, M, ldx, wp, np, kp, bias, y, n, ldy);
}
