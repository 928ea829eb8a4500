/* 16-lane fp32 vectors (GCC vector extensions) and the few operations parity's kernels share.
 * Each operation is a fixed instruction sequence, lane by lane: a kernel that calls it gets
 * the same bits for a lane whatever the other lanes hold. Included by attention.c and
 * rowwise.c; parity.model.native keys a build on this header too. */
#ifndef PARITY_VEC16_H
#define PARITY_VEC16_H

#include <stdint.h>

typedef float v16 __attribute__((vector_size(64), aligned(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4))); /* for unaligned memory */
typedef int32_t i16 __attribute__((vector_size(64), aligned(64)));

static inline v16 splat(float x) { return (v16){0} + x; }

/* x in every lane, as one broadcast (splat adds x to 0, an extra add in a hot loop, and makes
 * -0 into +0). */
static inline v16 broadcast(float x) {
    return (v16){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
}

static inline v16 vmax(v16 a, v16 b) {
    i16 gt = a > b;
    return (v16)((gt & (i16)a) | (~gt & (i16)b));
}

static inline v16 vmin(v16 a, v16 b) {
    i16 lt = a < b;
    return (v16)((lt & (i16)a) | (~lt & (i16)b));
}

/* e^x for x in [-87, 88] (2^n stays a normal number): Cody-Waite reduction, a degree-6
 * polynomial, 2^n by bits. */
static inline v16 vexp(v16 x) {
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    v16 n = x * 1.44269504088896341f + magic;
    n = n - magic;
    v16 r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    v16 p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    i16 e = (__builtin_convertvector(n, i16) + 127) << 23;
    return p * (v16)e;
}

/* The halving tree: lane i += lane i + w for w = 8, 4, 2, 1, in shuffles (the same adds of
 * the same pairs as a scalar loop over a[i] += a[i + w]). */
static inline float hsum(v16 v) {
    v += __builtin_shuffle(v, (i16){8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15});
    v += __builtin_shuffle(v, (i16){4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7});
    v += __builtin_shuffle(v, (i16){2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3});
    v += __builtin_shuffle(v, (i16){1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
    return v[0];
}

#endif
