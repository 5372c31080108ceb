/* Read bandwidth of this machine: a buffer of MIB MiB (default 248, the bytes of int4 weights and
 * scales one decode step of the real-shape backbone reads) read with AVX-512 loads by
 * OMP_NUM_THREADS threads, 6 times. docs/performance.md sets a decode step's time against it.
 *
 *   gcc -O2 -mavx512f -fopenmp benches/membw.c -o target/membw && OMP_NUM_THREADS=2 target/membw 248
 *
 * It needs a CPU with AVX-512 (this workplace's Xeon); elsewhere it stops with an illegal
 * instruction.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 248;
    size_t n = mib * 1024 * 1024 / 64;
    __m512i *a = aligned_alloc(64, n * 64);
    if (!a) return 1;
    for (size_t i = 0; i < n; i++) a[i] = _mm512_set1_epi32((int)i);
    for (int r = 0; r < 6; r++) {
        struct timespec t0, t1;
        __m512i acc = _mm512_setzero_si512();
        clock_gettime(CLOCK_MONOTONIC, &t0);
#pragma omp parallel
        {
            __m512i s = _mm512_setzero_si512();
#pragma omp for
            for (size_t i = 0; i < n; i++) s = _mm512_xor_si512(s, a[i]);
#pragma omp critical
            acc = _mm512_xor_si512(acc, s);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double dt = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
        /* The checksum keeps the loads from being optimised away. */
        printf("%zu MiB, %d threads: %.1f ms, %.1f GB/s (checksum %d)\n", mib, omp_get_max_threads(),
               dt * 1e3, mib * 1048576.0 / dt / 1e9, _mm512_reduce_add_epi32(acc) & 1);
    }
    free(a);
    return 0;
}
