/* parity's aligned bf16 linear: y = x w^T + b on bf16 operands with AVX512-BF16's dot product,
 * streaming the bf16 weight once per call for up to ROWS rows.
 *
 * Why every caller gets the same bits for an output: y[r][c] is one accumulator that starts at
 * 0 and takes VDPBF16PS with the pairs (x[r][2p], x[r][2p+1]) and (w[c][2p], w[c][2p+1]) for
 * p = 0, 1, ..., k/2 - 1 in that order, then adds the bias once and rounds to bf16 once
 * (VCVTNEPS2BF16). Which rows, columns or threads share the call only decides which register
 * holds that accumulator, never its operations.
 *
 * The weight is packed once (parity.model.linear_bf16.pack): [n/16][k/2][16][2], so one
 * 64-byte load holds 16 output columns' next pair. Built by parity.model.native with the
 * machine's C compiler; used only where the CPU has AVX512-BF16. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define ROWS 8       /* rows of x one pass over a weight panel serves */
#define COLS 2       /* 16-column blocks one pass accumulates at once: ROWS * COLS chains */
#define PANEL_BYTES (256 * 1024) /* a thread's weight panel, reused by every row tile from L2 */

static inline __attribute__((always_inline)) void tile(
        const int rows, const int cols, const uint16_t *x, int64_t k, const uint16_t *w,
        const uint16_t *bias, int64_t col0, uint16_t *y, int64_t n) {
    const int64_t pairs = k / 2;
    __m512 acc[ROWS][COLS];
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) acc[r][c] = _mm512_setzero_ps();
    const uint16_t *wc[COLS];
    for (int c = 0; c < cols; c++) wc[c] = w + (col0 / 16 + c) * pairs * 32;
    for (int64_t p = 0; p < pairs; p++) {
        __m512bh wv[COLS];
        for (int c = 0; c < cols; c++) wv[c] = (__m512bh)_mm512_load_si512(wc[c] + p * 32);
        for (int r = 0; r < rows; r++) {
            int32_t pair;
            memcpy(&pair, x + r * k + 2 * p, sizeof pair);
            const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
            for (int c = 0; c < cols; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xb, wv[c]);
        }
    }
    for (int c = 0; c < cols; c++) {
        __m512 b = _mm512_setzero_ps();
        if (bias)
            b = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(bias + col0 + 16 * c))),
                16));
        for (int r = 0; r < rows; r++) {
            const __m256bh o = _mm512_cvtneps_pbh(_mm512_add_ps(acc[r][c], b));
            _mm256_storeu_si256((__m256i *)(y + r * n + col0 + 16 * c), (__m256i)o);
        }
    }
}

#define TILE_ROWS(R)                                                                   \
    case R:                                                                            \
        if (cols == COLS) tile(R, COLS, xr, k, w, bias, col, yr, n);                   \
        else tile(R, 1, xr, k, w, bias, col, yr, n);                                   \
        break;

/* x [m, k] and y [m, n] row-major bf16 (k even, n a multiple of 16), w packed [n/16][k/2][16][2]
 * and 64-byte aligned, bias [n] bf16 or NULL. The column blocks are split into `threads`
 * contiguous runs, one per OpenMP thread (torch's pool). */
void parity_linear_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y,
                        int64_t m, int64_t k, int64_t n, int64_t threads) {
    const int64_t blocks = n / 16;
    int64_t panel = PANEL_BYTES / (k * 32);
    panel = panel < COLS ? COLS : panel - panel % COLS;
#pragma omp parallel num_threads(threads)
    {
        const int64_t t = omp_get_thread_num();
        const int64_t b0 = blocks * t / threads, b1 = blocks * (t + 1) / threads;
        for (int64_t p0 = b0; p0 < b1; p0 += panel) {
            const int64_t p1 = p0 + panel < b1 ? p0 + panel : b1;
            for (int64_t r0 = 0; r0 < m; r0 += ROWS) {
                const int rows = m - r0 < ROWS ? (int)(m - r0) : ROWS;
                const uint16_t *xr = x + r0 * k;
                uint16_t *yr = y + r0 * n;
                for (int64_t cb = p0; cb < p1; cb += COLS) {
                    const int cols = p1 - cb < COLS ? (int)(p1 - cb) : COLS;
                    const int64_t col = cb * 16;
                    switch (rows) {
                        TILE_ROWS(8) TILE_ROWS(7) TILE_ROWS(6) TILE_ROWS(5)
                        TILE_ROWS(4) TILE_ROWS(3) TILE_ROWS(2) TILE_ROWS(1)
                    }
                }
            }
        }
    }
}
