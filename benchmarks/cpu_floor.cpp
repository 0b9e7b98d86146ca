// This CPU's floor for every x86 class: float32 FMA peak (GFLOP/s), the int8 dot-product peak of AVX-512 VNNI and
// the AMX tiles' bfloat16 and int8 peaks where the CPU has them (GOP/s), and read bandwidth (GB/s) from memory and
// from a footprint the size of a small model's weights, on every thread OpenMP gives it. (`bf16_peak.cpp`
// measures the AVX-512 BF16 dot-product peak.)
//
//     g++ -O2 -march=native -fopenmp benchmarks/cpu_floor.cpp -o /tmp/cpu_floor && /tmp/cpu_floor
//
// Peak: twelve independent FMA chains per thread in asm (so the compiler cannot merge them), on ymm registers (8
// float32 lanes, 16 FLOP per FMA) or, where the build has AVX-512F, zmm ones too (16 lanes, 32 FLOP). Bandwidth:
// each thread sums its share of a float32 array with vector loads, best of five passes; that is what a
// memory-bound decode step does with the weights (reads them once): 1 GiB comes from DRAM, 96 MiB (SmolLM2-135M's
// Q4_1 GGUF) may partly stay in a large last-level cache; 1 GiB once more on transparent huge pages (the pages
// frame's cpu platform gives its packed weights and KV pool: 4 KiB pages cost a stream a TLB miss every 4 KiB). VNNI: twelve vpdpbusd chains (64 int8 multiply-adds
// each). AMX: tdpbf16ps / tdpbssd into four accumulator tiles (16 x 16 x 32 or x 64 multiply-adds each).
#include <immintrin.h>
#include <omp.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#define FMA12(op, reg)                                                                                          \
  __asm__ volatile(op " %%" reg "14, %%" reg "15, %%" reg "0\n\t" op " %%" reg "14, %%" reg "15, %%" reg "1\n\t" \
                   op " %%" reg "14, %%" reg "15, %%" reg "2\n\t" op " %%" reg "14, %%" reg "15, %%" reg "3\n\t" \
                   op " %%" reg "14, %%" reg "15, %%" reg "4\n\t" op " %%" reg "14, %%" reg "15, %%" reg "5\n\t" \
                   op " %%" reg "14, %%" reg "15, %%" reg "6\n\t" op " %%" reg "14, %%" reg "15, %%" reg "7\n\t" \
                   op " %%" reg "14, %%" reg "15, %%" reg "8\n\t" op " %%" reg "14, %%" reg "15, %%" reg "9\n\t" \
                   op " %%" reg "14, %%" reg "15, %%" reg "10\n\t" op " %%" reg "14, %%" reg "15, %%" reg "11\n\t" \
                   ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11")

static double fma_peak(bool wide) {
  const long iterations = 100000000;
  const double start = omp_get_wtime();
#pragma omp parallel
  for (long i = 0; i < iterations; ++i) {
#if defined(__AVX512F__)
    if (wide) {
      FMA12("vfmadd231ps", "zmm");
      continue;
    }
#endif
    FMA12("vfmadd231ps", "ymm");
  }
  const double seconds = omp_get_wtime() - start;
  const double flop_per_fma = wide ? 32.0 : 16.0;
  return 12.0 * flop_per_fma * iterations * omp_get_max_threads() / seconds / 1e9;
}

// Freed with std::free; advised as huge pages (before the first touch) or kept on small ones.
struct PagedBuffer {
  float* ptr;
  PagedBuffer(size_t n, bool huge) {
    const size_t page = size_t(2) << 20, bytes = (n * sizeof(float) + page - 1) / page * page;
    ptr = static_cast<float*>(std::aligned_alloc(page, bytes));
    madvise(ptr, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  }
  ~PagedBuffer() { std::free(ptr); }
  float* data() const { return ptr; }
};

static double read_bandwidth(size_t bytes, bool huge = false) {
  const size_t n = bytes / sizeof(float);
  PagedBuffer data(n, huge);
#pragma omp parallel for
  for (size_t i = 0; i < n; ++i) data.data()[i] = 1.0f;  // first touch by the thread that reads it later
  double best = 0.0;
  volatile float sink = 0.0f;
  for (int pass = 0; pass < (bytes < (size_t(1) << 28) ? 50 : 5); ++pass) {
    const double start = omp_get_wtime();
    float total = 0.0f;
#pragma omp parallel for reduction(+ : total)
    for (size_t block = 0; block < n / 64; ++block) {
      const float* p = data.data() + block * 64;
      __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8), c = _mm256_loadu_ps(p + 16),
             d = _mm256_loadu_ps(p + 24);
      a = _mm256_add_ps(a, _mm256_loadu_ps(p + 32));
      b = _mm256_add_ps(b, _mm256_loadu_ps(p + 40));
      c = _mm256_add_ps(c, _mm256_loadu_ps(p + 48));
      d = _mm256_add_ps(d, _mm256_loadu_ps(p + 56));
      const __m256 s = _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d));
      float lanes[8];
      _mm256_storeu_ps(lanes, s);
      total += lanes[0] + lanes[7];
    }
    const double seconds = omp_get_wtime() - start;
    sink = sink + total;
    best = std::max(best, double(n) * sizeof(float) / seconds / 1e9);
  }
  return best;
}

#if defined(__AVX512VNNI__)
static double vnni_peak() {
  const long iterations = 100000000;
  const double start = omp_get_wtime();
#pragma omp parallel
  for (long i = 0; i < iterations; ++i) FMA12("vpdpbusd", "zmm");
  return 12.0 * 64 * 2 * iterations * omp_get_max_threads() / (omp_get_wtime() - start) / 1e9;
}
#endif

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AMX_INT8__)
#include <sys/syscall.h>
#include <unistd.h>

struct alignas(64) TileConfig {
  unsigned char palette = 1, start = 0, reserved[14] = {};
  unsigned short colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  unsigned char rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// Four independent accumulator tiles per thread; `int8` runs tdpbssd (64 inputs per row) instead of tdpbf16ps (32).
static double amx_peak(bool int8) {
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) return 0.0;  // ask Linux for the tile state
  const long iterations = 20000000;
  const double start = omp_get_wtime();
#pragma omp parallel
  {
    static const TileConfig config;
    _tile_loadconfig(&config);
    alignas(64) static thread_local unsigned char zeros[16 * 64] = {};
    _tile_loadd(4, zeros, 64);
    _tile_loadd(5, zeros, 64);
    for (long i = 0; i < iterations; ++i) {
      if (int8) {
        _tile_dpbssd(0, 4, 5);
        _tile_dpbssd(1, 4, 5);
        _tile_dpbssd(2, 4, 5);
        _tile_dpbssd(3, 4, 5);
      } else {
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(1, 4, 5);
        _tile_dpbf16ps(2, 4, 5);
        _tile_dpbf16ps(3, 4, 5);
      }
    }
    _tile_release();
  }
  const double per_tile = 16.0 * 16 * (int8 ? 64 : 32) * 2;
  return 4 * per_tile * iterations * omp_get_max_threads() / (omp_get_wtime() - start) / 1e9;
}
#endif

int main() {
  const int threads = omp_get_max_threads();
  std::printf("threads: %d\n", threads);
  std::printf("float32 FMA peak, AVX2 (ymm): %.1f GFLOP/s\n", fma_peak(false));
#if defined(__AVX512F__)
  std::printf("float32 FMA peak, AVX-512 (zmm): %.1f GFLOP/s\n", fma_peak(true));
#else
  std::printf("float32 FMA peak, AVX-512 (zmm): not built (this build has no AVX-512F)\n");
#endif
#if defined(__AVX512VNNI__)
  std::printf("int8 dot-product peak, AVX-512 VNNI (vpdpbusd): %.0f GOP/s\n", vnni_peak());
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AMX_INT8__)
  std::printf("AMX bfloat16 peak (tdpbf16ps): %.0f GFLOP/s\n", amx_peak(false));
  std::printf("AMX int8 peak (tdpbssd): %.0f GOP/s\n", amx_peak(true));
#endif
  std::printf("memory read bandwidth: %.1f GB/s (best of 5 passes over 1 GiB)\n", read_bandwidth(size_t(1) << 30));
  std::printf("read bandwidth over 96 MiB: %.1f GB/s (best of 50 passes)\n", read_bandwidth(size_t(96) << 20));
  std::printf("memory read bandwidth on huge pages: %.1f GB/s (best of 5 passes over 1 GiB, MADV_HUGEPAGE)\n",
              read_bandwidth(size_t(1) << 30, true));
  return 0;
}
