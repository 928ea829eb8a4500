/* parity's row-wise ops in one pass each, fp32: RMSNorm (and the row's rms for the
 * backward), SiLU*mul, RoPE (alone, or with a paged cache's writes). Built by
 * parity.model.native.
 *
 * Why every caller gets the same bits for an output: it is a function of its own row (and
 * w, eps, the row's cos/sin) alone, by a fixed instruction sequence. RMSNorm sums the squares
 * into 16 lanes, 16 columns at a time from column 0 (one FMA each), the lanes by a fixed
 * halving tree; the division by the width, the square root and the two per-element
 * roundings (x / rms, then * w) are correctly rounded. Which rows or threads share the call
 * never enters. */
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "vec16.h"

/* x, y [rows, d] fp32 (d a multiple of 16), w [d], rms [rows]; rows split into `threads`
 * contiguous runs on OpenMP's threads (torch's pool). */
void parity_rms_norm(const float *x, const float *w, float eps, float *y, float *rms,
                     int64_t rows, int64_t d, int64_t threads) {
#pragma omp parallel num_threads(threads)
    {
        const int64_t t = omp_get_thread_num();
        for (int64_t r = rows * t / threads; r < rows * (t + 1) / threads; r++) {
            const float *xr = x + r * d;
            v16 acc = {0};
            for (int64_t i = 0; i < d; i += 16) {
                const v16 v = *(const v16u *)(xr + i);
                acc += v * v;
            }
            const float rr = sqrtf(hsum(acc) / (float)d + eps);
            rms[r] = rr;
            const v16 div = splat(rr);
            for (int64_t i = 0; i < d; i += 16)
                *(v16u *)(y + r * d + i) = *(const v16u *)(xr + i) / div * *(const v16u *)(w + i);
        }
    }
}

/* out [rows, width] = gate / (1 + e^-gate) * up, elementwise (width a multiple of 16); gate
 * and up rows `gate_ld` and `up_ld` values apart (column slices of one GEMM output). Rows on
 * `threads` contiguous runs. */
void parity_silu_mul(const float *gate, int64_t gate_ld, const float *up, int64_t up_ld,
                     float *out, int64_t rows, int64_t width, int64_t threads) {
#pragma omp parallel num_threads(threads)
    {
        const int64_t t = omp_get_thread_num();
        for (int64_t r = rows * t / threads; r < rows * (t + 1) / threads; r++)
            for (int64_t i = 0; i < width; i += 16) {
                const v16 g = *(const v16u *)(gate + r * gate_ld + i);
                /* beyond [-87, 88] silu is 0 or x to fp32's precision */
                const v16 e = vexp(vmin(vmax(-g, splat(-87.0f)), splat(88.0f)));
                *(v16u *)(out + r * width + i) = g / (e + 1.0f) * *(const v16u *)(up + r * up_ld + i);
            }
    }
}

/* One head's rotation, rotate-half convention: y = x * cos + rotate_half(x) * sin with
 * rotate_half(x) = (-x2, x1), d = 2 * half values. Not inlined: parity_rope and
 * parity_rope_store run the same instructions on a head, whatever the compiler contracts. */
__attribute__((noinline)) static void rope_head(const float *xr, const float *c, const float *s,
                                                float *yr, int64_t half) {
    for (int64_t i = 0; i < half; i += 16) {
        const v16 x1 = *(const v16u *)(xr + i), x2 = *(const v16u *)(xr + half + i);
        *(v16u *)(yr + i) = x1 * *(const v16u *)(c + i) - x2 * *(const v16u *)(s + i);
        *(v16u *)(yr + half + i) =
            x2 * *(const v16u *)(c + half + i) + x1 * *(const v16u *)(s + half + i);
    }
}

/* Rotary embedding: x, y [rows, heads, d] and cos, sin [rows, d] fp32 (d a multiple of 32),
 * each head rotated by rope_head. x's rows are x_ld values apart (a column slice of the
 * stacked QKV output), its heads d apart. */
void parity_rope(const float *x, int64_t x_ld, const float *cos, const float *sin, float *y,
                 int64_t rows, int64_t heads, int64_t d, int64_t threads) {
#pragma omp parallel num_threads(threads)
    {
        const int64_t t = omp_get_thread_num();
        for (int64_t r = rows * t / threads; r < rows * (t + 1) / threads; r++)
            for (int64_t h = 0; h < heads; h++)
                rope_head(x + r * x_ld + h * d, cos + r * d, sin + r * d, y + (r * heads + h) * d,
                          d / 2);
    }
}

/* The QKV output's rows x [rows, (hq + 2 hkv) heads of d], x_ld values apart: queries, keys,
 * values. Queries rotated into q [rows, hq, d]; keys rotated and values copied into a paged
 * cache, the (row, KV head) pair i's key to row slots[i] of k_store and its value to row
 * slots[i] of v_store (rows of d values). Each head rotated by rope_head, as parity_rope
 * rotates it. */
void parity_rope_store(const float *x, int64_t x_ld, const float *cos, const float *sin,
                       int64_t rows, int64_t hq, int64_t hkv, int64_t d, float *q, float *k_store,
                       float *v_store, const int64_t *slots, int64_t threads) {
#pragma omp parallel num_threads(threads)
    {
        const int64_t t = omp_get_thread_num();
        for (int64_t r = rows * t / threads; r < rows * (t + 1) / threads; r++) {
            const float *xr = x + r * x_ld, *c = cos + r * d, *s = sin + r * d;
            for (int64_t h = 0; h < hq; h++)
                rope_head(xr + h * d, c, s, q + (r * hq + h) * d, d / 2);
            for (int64_t h = 0; h < hkv; h++) {
                const int64_t slot = slots[r * hkv + h];
                rope_head(xr + (hq + h) * d, c, s, k_store + slot * d, d / 2);
                const float *vr = xr + (hq + hkv + h) * d;
                float *out = v_store + slot * d;
                for (int64_t i = 0; i < d; i++)
                    out[i] = vr[i];
            }
        }
    }
}
