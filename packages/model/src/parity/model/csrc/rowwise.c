/* parity's row-wise ops in one pass each, fp32 (and bf16, see widen/narrow): RMSNorm (and
 * the row's rms for the backward), SiLU*mul, RoPE (alone, or with a paged cache's writes).
 * Built by
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
#include <stdlib.h>

#include "vec16.h"

/* bf16 and fp32. A bf16 is the top half of the fp32 it is, so widening is exact; narrowing
 * rounds to nearest, ties to even, and a NaN becomes 0xffff: what torch's `.to(bfloat16)`
 * gives (its vectorised conversion, which every tensor size takes). A bf16 entry point widens
 * its operands, runs the fp32 op's own row function on them and narrows the result once: the
 * bits of the fp32 op on the bf16 values, rounded to bf16, which is what parity's aligned ops
 * define for bf16 (parity.model.kernels), without torch's conversions around the call. */
static inline float widen1(uint16_t b) {
    union { uint32_t u; float f; } v = {(uint32_t)b << 16};
    return v.f;
}

static inline uint16_t narrow1(float f) {
    union { float f; uint32_t u; } v = {f};
    const uint32_t r = (v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16;
    return f != f ? (uint16_t)0xffff : (uint16_t)r;
}

static void widen(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        dst[i] = widen1(src[i]);
}

static void narrow(const float *src, uint16_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        dst[i] = narrow1(src[i]);
}

/* A bf16 entry point's row r: widen its operands into buf, run the fp32 row function, narrow. */
typedef void (*bf16_row)(const void *args, float *buf, int64_t r);

/* row(args, buf, r) for every row, on `threads` contiguous runs as the fp32 entry points split
 * them, each thread with a buffer of `floats` fp32 values (a multiple of 16). Returns 1 if a
 * thread could not get its buffer. */
static int bf16_rows(bf16_row row, const void *args, int64_t floats, int64_t rows,
                     int64_t threads) {
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        float *buf = aligned_alloc(64, (size_t)floats * sizeof(float));
        if (!buf) {
            failed = 1;
        } else {
            const int64_t t = omp_get_thread_num();
            for (int64_t r = rows * t / threads; r < rows * (t + 1) / threads; r++)
                row(args, buf, r);
            free(buf);
        }
    }
    return failed;
}

/* One row of RMSNorm: yr = xr / rms * w, returning rms (d a multiple of 16). Not inlined:
 * the fp32 and bf16 entry points run the same instructions on a row. */
__attribute__((noinline)) static float rms_row(const float *xr, const float *w, float eps,
                                               float *yr, int64_t d) {
    v16 acc = {0};
    for (int64_t i = 0; i < d; i += 16) {
        const v16 v = *(const v16u *)(xr + i);
        acc += v * v;
    }
    const float rr = sqrtf(hsum(acc) / (float)d + eps);
    const v16 div = splat(rr);
    for (int64_t i = 0; i < d; i += 16)
        *(v16u *)(yr + i) = *(const v16u *)(xr + i) / div * *(const v16u *)(w + i);
    return rr;
}

/* x, y [rows, d] fp32 (d a multiple of 16), w [d], rms [rows]; rows split into `threads`
 * contiguous runs on OpenMP's threads (torch's pool). */
void parity_rms_norm(const float *x, const float *w, float eps, float *y, float *rms,
                     int64_t rows, int64_t d, int64_t threads) {
#pragma omp parallel num_threads(threads)
    {
        const int64_t t = omp_get_thread_num();
        for (int64_t r = rows * t / threads; r < rows * (t + 1) / threads; r++)
            rms[r] = rms_row(x + r * d, w, eps, y + r * d, d);
    }
}

struct rms_bf16 {
    const uint16_t *x;
    const float *w; /* widened once for all rows */
    float eps;
    uint16_t *y;
    int64_t d;
};

static void rms_bf16_row(const void *args, float *buf, int64_t r) {
    const struct rms_bf16 *a = args;
    float *xr = buf, *yr = buf + a->d;
    widen(a->x + r * a->d, xr, a->d);
    rms_row(xr, a->w, a->eps, yr, a->d);
    narrow(yr, a->y + r * a->d, a->d);
}

/* parity_rms_norm on bf16 x, w and y (no rms: the bf16 path serves calls without gradients).
 * Returns 1 if it could not get its buffers. */
int parity_rms_norm_bf16(const uint16_t *x, const uint16_t *w, float eps, uint16_t *y,
                         int64_t rows, int64_t d, int64_t threads) {
    float *wf = aligned_alloc(64, (size_t)d * sizeof(float));
    if (!wf)
        return 1;
    widen(w, wf, d);
    const struct rms_bf16 args = {x, wf, eps, y, d};
    const int failed = bf16_rows(rms_bf16_row, &args, 2 * d, rows, threads);
    free(wf);
    return failed;
}

/* One row of SiLU*mul: out = gate / (1 + e^-gate) * up (width a multiple of 16). Not
 * inlined, as rms_row. */
__attribute__((noinline)) static void silu_row(const float *g, const float *u, float *out,
                                               int64_t width) {
    for (int64_t i = 0; i < width; i += 16) {
        const v16 gv = *(const v16u *)(g + i);
        /* beyond [-87, 88] silu is 0 or x to fp32's precision */
        const v16 e = vexp(vmin(vmax(-gv, splat(-87.0f)), splat(88.0f)));
        *(v16u *)(out + i) = gv / (e + 1.0f) * *(const v16u *)(u + i);
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
            silu_row(gate + r * gate_ld, up + r * up_ld, out + r * width, width);
    }
}

struct silu_bf16 {
    const uint16_t *gate, *up;
    int64_t gate_ld, up_ld;
    uint16_t *out;
    int64_t width;
};

static void silu_bf16_row(const void *args, float *buf, int64_t r) {
    const struct silu_bf16 *a = args;
    float *g = buf, *u = buf + a->width, *o = buf + 2 * a->width;
    widen(a->gate + r * a->gate_ld, g, a->width);
    widen(a->up + r * a->up_ld, u, a->width);
    silu_row(g, u, o, a->width);
    narrow(o, a->out + r * a->width, a->width);
}

/* parity_silu_mul on bf16 gate, up and out. Returns 1 if it could not get its row buffers. */
int parity_silu_mul_bf16(const uint16_t *gate, int64_t gate_ld, const uint16_t *up,
                         int64_t up_ld, uint16_t *out, int64_t rows, int64_t width,
                         int64_t threads) {
    const struct silu_bf16 args = {gate, up, gate_ld, up_ld, out, width};
    return bf16_rows(silu_bf16_row, &args, 3 * width, rows, threads);
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

struct rope_store_bf16 {
    const uint16_t *x;
    int64_t x_ld;
    const float *cos, *sin;
    int64_t hq, hkv, d;
    uint16_t *q, *k_store, *v_store;
    const int64_t *slots;
};

static void rope_store_bf16_row(const void *args, float *buf, int64_t r) {
    const struct rope_store_bf16 *a = args;
    const int64_t d = a->d;
    float *in = buf, *rot = buf + d;
    const uint16_t *xr = a->x + r * a->x_ld;
    const float *c = a->cos + r * d, *s = a->sin + r * d;
    for (int64_t h = 0; h < a->hq; h++) {
        widen(xr + h * d, in, d);
        rope_head(in, c, s, rot, d / 2);
        narrow(rot, a->q + (r * a->hq + h) * d, d);
    }
    for (int64_t h = 0; h < a->hkv; h++) {
        const int64_t slot = a->slots[r * a->hkv + h];
        widen(xr + (a->hq + h) * d, in, d);
        rope_head(in, c, s, rot, d / 2);
        narrow(rot, a->k_store + slot * d, d);
        const uint16_t *vr = xr + (a->hq + a->hkv + h) * d;
        uint16_t *out = a->v_store + slot * d;
        for (int64_t i = 0; i < d; i++)
            out[i] = vr[i];
    }
}

/* parity_rope_store on bf16: the QKV output x and the cache bf16, the rotated queries q bf16;
 * each head widened, rotated by rope_head and narrowed (keys and queries), values copied.
 * Returns 1 if it could not get its head buffers. */
int parity_rope_store_bf16(const uint16_t *x, int64_t x_ld, const float *cos, const float *sin,
                           int64_t rows, int64_t hq, int64_t hkv, int64_t d, uint16_t *q,
                           uint16_t *k_store, uint16_t *v_store, const int64_t *slots,
                           int64_t threads) {
    const struct rope_store_bf16 args = {x, x_ld, cos, sin, hq, hkv, d, q, k_store, v_store,
                                         slots};
    return bf16_rows(rope_store_bf16_row, &args, 2 * d, rows, threads);
}
