/* parity's fused aligned attention: one query vector at a time, keys in tiles of KT counted
 * from absolute position 0, online softmax, no score matrix in memory.
 *
 * Why every caller gets the same bits for a query row: the row's arithmetic is a function of
 * its own scaled query, its position p and the keys/values 0..p alone. Its scores, softmax
 * and P*V run tile after tile from tile 0, each tile by the same instruction sequence (fixed
 * trip counts, lanes in a fixed order, sums by a fixed tree), whatever other rows, sequences,
 * threads or cache layout share the call. Keys past p inside its last tile are masked to -inf
 * before the max and add nothing after it; tiles past p's are never visited.
 *
 * Built by parity.model.fused with the machine's C compiler (GCC vector extensions, no
 * -ffast-math: no reassociation; FMA contraction is fixed at compile time for the one binary
 * every caller on the machine loads). */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec16.h"

#define KT 64           /* keys per tile (parity.model.layout.KV_TILE) */
#define NV (KT / 16)    /* 16-lane vectors per tile */
#define MAX_NVD 16      /* head dim up to 256 */
#define EXP_FLOOR -80.0f

/* The largest lane (a max is exact: any order gives it). */
static inline float hmax(v16 v) {
    v = vmax(v, __builtin_shuffle(v, (i16){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7}));
    v = vmax(v, __builtin_shuffle(v, (i16){4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3}));
    v = vmax(v, __builtin_shuffle(v, (i16){2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1}));
    v = vmax(v, __builtin_shuffle(v, (i16){1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0}));
    return v[0];
}

#define NQ 4 /* query vectors a tile pass serves at once: independent chains share loads */
#define PV_CHUNKS 4 /* head-dim chunks of 16 that one P*V pass accumulates at once */

/* Up to NQ query vectors (qv[i] [D], scaled) against one tile: kt [D][KT] keys transposed,
 * vt [KT][D] values, the first vis[i] keys visible to vector i. Updates each vector's running
 * max m[i], denominator l[i] and output accumulator acc[i] [D/16]. Inlined with a constant
 * nq: every vector's lanes see the same operations in the same order whatever nq is. */
static inline __attribute__((always_inline)) void attend_tile(
        const int nq, const float *const *qv, const float *kt, const float *vt, const int *vis,
        int nvd, float **m, float **l, v16 **acc) {
    const int d_len = nvd * 16;
    v16 s[NQ][NV];
    for (int q = 0; q < nq; q++)
        for (int i = 0; i < NV; i++) s[q][i] = splat(0.0f);
    for (int d = 0; d < d_len; d++) {
        v16 kd[NV];
        for (int i = 0; i < NV; i++) kd[i] = *(const v16 *)(kt + d * KT + 16 * i);
        for (int q = 0; q < nq; q++) {
            const float qd = qv[q][d];
            for (int i = 0; i < NV; i++) s[q][i] += qd * kd[i];
        }
    }
    float p[NQ][KT] __attribute__((aligned(64)));
    int most = 0;
    const v16 floor_v = splat(EXP_FLOOR);
    i16 hide[NQ][NV];
    v16 gap = splat(0.0f); /* lane q: m[q] - its new max */
    float m_new[NQ];
    for (int q = 0; q < nq; q++) {
        for (int i = 0; i < NV; i++) {
            i16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
            hide[q][i] = (lane + 16 * i) >= vis[q];
            s[q][i] = (v16)((hide[q][i] & (i16)splat(-INFINITY)) | (~hide[q][i] & (i16)s[q][i]));
        }
        const float tile_max = hmax(vmax(vmax(s[q][0], s[q][1]), vmax(s[q][2], s[q][3])));
        m_new[q] = *m[q] > tile_max ? *m[q] : tile_max;
        gap[q] = *m[q] - m_new[q];
        most = vis[q] > most ? vis[q] : most;
    }
    const v16 alphas = vexp(vmax(gap, floor_v)); /* every vector's rescale in one exp (lanewise) */
    for (int q = 0; q < nq; q++) {
        for (int i = 0; i < NV; i++) {
            v16 e = vexp(vmax(s[q][i] - m_new[q], floor_v));
            *(v16 *)(p[q] + 16 * i) = (v16)(~hide[q][i] & (i16)e);
        }
        v16 pv0 = *(v16 *)(p[q]) + *(v16 *)(p[q] + 16), pv1 = *(v16 *)(p[q] + 32) + *(v16 *)(p[q] + 48);
        *l[q] = __builtin_fmaf(*l[q], alphas[q], hsum(pv0 + pv1)); /* one rounding, always */
        *m[q] = m_new[q];
    }
    /* P*V, PV_CHUNKS 16-lane chunks of the head dim at a time, then one at a time: the
     * nq * PV_CHUNKS independent accumulators hide the FMA's latency. Each accumulator's
     * operations are the same however the chunks are grouped: acc * alpha, then p[j] * v[j]
     * added for keys j = 0, 1, ... in order. */
    int k0 = 0;
    for (; k0 + PV_CHUNKS <= nvd; k0 += PV_CHUNKS) {
        v16 a[NQ][PV_CHUNKS];
        for (int q = 0; q < nq; q++)
            for (int c = 0; c < PV_CHUNKS; c++) a[q][c] = acc[q][k0 + c] * alphas[q];
        /* a key past a vector's vis has p = 0 exactly: adding 0 * v leaves a unchanged */
        for (int j = 0; j < most; j++) {
            v16 vj[PV_CHUNKS];
            for (int c = 0; c < PV_CHUNKS; c++) vj[c] = *(const v16 *)(vt + j * d_len + 16 * (k0 + c));
            for (int q = 0; q < nq; q++) {
                const float pj = p[q][j];
                for (int c = 0; c < PV_CHUNKS; c++) a[q][c] += pj * vj[c];
            }
        }
        for (int q = 0; q < nq; q++)
            for (int c = 0; c < PV_CHUNKS; c++) acc[q][k0 + c] = a[q][c];
    }
    for (; k0 < nvd; k0++) {
        v16 a[NQ];
        for (int q = 0; q < nq; q++) a[q] = acc[q][k0] * alphas[q];
        for (int j = 0; j < most; j++) {
            const v16 vj = *(const v16 *)(vt + j * d_len + 16 * k0);
            for (int q = 0; q < nq; q++) a[q] += p[q][j] * vj;
        }
        for (int q = 0; q < nq; q++) acc[q][k0] = a[q];
    }
}

/* Row r of a [16][16] block of floats becomes column r: four rounds, each swapping the
 * off-diagonal w x w blocks of every 2w x 2w block (w = 8, 4, 2, 1). Data moves only. */
#define SWAP_ROUND(w, LO, HI)                                        \
    for (int i = 0; i < 16; i++)                                     \
        if (!(i & (w))) {                                            \
            const v16 a = m[i], b = m[i + (w)];                      \
            m[i] = __builtin_shuffle(a, b, (i16)LO);                 \
            m[i + (w)] = __builtin_shuffle(a, b, (i16)HI);           \
        }
static inline __attribute__((always_inline)) void transpose16(v16 *m) {
#pragma GCC unroll 16
    SWAP_ROUND(8, ((i16){0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}),
               ((i16){8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}))
#pragma GCC unroll 16
    SWAP_ROUND(4, ((i16){0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}),
               ((i16){4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}))
#pragma GCC unroll 16
    SWAP_ROUND(2, ((i16){0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29}),
               ((i16){2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}))
#pragma GCC unroll 16
    SWAP_ROUND(1, ((i16){0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}),
               ((i16){1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}))
}
#undef SWAP_ROUND

/* 16 values of key row `at` (fp32, or bf16: a bf16 is the top half of the fp32 it is). */
static inline v16 load16(const void *base, int bf16, int64_t at) {
    if (!bf16) return *(const v16u *)((const float *)base + at);
    const uint16_t *h = (const uint16_t *)base + at;
    i16 bits;
    for (int l = 0; l < 16; l++) bits[l] = (int32_t)h[l] << 16;
    return (v16)bits;
}

/* Element offsets at[j] of keys key0..key0+keys-1's rows for head h: key k lives in block
 * blocks[k / block_size], slot k % block_size. */
static void key_offsets(const int32_t *blocks, int64_t block_size, int64_t sb, int64_t sh,
                        int64_t sp, int64_t h, int64_t key0, int64_t keys, int64_t *at) {
    int64_t block = key0 / block_size, slot = key0 % block_size;
    for (int64_t j = 0; j < keys; j++) {
        at[j] = blocks[block] * sb + h * sh + slot * sp;
        if (++slot == block_size) slot = 0, block++;
    }
}

/* Ask for the K and V rows at `at` [keys] to be brought into cache while the current tile
 * computes: a paged pool's blocks are scattered pages, which the hardware prefetcher does
 * not follow. */
static void prefetch_rows(const void *k, const void *v, int bf16, const int64_t *at,
                          int64_t keys, int64_t d_len) {
    const int64_t size = bf16 ? 2 : 4, row = d_len * size;
    for (int64_t j = 0; j < keys; j++)
        for (int64_t b = 0; b < row; b += 64) {
            __builtin_prefetch((const char *)k + at[j] * size + b);
            __builtin_prefetch((const char *)v + at[j] * size + b);
        }
}

/* The keys at `at` [keys] into kt [D][KT] (transposed; keys past `keys` zero) and their
 * values into vt [KT][D]. */
static void load_tile(const void *k, const void *v, int bf16, const int64_t *at, int64_t keys,
                      int64_t d_len, float *kt, float *vt) {
    for (int64_t j0 = 0; j0 < KT; j0 += 16)
        for (int64_t c = 0; c < d_len; c += 16) {
            v16 m[16];
            for (int r = 0; r < 16; r++)
                m[r] = j0 + r < keys ? load16(k, bf16, at[j0 + r] + c) : splat(0.0f);
            transpose16(m);
            for (int r = 0; r < 16; r++) *(v16 *)(kt + (c + r) * KT + j0) = m[r];
        }
    for (int64_t j = 0; j < keys; j++)
        for (int64_t c = 0; c < d_len; c += 16)
            *(v16 *)(vt + j * d_len + c) = load16(v, bf16, at[j] + c);
}

/* Units u0..u1 of `units` (see parity_attend), one after another. */
static int attend_units(const float *q, const void *k, const void *v, int bf16, int64_t sb,
                        int64_t sh, int64_t sp, const int32_t *table, int64_t table_stride,
                        int64_t block_size, const int64_t *units, int64_t u0, int64_t u1,
                        int64_t hq, int64_t hkv, int64_t d_len, float scale, float *out,
                        float *lse) {
    const int64_t g_heads = hq / hkv;
    const int nvd = (int)(d_len / 16);
    int64_t most = 0;
    for (int64_t u = u0; u < u1; u++) most = units[5 * u + 3] > most ? units[5 * u + 3] : most;
    const int64_t vecs = most * g_heads;
    float *kt = aligned_alloc(64, (size_t)d_len * KT * sizeof(float));
    float *vt = aligned_alloc(64, (size_t)d_len * KT * sizeof(float));
    float *qs = aligned_alloc(64, (size_t)(vecs ? vecs : 1) * d_len * sizeof(float));
    v16 *acc = aligned_alloc(64, (size_t)(vecs ? vecs : 1) * nvd * sizeof(v16));
    float *mx = malloc((size_t)(vecs ? vecs : 1) * sizeof(float));
    float *den = malloc((size_t)(vecs ? vecs : 1) * sizeof(float));
    if (!kt || !vt || !qs || !acc || !mx || !den) {
        free(kt), free(vt), free(qs), free(acc), free(mx), free(den);
        return -1;
    }
    for (int64_t u = u0; u < u1; u++) {
        const int64_t s = units[5 * u], h = units[5 * u + 1], row0 = units[5 * u + 2];
        const int64_t rows = units[5 * u + 3], pos0 = units[5 * u + 4];
        const int64_t m_len = rows * g_heads;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t g = 0; g < g_heads; g++) {
                const float *src = q + ((row0 + r) * hq + h * g_heads + g) * d_len;
                float *dst = qs + (r * g_heads + g) * d_len;
                for (int64_t d = 0; d < d_len; d++) dst[d] = src[d] * scale;
            }
        for (int64_t i = 0; i < m_len; i++) {
            mx[i] = -INFINITY;
            den[i] = 0.0f;
            for (int k2 = 0; k2 < nvd; k2++) acc[i * nvd + k2] = splat(0.0f);
        }
        const int64_t last = pos0 + rows - 1;
        for (int64_t t = 0; t <= last / KT; t++) {
            const int64_t key0 = t * KT;
            const int64_t keys = last - key0 + 1 < KT ? last - key0 + 1 : KT;
            int64_t at[KT];
            key_offsets(table + s * table_stride, block_size, sb, sh, sp, h, key0, keys, at);
            load_tile(k, v, bf16, at, keys, d_len, kt, vt);
            if (t < last / KT) {
                const int64_t next = last - key0 - KT + 1 < KT ? last - key0 - KT + 1 : KT;
                key_offsets(table + s * table_stride, block_size, sb, sh, sp, h, key0 + KT, next,
                            at);
                prefetch_rows(k, v, bf16, at, next, d_len);
            }
            /* the query vectors that see this tile, NQ at a time */
            int64_t i = key0 > pos0 ? (key0 - pos0) * g_heads : 0;
            while (i < m_len) {
                const int nq = m_len - i < NQ ? (int)(m_len - i) : NQ;
                const float *qv[NQ];
                float *mp[NQ], *lp[NQ];
                v16 *ap[NQ];
                int vis[NQ];
                for (int q = 0; q < nq; q++) {
                    const int64_t pos = pos0 + (i + q) / g_heads;
                    vis[q] = (int)(pos - key0 + 1 < KT ? pos - key0 + 1 : KT);
                    qv[q] = qs + (i + q) * d_len;
                    mp[q] = mx + i + q;
                    lp[q] = den + i + q;
                    ap[q] = acc + (i + q) * nvd;
                }
                switch (nq) {
                case 4: attend_tile(4, qv, kt, vt, vis, nvd, mp, lp, ap); break;
                case 3: attend_tile(3, qv, kt, vt, vis, nvd, mp, lp, ap); break;
                case 2: attend_tile(2, qv, kt, vt, vis, nvd, mp, lp, ap); break;
                default: attend_tile(1, qv, kt, vt, vis, nvd, mp, lp, ap);
                }
                i += nq;
            }
        }
        for (int64_t r = 0; r < rows; r++)
            for (int64_t g = 0; g < g_heads; g++) {
                const int64_t i = r * g_heads + g, head = h * g_heads + g;
                float *dst = out + ((row0 + r) * hq + head) * d_len;
                for (int k2 = 0; k2 < nvd; k2++) {
                    v16 o = acc[i * nvd + k2] / den[i];
                    memcpy(dst + 16 * k2, &o, sizeof o);
                }
                lse[(row0 + r) * hq + head] = mx[i] + logf(den[i]);
            }
    }
    free(kt), free(vt), free(qs), free(acc), free(mx), free(den);
    return 0;
}

/* The units of `units` [*, 5] = (table row, KV head, first query row, rows, position of the
 * first row), thread t of `threads` taking units cuts[t]..cuts[t+1]-1, on OpenMP's threads
 * (torch's own pool: this library binds to the libgomp torch loaded). q [N, Hq, D] and out
 * [N, Hq, D] contiguous fp32, lse [N, Hq]; k and v element strides (block, head, position),
 * D contiguous; table [S, table_stride] int32 of blocks of block_size positions. Returns 0,
 * or -1 if out of memory. */
int parity_attend(const float *q, const void *k, const void *v, int bf16, int64_t sb, int64_t sh,
                  int64_t sp, const int32_t *table, int64_t table_stride, int64_t block_size,
                  const int64_t *units, const int64_t *cuts, int64_t threads, int64_t hq,
                  int64_t hkv, int64_t d_len, float scale, float *out, float *lse) {
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        const int64_t t = omp_get_thread_num();
        if (t < threads)
            failed |= attend_units(q, k, v, bf16, sb, sh, sp, table, table_stride, block_size,
                                   units, cuts[t], cuts[t + 1], hq, hkv, d_len, scale, out, lse);
    }
    return failed ? -1 : 0;
}
