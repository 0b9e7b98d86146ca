// This CPU's bfloat16 multiply-add peak: 24 independent vdpbf16ps chains per thread, nothing else (twelve left Zen 5
// latency-bound: 819-896 against 931 GFLOP/s on two cores).
//
//     g++ -O2 -march=native -fopenmp benchmarks/bf16_peak.cpp -o /tmp/bf16_peak && /tmp/bf16_peak
//
// Each vdpbf16ps is 32 multiply-adds (64 FLOP). The chains are written in asm so the compiler cannot merge them.
#include <omp.h>

#include <cstdio>

int main() {
  const long iterations = 100000000;
  const double start = omp_get_wtime();
#pragma omp parallel
  for (long i = 0; i < iterations; ++i)
    __asm__ volatile(
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm0\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm1\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm2\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm3\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm4\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm5\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm6\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm7\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm8\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm9\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm10\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm11\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm12\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm13\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm14\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm15\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm16\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm17\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm18\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm19\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm20\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm21\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm22\n\t"
        "vdpbf16ps %%zmm30, %%zmm31, %%zmm23\n\t"
        ::
            : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
              "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23");
  const double seconds = omp_get_wtime() - start;
  const int threads = omp_get_max_threads();
  std::printf("%d threads: %.0f GFLOP/s bfloat16 (%.2f G vdpbf16ps/s per thread)\n", threads,
              threads * iterations * 24 * 64.0 / seconds / 1e9, iterations * 24 / seconds / 1e9);
}
