/* The sampler's inverse-CDF draw in one pass over the log-probabilities (and a short second
 * one): for each row, the first token whose running sum of probabilities exceeds u times
 * their total. Built by parity.model.native.
 *
 * A row's token is a function of its log-probabilities and its u alone (rows are split
 * across threads, never a row), so a seeded request draws the same token in any batch. The
 * probabilities are e^lp by the vectorised exp of csrc/vec16.h (0 below -87: a masked
 * token, lp = -inf, is never drawn), summed in fp64: per block of BLOCK tokens in 8 lanes,
 * then the blocks in order; the walk to u * total goes block by block and then token by
 * token within the block where the sum crosses. */
#include <math.h> /* INFINITY */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "vec16.h"

#define BLOCK 1024

typedef double v8d __attribute__((vector_size(64), aligned(64)));
typedef float v8f __attribute__((vector_size(32), aligned(32)));

/* e^lp for 16 log-probabilities: 0 below -87 (and for -inf), never NaN for finite lp. */
static inline v16 probs16(const float *lp) {
    const v16 x = *(const v16u *)lp;
    const v16 e = vexp(vmax(x, splat(-87.0f)));
    const i16 keep = x >= splat(-87.0f);
    return (v16)(keep & (i16)e);
}

/* The block's probabilities into p (n <= BLOCK; the tail as a vector padded with -inf, so
 * every token's probability comes from the one exp), their fp64 sum. */
static double block_probs(const float *lp, int64_t n, float *p) {
    v8d acc = {0};
    for (int64_t i = 0; i < n; i += 16) {
        float tail[16] __attribute__((aligned(64)));
        const float *src = lp + i;
        if (n - i < 16) {
            for (int64_t j = 0; j < 16; j++)
                tail[j] = i + j < n ? lp[i + j] : -INFINITY;
            src = tail;
        }
        const v16 e = probs16(src);
        *(v16u *)(p + i) = e; /* p has BLOCK floats: room for the padded tail */
        const v8f lo = __builtin_shufflevector(e, e, 0, 1, 2, 3, 4, 5, 6, 7);
        const v8f hi = __builtin_shufflevector(e, e, 8, 9, 10, 11, 12, 13, 14, 15);
        acc += __builtin_convertvector(lo, v8d);
        acc += __builtin_convertvector(hi, v8d);
    }
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

static int64_t draw_row(const float *lp, int64_t v, double u, double *sums, float *p) {
    const int64_t blocks = (v + BLOCK - 1) / BLOCK;
    double total = 0.0;
    for (int64_t b = 0; b < blocks; b++) {
        sums[b] = block_probs(lp + b * BLOCK, v - b * BLOCK < BLOCK ? v - b * BLOCK : BLOCK, p);
        total += sums[b];
    }
    const double target = u * total;
    /* whole blocks below the target, then token by token from the block where the sum
     * crosses it (or, by rounding, a little later) */
    double cum = 0.0;
    int64_t b = 0;
    while (b + 1 < blocks && cum + sums[b] <= target)
        cum += sums[b++];
    int64_t last = v - 1;
    for (; b < blocks; b++) {
        const int64_t n = v - b * BLOCK < BLOCK ? v - b * BLOCK : BLOCK;
        block_probs(lp + b * BLOCK, n, p);
        for (int64_t i = 0; i < n; i++) {
            if (p[i] == 0.0f)
                continue;
            last = b * BLOCK + i;
            cum += p[i];
            if (cum > target)
                return last;
        }
    }
    return last; /* u * total not reached by rounding: the last token with mass */
}

/* out[r] = the drawn token of row r of lp [rows, v] (rows `ld` apart) with uniform u[r] in
 * [0, 1). Returns 1 if a thread could not get its buffers. */
int parity_draw(const float *lp, int64_t rows, int64_t v, int64_t ld, const double *u,
                int64_t *out, int64_t threads) {
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        double *sums = malloc(sizeof(double) * (size_t)((v + BLOCK - 1) / BLOCK));
        float *p = aligned_alloc(64, sizeof(float) * BLOCK);
        if (!sums || !p) {
            failed = 1;
        } else {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < rows; r++)
                out[r] = draw_row(lp + r * ld, v, u[r], sums, p);
        }
        free(sums);
        free(p);
    }
    return failed;
}
