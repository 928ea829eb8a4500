/* parity's fp32 GEMM over weights held in column panels: y [M, N] = x [M, K] W^T (+ b), the
 * bits of oneDNN's fp32 matmul where the caller has found its K block (parity.model.panels).
 * Built by parity.model.native.
 *
 * The weight W [N, K] is held as panels of PANEL output columns, k-major: panel p holds
 * W[p*PANEL + j, k] at [p][k][j] (the last panel zero-padded), so each thread streams one
 * contiguous run of memory, a software prefetch PREFETCH k-steps ahead into L2: oneDNN's
 * kernel reads its blocked weight at 19-21 GB/s on 8 rows here, these panels at 24-26
 * (Sapphire Rapids, 2 threads, the 0.5B model's shapes).
 *
 * Why each output has the same bits in every call: y[m, n] is a function of row m of x, column
 * n of W, kb and b[n] alone. Within each block of kb values of k from 0, one FMA per k in k's
 * order from 0 (starting at +0); the blocks' sums added in order; then the bias. Which rows
 * or threads share the call never enters (threads split the panels; rows go through in tiles
 * of ROWS, each row its own accumulators). That is the order oneDNN's fp32 brgemm kernel
 * keeps (each row's FMAs over K blocks, one accumulator per block), so with oneDNN's K block
 * it gives oneDNN's bits: measured, and compared shape by shape before use. */
#include <omp.h>
#include <stdint.h>

#include "vec16.h"

#define PANEL 32    /* output columns per panel: two vectors */
#define ROWS 8      /* rows per tile: 16 accumulators, the weights' two vectors, a broadcast */
#define PREFETCH 48 /* k-steps (128 bytes each) ahead */

typedef uint16_t h16 __attribute__((vector_size(32), aligned(2)));
typedef uint32_t u16v __attribute__((vector_size(64)));

/* 16 weights of a panel row as fp32: loaded, or bf16 ones widened (exact: a bf16 is the top
 * half of the fp32 it is), so both storages give the same products. */
static inline v16 weights(const void *p, int64_t i, int half) {
    if (!half)
        return *(const v16 *)((const float *)p + i);
    return (v16)(__builtin_convertvector(*(const h16 *)((const uint16_t *)p + i), u16v) << 16);
}

/* out [ROWS][PANEL] = rows x [ROWS, K] (`ldx` apart) times one panel p [K][PANEL] (fp32, or
 * bf16 if `half`: the same arithmetic on the widened values, half the bytes streamed). */
static inline __attribute__((always_inline)) void tile(const float *x, int64_t ldx,
                                                       const void *p, int64_t k_len,
                                                       int64_t kb, int half, float *out) {
    const char *bytes = p;
    const int64_t step = PANEL * (half ? 2 : 4); /* bytes per k */
    v16 sum[ROWS][2];
    for (int64_t s = 0; s < k_len; s += kb) {
        const int64_t e = s + kb < k_len ? s + kb : k_len;
        v16 a[ROWS][2];
#pragma GCC unroll 8
        for (int m = 0; m < ROWS; m++)
            a[m][0] = a[m][1] = splat(0.0f);
        for (int64_t k = s; k < e; k++) {
            __builtin_prefetch(bytes + (k + PREFETCH) * step, 0, 2);
            if (!half)
                __builtin_prefetch(bytes + (k + PREFETCH) * step + 64, 0, 2);
            const v16 w0 = weights(p, k * PANEL, half), w1 = weights(p, k * PANEL + 16, half);
#pragma GCC unroll 8
            for (int m = 0; m < ROWS; m++) {
                const v16 xm = broadcast(x[m * ldx + k]);
                a[m][0] = xm * w0 + a[m][0];
                a[m][1] = xm * w1 + a[m][1];
            }
        }
#pragma GCC unroll 8
        for (int m = 0; m < ROWS; m++) {
            sum[m][0] = s == 0 ? a[m][0] : sum[m][0] + a[m][0];
            sum[m][1] = s == 0 ? a[m][1] : sum[m][1] + a[m][1];
        }
    }
    for (int m = 0; m < ROWS; m++) {
        *(v16 *)(out + m * PANEL) = sum[m][0];
        *(v16 *)(out + m * PANEL + 16) = sum[m][1];
    }
}

/* W [n, k] (rows `ldw` apart) into panels [ceil(n / PANEL)][k][PANEL], zero-padded: fp32
 * values, or (parity_gemm_panels_bf16) the top halves of fp32 values that are bf16 values. */
#define PACK(T, VALUE)                                                                       \
    const int64_t count = (n + PANEL - 1) / PANEL;                                            \
    _Pragma("omp parallel for") for (int64_t p = 0; p < count; p++)                           \
        for (int64_t k0 = 0; k0 < k; k0 += 16) /* 16 x PANEL blocks: whole lines read */       \
            for (int64_t j = 0; j < PANEL; j++) {                                             \
                const int64_t col = p * PANEL + j;                                            \
                for (int64_t kk = k0; kk < k0 + 16 && kk < k; kk++)                           \
                    ((T *)panels)[(p * k + kk) * PANEL + j] = col < n ? VALUE : 0;            \
            }

void parity_gemm_panels(const float *w, int64_t ldw, int64_t n, int64_t k, float *panels) {
    PACK(float, w[col * ldw + kk])
}

void parity_gemm_panels_bf16(const uint32_t *w, int64_t ldw, int64_t n, int64_t k,
                             uint16_t *panels) {
    PACK(uint16_t, (uint16_t)(w[col * ldw + kk] >> 16))
}

/* 1 if every value of W [n, k] (rows `ldw` apart) is a bf16 value (its low 16 bits zero). */
int64_t parity_gemm_bf16_valued(const uint32_t *w, int64_t ldw, int64_t n, int64_t k) {
    int64_t other = 0;
#pragma omp parallel for reduction(| : other)
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < k; c++)
            other |= w[r * ldw + c] & 0xffffu;
    return other == 0;
}

/* y [m, n] = x [m, k] times the panels of W (fp32, or bf16 if `half`), plus bias [n] (or
 * NULL); m a multiple of ROWS, kb the K block. On `threads` threads, each a contiguous run of
 * panels. */
void parity_gemm(const float *x, int64_t m, int64_t k, const void *panels, int64_t half,
                 int64_t n, const float *bias, float *y, int64_t kb, int64_t threads) {
    const int64_t count = (n + PANEL - 1) / PANEL;
    const int64_t panel_bytes = k * PANEL * (half ? 2 : 4);
#pragma omp parallel num_threads(threads)
    {
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        float out[ROWS * PANEL] __attribute__((aligned(64)));
        for (int64_t p = count * t / nt; p < count * (t + 1) / nt; p++) {
            const int64_t cols = n - p * PANEL < PANEL ? n - p * PANEL : PANEL;
            const char *panel = (const char *)panels + p * panel_bytes;
            for (int64_t m0 = 0; m0 < m; m0 += ROWS) {
                if (half)
                    tile(x + m0 * k, k, panel, k, kb, 1, out);
                else
                    tile(x + m0 * k, k, panel, k, kb, 0, out);
                for (int r = 0; r < ROWS; r++) {
                    float *yr = y + (m0 + r) * n + p * PANEL;
                    for (int64_t j = 0; j < cols; j++)
                        yr[j] = bias ? out[r * PANEL + j] + bias[p * PANEL + j] : out[r * PANEL + j];
                }
            }
        }
    }
}
