// Which weight layout lets a one-row GGUF product stream at the read floor: the cpu platform's (each group of 16
// output rows contiguous over its blocks, a decode set reading four groups' streams at once, and their scales'
// streams) against a group set's blocks interleaved into one stream (block b of groups g..g+3, then block b+1; the
// set's scales interleaved the same way, a second stream beside it), the same bytes and the same arithmetic (q4_1's: nibbles in place, vpdpbusd, float16 scales), in one process,
// rounds alternating with a plain read of the weight bytes. The sums are not checked: random bytes, speed only.
//
//     g++ -O2 -march=native -fopenmp benchmarks/ggml_layout_ab.cpp -o /tmp/ggml_layout_ab && /tmp/ggml_layout_ab
//
// The matrices are SmolLM2-135M's 120 q4_1 linears (84 MB with the scales, on transparent huge pages). Each layout
// asks for its weight ahead (prefetcht1) by its own best distance here: 1 KB for the groups (the platform's
// kPrefetchAhead), 4 KB for the one stream. On the Zen 5 of 2026-12-07 (2 cores, AVX-512 VNNI), four runs:
//   one thread:  groups 19.5-22.4 GB/s, one stream 31.3-31.9 (2 KB ahead) and 38.2-38.3 (4 KB), plain read
//                38.5-39.9;
//   two threads: groups 33.9-38.5 GB/s, one stream 53.4-54.1 (2 KB) and 54.4-59.1 (4 KB), plain read 61.6-71.5.
// The platform's own kernel (which also hands each group's prefetch on to the next set's) read 59-64% of the floor
// in decode_rows.py on that machine; the one stream reads 83-99%.
#include <immintrin.h>
#include <omp.h>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
#include <algorithm>
#include <sys/mman.h>

constexpr int G = 4, kBlock = 32;
constexpr int64_t kGroupsAhead = 1024, kStreamAhead = 4096;
// A group's block: 16 rows x 32 inputs as nibbles (256 bytes); its scales: 16 d then 16 m, float16 (sbytes counts
// uint16 values).
constexpr int64_t qbytes = 256, sbytes = 32;

static inline __m512i bq(const int8_t* p) { int32_t v; std::memcpy(&v, p, 4); return _mm512_set1_epi32(v); }

template <bool Inter>
static void set_dot(const uint8_t* qs, const uint16_t* sc, int64_t nb, const int8_t* xq, const float* xd, int64_t ahead,
                    __m512* out) {
  __m512 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8((char)0xF0);
  for (int64_t b = 0; b < nb; ++b) {
    __m512i x4[8];
    for (int i = 0; i < 4; ++i) { x4[i] = bq(xq + b * kBlock + 4 * i); x4[i + 4] = bq(xq + b * kBlock + 16 + 4 * i); }
    const __m512 dx = _mm512_set1_ps(xd[b]);
    for (int g = 0; g < G; ++g) {
      const uint8_t* wb = Inter ? qs + (b * G + g) * qbytes : qs + (g * nb + b) * qbytes;
      const uint16_t* sb = Inter ? sc + (b * G + g) * sbytes : sc + (g * nb + b) * sbytes;
      for (int c = 0; c < 4; ++c) _mm_prefetch((const char*)(wb + ahead + 64 * c), _MM_HINT_T1);
      _mm_prefetch((const char*)(sb + ahead / 8), _MM_HINT_T1);
      __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
      for (int c = 0; c < 4; ++c) {
        const __m512i p = _mm512_loadu_si512(wb + 64 * c);
        lo = _mm512_dpbusd_epi32(lo, _mm512_and_si512(p, low), x4[c]);
        hi = _mm512_dpbusd_epi32(hi, _mm512_and_si512(p, high), x4[c + 4]);
      }
      const __m512i dot = _mm512_add_epi32(lo, _mm512_srai_epi32(hi, 4));
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)sb));
      acc[g] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dot), dx), dw, acc[g]);
      acc[g] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(sb + 16))), dx, acc[g]);
    }
  }
  for (int g = 0; g < G; ++g) out[g] = acc[g];
}

int main() {
  // SmolLM2's linears: per layer QKV 960 x 576, O 576 x 576, gate and up 3072 x 576, down 576 x 1536.
  struct M { int64_t n, k; };
  std::vector<M> shapes;
  for (int l = 0; l < 30; ++l) { shapes.push_back({960, 576}); shapes.push_back({576, 576}); shapes.push_back({3072, 576}); shapes.push_back({576, 1536}); }
  int64_t total_q = 0, total_s = 0;
  for (auto& m : shapes) { total_q += m.n / 16 * (m.k / 32) * qbytes; total_s += m.n / 16 * (m.k / 32) * sbytes * 2; }
  auto* qs = (uint8_t*)aligned_alloc(4096, total_q);
  auto* sc = (uint16_t*)aligned_alloc(4096, total_s);
  madvise(qs, total_q, MADV_HUGEPAGE); madvise(sc, total_s, MADV_HUGEPAGE);
  for (int64_t i = 0; i < total_q; ++i) qs[i] = (uint8_t)(i * 2654435761u >> 13);
  for (int64_t i = 0; i < total_s / 2; ++i) sc[i] = 0x3c00;
  std::vector<int8_t> xq(1536); std::vector<float> xd(48, 1.f);
  for (auto& v : xq) v = 3;
  std::vector<float> y(4096 * 16);
  const double bytes = double(total_q + total_s);
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    std::vector<double> res[3];
    for (int round = 0; round < 15; ++round) {
      for (int variant = 0; variant < 3; ++variant) {
        auto t0 = std::chrono::steady_clock::now();
        int64_t qo = 0, so = 0;
        if (variant == 2) {
          double s = 0;
#pragma omp parallel for reduction(+ : s)
          for (int64_t i = 0; i < total_q / 64; ++i) s += _mm512_reduce_add_epi32(_mm512_load_si512(qs + 64 * i));
          y[0] = s;
        } else {
          for (auto& m : shapes) {
            const int64_t groups = m.n / 16, nb = m.k / 32, sets = groups / G;
            const uint8_t* q = qs + qo; const uint16_t* s = sc + so / 2;
#pragma omp parallel for schedule(static)
            for (int64_t set = 0; set < sets; ++set) {
              __m512 o[G];
              const uint8_t* qset = q + set * G * nb * qbytes; const uint16_t* sset = s + set * G * nb * sbytes;
              if (variant == 0) set_dot<false>(qset, sset, nb, xq.data(), xd.data(), kGroupsAhead, o);
              else set_dot<true>(qset, sset, nb, xq.data(), xd.data(), kStreamAhead, o);
              for (int g = 0; g < G; ++g) _mm512_storeu_ps(&y[(set * G + g) % 4096 * 16], o[g]);
            }
            qo += groups * nb * qbytes; so += groups * nb * sbytes * 2;
          }
        }
        double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        res[variant].push_back((variant == 2 ? double(total_q) : bytes) / dt / 1e9);
      }
    }
    for (auto& r : res) std::sort(r.begin(), r.end());
    printf("threads %d: groups %.1f GB/s, one stream %.1f GB/s, plain read %.1f GB/s (medians of 15)\n", threads,
           res[0][7], res[1][7], res[2][7]);
  }
}
