// The floor of a decode step's attention: how fast this CPU reads a batch's KV out of a paged pool, in the two
// orders a kernel can take, with no arithmetic but the loads.
//
//     g++ -O2 -march=native -fopenmp benchmarks/kv_read.cpp -o /tmp/kv_read && /tmp/kv_read
//
// The pool is cpu_paged's: per layer, K and V as [blocks][16 tokens][3 KV heads][64] bfloat16 (6 KB a block),
// 64 sequences of 200-400 tokens on blocks shuffled over 11,651 (as a busy cache leaves them), 30 layers so the
// KV comes from memory. Each thread takes whole sequences, 32 keys a step:
// - "per head": a head's K rows of the step, then its V rows, head after head (stride: 3 heads x 128 bytes);
// - "memory order": each block's K then its V front to back, with the first 4 lines of the next block asked for
//   ahead (prefetcht0), which starts the L2 streamer on it.
// On the Xeon with AMX of 2026-12-03 (2 cores): per head 14.4-14.8 GB/s, memory order 21.0-21.4 GB/s (stream
// read, cpu_floor.cpp: 20.5); cpu_paged's decode rows read 11.6 there (attention_kernels.py --layers 30).
//
// Three more orders (issue 35 item 2), each asking for the next block ahead while reading the current one:
// - "per head, every line asked for": every line of the next block, in memory order (prefetcht1), as cpu_paged's
//   decode path asks for each line it will read. Each request holds one of the core's few line-fill buffers for a
//   whole memory round trip, and the L2 streamer is left nothing to do.
// - "per head, 4-line kick": only the next block's first 4 lines (prefetcht0); the streamer fetches the rest.
// - "head-major blocks": the same pool laid out [blocks][3 KV heads][16 tokens][64], so a head's rows of a block
//   are one 2 KB run; read head by head with 2 lines of each run kicked.
// One core of the AMX Xeon, 2026-12-05 (OMP_NUM_THREADS=1, four runs): per head 7.3-7.7 GB/s, memory order 11.2-11.9,
// every line asked for 7.0-7.2, 4-line kick 11.4-11.7, head-major blocks 12.1-12.9. Without compute, kicks read as
// fast as memory order; inside cpu_paged's decode loop (compute between the loads) kicks ran 1.3-1.7x slower than
// asking for every line (docs/performance.md, "Decode attention on AMX").
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

namespace {

constexpr int kBlock = 16, kHeads = 3, kDim = 64, kLayers = 30, kSeqs = 64, kPoolBlocks = 11651;
constexpr int64_t kBlockElems = kBlock * kHeads * kDim;

struct Batch {
  std::vector<uint16_t*> k, v;  // per layer
  std::vector<int> lens;
  std::vector<std::vector<int>> tables;
  int64_t bytes = 0;  // K and V bytes of one layer
};

Batch make_batch() {
  Batch b;
  std::mt19937 rng(0);
  for (int l = 0; l < kLayers; ++l)
    for (auto* pool : {&b.k, &b.v}) {
      auto* p = static_cast<uint16_t*>(std::aligned_alloc(64, kPoolBlocks * kBlockElems * 2));
      std::fill(p, p + kPoolBlocks * kBlockElems, uint16_t{0x3f80});
      pool->push_back(p);
    }
  std::vector<int> order(kPoolBlocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  int next = 0;
  for (int s = 0; s < kSeqs; ++s) {
    b.lens.push_back(200 + static_cast<int>(rng() % 200));
    b.tables.emplace_back();
    for (int i = 0; i < (b.lens[s] + kBlock - 1) / kBlock; ++i) b.tables[s].push_back(order[next++]);
    b.bytes += int64_t{b.lens[s]} * kHeads * kDim * 2 * 2;
  }
  return b;
}

inline __m512 add_line(__m512 acc, const uint16_t* p) {
  return _mm512_add_ps(acc, _mm512_castsi512_ps(_mm512_loadu_si512(p)));
}

float per_head(const uint16_t* k, const uint16_t* v, const std::vector<int>& table, int len) {
  __m512 acc = _mm512_setzero_ps();
  auto row = [&](int pos, int h) { return (int64_t{table[pos / kBlock]} * kBlock + pos % kBlock) * kHeads * kDim + h * kDim; };
  for (int k0 = 0; k0 < len; k0 += 32)
    for (int h = 0; h < kHeads; ++h) {
      const int n = std::min(32, len - k0);
      for (int j = 0; j < n; ++j) acc = add_line(add_line(acc, k + row(k0 + j, h)), k + row(k0 + j, h) + 32);
      for (int j = 0; j < n; ++j) acc = add_line(add_line(acc, v + row(k0 + j, h)), v + row(k0 + j, h) + 32);
    }
  return _mm512_reduce_add_ps(acc);
}

float memory_order(const uint16_t* k, const uint16_t* v, const std::vector<int>& table, int len) {
  __m512 acc = _mm512_setzero_ps();
  for (int b = 0; b * kBlock < len; ++b) {
    const int64_t elems = int64_t{std::min(kBlock, len - b * kBlock)} * kHeads * kDim;
    if ((b + 1) * kBlock < len)
      for (int i = 0; i < 4; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(k + int64_t{table[b + 1]} * kBlockElems) + 64 * i, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(v + int64_t{table[b + 1]} * kBlockElems) + 64 * i, _MM_HINT_T0);
      }
    const uint16_t* kb = k + int64_t{table[b]} * kBlockElems;
    const uint16_t* vb = v + int64_t{table[b]} * kBlockElems;
    for (int64_t i = 0; i < elems; i += 32) acc = add_line(acc, kb + i);
    for (int64_t i = 0; i < elems; i += 32) acc = add_line(acc, vb + i);
  }
  return _mm512_reduce_add_ps(acc);
}

inline void prefetch_t1(const void* p) { asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p))); }

// Per head reads of each block (as per_head, a block at a time) with the next block asked for by `ask`.
template <typename Ask>
float per_head_asking(const uint16_t* k, const uint16_t* v, const std::vector<int>& table, int len, Ask ask,
                      bool head_major = false) {
  __m512 acc = _mm512_setzero_ps();
  const int blocks = (len + kBlock - 1) / kBlock;
  auto row = [&](int j, int h) { return head_major ? (h * kBlock + j) * kDim : (j * kHeads + h) * kDim; };
  for (int b = 0; b < blocks; ++b) {
    if (b + 1 < blocks) {
      ask(reinterpret_cast<const char*>(k + int64_t{table[b + 1]} * kBlockElems));
      ask(reinterpret_cast<const char*>(v + int64_t{table[b + 1]} * kBlockElems));
    }
    const int n = std::min(kBlock, len - b * kBlock);
    const uint16_t* kb = k + int64_t{table[b]} * kBlockElems;
    const uint16_t* vb = v + int64_t{table[b]} * kBlockElems;
    for (int h = 0; h < kHeads; ++h) {
      for (int j = 0; j < n; ++j) acc = add_line(add_line(acc, kb + row(j, h)), kb + row(j, h) + 32);
      for (int j = 0; j < n; ++j) acc = add_line(add_line(acc, vb + row(j, h)), vb + row(j, h) + 32);
    }
  }
  return _mm512_reduce_add_ps(acc);
}

float every_line(const uint16_t* k, const uint16_t* v, const std::vector<int>& table, int len) {
  return per_head_asking(k, v, table, len, [](const char* block) {
    for (int64_t i = 0; i < kBlockElems * 2; i += 64) prefetch_t1(block + i);
  });
}

float kick(const uint16_t* k, const uint16_t* v, const std::vector<int>& table, int len) {
  return per_head_asking(k, v, table, len, [](const char* block) {
    for (int i = 0; i < 4; ++i) _mm_prefetch(block + 64 * i, _MM_HINT_T0);
  });
}

float head_major(const uint16_t* k, const uint16_t* v, const std::vector<int>& table, int len) {
  return per_head_asking(k, v, table, len, [](const char* block) {
    for (int h = 0; h < kHeads; ++h)
      for (int i = 0; i < 2; ++i) prefetch_t1(block + h * kBlock * kDim * 2 + 64 * i);
  }, true);
}

template <typename Read>
double gigabytes_per_second(const Batch& b, Read read) {
  double best = 1e30;
  volatile float sink = 0;
  for (int pass = 0; pass < 7; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    for (int l = 0; l < kLayers; ++l) {
      float total = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : total)
      for (int s = 0; s < kSeqs; ++s) total += read(b.k[l], b.v[l], b.tables[s], b.lens[s]);
      sink = sink + total;
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return b.bytes * kLayers / best / 1e9;
}

}  // namespace

int main() {
  const Batch b = make_batch();
  std::printf("threads: %d; %d sequences, %.1f MB of KV a layer, %d layers\n", omp_get_max_threads(), kSeqs,
              b.bytes / 1e6, kLayers);
  for (int round = 0; round < 3; ++round)  // alternating: one order's passes never all fall in a quiet minute
    std::printf("per head %.1f GB/s, memory order %.1f GB/s; per head with every line asked for %.1f, with a "
                "4-line kick %.1f; head-major blocks %.1f\n", gigabytes_per_second(b, per_head),
                gigabytes_per_second(b, memory_order), gigabytes_per_second(b, every_line),
                gigabytes_per_second(b, kick), gigabytes_per_second(b, head_major));
}
