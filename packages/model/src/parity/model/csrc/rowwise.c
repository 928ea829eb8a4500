/* parity's aligned RMSNorm in one pass per row: y = x / sqrt(mean(x^2) + eps) * w, and the
 * row's rms for the backward.
 *
 * Why every caller gets the same bits for a row: its arithmetic is a function of the row, w
 * and eps alone. The squares are summed into 16 lanes, 16 columns at a time from column 0
 * (one FMA each), the lanes by a fixed halving tree; then the division by the width, the
 * square root and the two per-element roundings (x / rms, then * w) are correctly rounded.
 * Which rows or threads share the call never enters. Built by parity.model.native. */
#include <math.h>
#include <omp.h>
#include <stdint.h>

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t i16 __attribute__((vector_size(64)));

/* The halving tree: lane i += lane i + w for w = 8, 4, 2, 1. */
static inline float hsum(v16 v) {
    v += __builtin_shuffle(v, (i16){8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15});
    v += __builtin_shuffle(v, (i16){4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7});
    v += __builtin_shuffle(v, (i16){2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3});
    v += __builtin_shuffle(v, (i16){1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
    return v[0];
}

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
                const v16 v = *(const v16 *)(xr + i);
                acc += v * v;
            }
            const float rr = sqrtf(hsum(acc) / (float)d + eps);
            rms[r] = rr;
            const v16 div = (v16){0} + rr;
            for (int64_t i = 0; i < d; i += 16)
                *(v16 *)(y + r * d + i) = *(const v16 *)(xr + i) / div * *(const v16 *)(w + i);
        }
    }
}

/* e^x for x clamped to [-87, 88] (beyond, silu's value is 0 or x to fp32's precision):
 * Cody-Waite reduction, a degree-6 polynomial, 2^n by bits. */
static inline v16 vexp(v16 x) {
    const i16 low = x < -87.0f, high = x > 88.0f;
    x = (v16)((low & (i16)((v16){0} - 87.0f)) | (~low & (i16)x));
    x = (v16)((high & (i16)((v16){0} + 88.0f)) | (~high & (i16)x));
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    v16 n = x * 1.44269504088896341f + magic;
    n = n - magic;
    v16 r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    v16 p = (v16){0} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const i16 e = (__builtin_convertvector(n, i16) + 127) << 23; /* n in [-126, 127] */
    return p * (v16)e;
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
                const v16 g = *(const v16 *)(gate + r * gate_ld + i);
                *(v16 *)(out + r * width + i) =
                    g / (vexp(-g) + 1.0f) * *(const v16 *)(up + r * up_ld + i);
            }
    }
}

/* Rotary embedding, rotate-half convention: x, y [rows, heads, d] and cos, sin [rows, d] fp32
 * (d a multiple of 32): y = x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1). */
void parity_rope(const float *x, const float *cos, const float *sin, float *y, int64_t rows,
                 int64_t heads, int64_t d, int64_t threads) {
    const int64_t half = d / 2;
#pragma omp parallel num_threads(threads)
    {
        const int64_t t = omp_get_thread_num();
        for (int64_t r = rows * t / threads; r < rows * (t + 1) / threads; r++)
            for (int64_t h = 0; h < heads; h++) {
                const float *xr = x + (r * heads + h) * d, *c = cos + r * d, *s = sin + r * d;
                float *yr = y + (r * heads + h) * d;
                for (int64_t i = 0; i < half; i += 16) {
                    const v16 x1 = *(const v16 *)(xr + i), x2 = *(const v16 *)(xr + half + i);
                    *(v16 *)(yr + i) = x1 * *(const v16 *)(c + i) - x2 * *(const v16 *)(s + i);
                    *(v16 *)(yr + half + i) =
                        x2 * *(const v16 *)(c + half + i) + x1 * *(const v16 *)(s + half + i);
                }
            }
    }
}
