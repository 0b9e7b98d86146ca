// The tile unit's side of the AMX flash prefill kernel (amx_prefill.h): its sizes and buffers, the products S^T =
// K Q^T (scores) and O^T += V^T P^T (values), O^T's moves between tiles and memory, and the pieces of tile work a
// softmax loop interleaves with its vector instructions (tile_piece). FlashSoftmax and FlashPrefill build on it.
#pragma once

#include "amx_flash_layout.h"
#include "amx_tiles.h"
#include "common.h"

#include <vector>

#if FRAME_PAGED_AMX
namespace frame_cpu_paged::amx {

// The flash kernel's buffers and tile operations.
template <int D>
class FlashTiles {
 public:
  using bf16 = c10::BFloat16;
  static constexpr int kKeys = 32;               // keys per sub-step: one P^T tile's depth
  // Sub-steps per step. Each row block's O^T goes between memory and the tiles once a step, and that swap (four
  // tile stores after the products, four loads) had cost a sixth of the kernel at 4 sub-steps: 16 ran 1.08x
  // faster, though the step's K and V^T (64 KB each) now stream from L2.
  static constexpr int kSubs = D == 64 ? 16 : 4;
  static constexpr int kStep = kKeys * kSubs;    // keys per step: V^T transposed once for every row block
  static constexpr bool kResident = D == 64;     // O^T stays in tiles 0-3 for a whole step (D = 128 needs 8)
  static constexpr float kLazy = 8.0f;           // log2 of how far a score may exceed its row's reference maximum
  // Floats between row blocks' O^T: 256 bytes over its size, so that one block's O^T does not lie a multiple of
  // 4 KB from the next's (the tiles' loads of the next block's O^T waited on the stores of the last block's, at
  // the same 12 low address bits; 1.05-1.1x).
  static constexpr int64_t kAccStride = D * 16 + 64;

  explicit FlashTiles(const Problem<bf16, bf16>& p) : p_(p), kc_(kStep * D), vt_(kSubs * D * kKeys, 0) {}

 protected:
  // A sub-step's P^T . V not yet added to O^T.
  struct Pending {
    const uint32_t* pt = nullptr;
    const uint16_t* vt = nullptr;
    bool last = false;  // the row block's last sub-step (stream)
  };

  // Tile work spread over a softmax (D = 64): the next sub-step's scores (k_tiles null: none) and the pending
  // P^T . V, in pieces the vector loop issues between its own instructions, so that the reorder buffer always
  // holds both kinds: issued whole before or after the softmax, the tiles' instructions sat at its head waiting
  // on each other while the vectors' filled it, and the two units took turns (spread: 1.04x).
  struct TileWork {
    const uint32_t* qt;
    const bf16* const* k_tiles;
    int n;
    float* s;
    Pending* pending;
    float* out_acc;  // not null: after the product, tiles 0-3 go here and come from in_acc
    float* in_acc;
  };

  // Piece k (0-15) of `work`. Tiles as in step(): 4-5 the scores, 6 K, 7 Q^T; then 4 P^T, 5-7 V^T.
  static void tile_piece(int k, TileWork& work) {
    if (work.k_tiles != nullptr) {
      switch (k) {
        case 0:
          _tile_zero(4);
          _tile_zero(5);
          _tile_loadd(7, work.qt, 64);
          _tile_loadd(6, work.k_tiles[0], 64);
          _tile_dpbf16ps(4, 6, 7);
          break;
        case 2:
          if (work.n > 16) {
            _tile_loadd(6, work.k_tiles[1], 64);
            _tile_dpbf16ps(5, 6, 7);
          }
          break;
        case 4:
          _tile_loadd(7, work.qt + 256, 64);
          _tile_loadd(6, work.k_tiles[0] + 512, 64);
          _tile_dpbf16ps(4, 6, 7);
          break;
        case 6:
          if (work.n > 16) {
            _tile_loadd(6, work.k_tiles[1] + 512, 64);
            _tile_dpbf16ps(5, 6, 7);
          }
          break;
        case 8:
          _tile_stored(4, work.s, 64);
          _tile_stored(5, work.s + 16 * 16, 64);
          break;
        default:
          break;
      }
    }
    Pending& pending = *work.pending;
    if (pending.pt == nullptr) return;
    switch (k) {
      case 9:
        _tile_loadd(4, pending.pt, 64);
        _tile_loadd(5, pending.vt, kKeys * 2);
        _tile_dpbf16ps(0, 5, 4);
        break;
      case 11:
        _tile_loadd(6, pending.vt + 16 * kKeys, kKeys * 2);
        _tile_dpbf16ps(1, 6, 4);
        break;
      case 13:
        _tile_loadd(7, pending.vt + 32 * kKeys, kKeys * 2);
        _tile_dpbf16ps(2, 7, 4);
        break;
      case 15:
        _tile_loadd(5, pending.vt + 48 * kKeys, kKeys * 2);
        _tile_dpbf16ps(3, 5, 4);
        pending = {};
        if (work.out_acc != nullptr) {
          store_acc(work.out_acc);
          load_acc(work.in_acc);
        }
        break;
      default:
        break;
    }
  }

  float* acc_of(int64_t b) { return acc_.data() + b * kAccStride; }

  // Tiles 0-3 from / to 64 dims of O^T (tile numbers must be constants, hence no loop).
  static void load_acc(float* acc) {
    _tile_loadd(0, acc, 64);
    _tile_loadd(1, acc + 256, 64);
    _tile_loadd(2, acc + 512, 64);
    _tile_loadd(3, acc + 768, 64);
  }
  static void store_acc(float* acc) {
    _tile_stored(0, acc, 64);
    _tile_stored(1, acc + 256, 64);
    _tile_stored(2, acc + 512, 64);
    _tile_stored(3, acc + 768, 64);
  }

  // S^T [32 keys][16 rows] of row block b against n keys (k_tiles: their two 16-key tiles), into s.
  void scores(int64_t b, int n, const bf16* const* k_tiles, float* s) {
    const uint32_t* qt = qt_.data() + b * (D / 32) * 256;
    _tile_zero(4);
    _tile_zero(5);
    for (int c = 0; c < D / 32; ++c) {
      _tile_loadd(7, qt + c * 256, 64);
      _tile_loadd(6, k_tiles[0] + 512 * c, 64);
      _tile_dpbf16ps(4, 6, 7);
      if (n > 16) {
        _tile_loadd(6, k_tiles[1] + 512 * c, 64);
        _tile_dpbf16ps(5, 6, 7);
      }
    }
    _tile_stored(4, s, 64);
    _tile_stored(5, s + 16 * 16, 64);
  }

  // O^T += V^T . P^T of the pending sub-step (if any), four 16-dim tiles at a time, so the four products overlap.
  void values(Pending& pending, float* acc) {
    if (pending.pt == nullptr) return;
    const uint16_t* vt = pending.vt;
    _tile_loadd(4, pending.pt, 64);
    pending = {};
    if constexpr (kResident) {
      _tile_loadd(5, vt, kKeys * 2);
      _tile_loadd(6, vt + 16 * kKeys, kKeys * 2);
      _tile_loadd(7, vt + 32 * kKeys, kKeys * 2);
      _tile_dpbf16ps(0, 5, 4);
      _tile_dpbf16ps(1, 6, 4);
      _tile_dpbf16ps(2, 7, 4);
      _tile_loadd(5, vt + 48 * kKeys, kKeys * 2);
      _tile_dpbf16ps(3, 5, 4);
    } else {
      for (int v = 0; v < D / 16; v += 4) {
        load_acc(acc + v * 256);
        _tile_loadd(5, vt + v * 16 * kKeys, kKeys * 2);
        _tile_loadd(6, vt + (v + 1) * 16 * kKeys, kKeys * 2);
        _tile_loadd(7, vt + (v + 2) * 16 * kKeys, kKeys * 2);
        _tile_dpbf16ps(0, 5, 4);
        _tile_dpbf16ps(1, 6, 4);
        _tile_dpbf16ps(2, 7, 4);
        _tile_loadd(5, vt + (v + 3) * 16 * kKeys, kKeys * 2);
        _tile_dpbf16ps(3, 5, 4);
        store_acc(acc + v * 256);
      }
    }
  }

  const Problem<bf16, bf16>& p_;
  LineVector<uint16_t> kc_;                  // K of the step, compact (copy_keys)
  LineVector<uint16_t> vt_;                  // V^T of the step: [kSubs][D][kKeys] bfloat16
  LineVector<uint32_t> qt_;                  // Q^T pairs per row block: [blocks][D / 32][16][16]
  LineVector<float> acc_, max_, sum_;        // O^T per row block [blocks][D][16]; reference max and sum per row
  std::vector<int32_t> pos_;                 // each row's token position, -1 for padding rows
  std::vector<int32_t> last_;                // each row block's last token position
  std::vector<const char*> ahead_;          // the next step's lines to prefetch (prefetch_step)
  size_t sent_ = 0;                          // how many of them have gone out
  alignas(64) uint16_t zeros_[D] = {};
};

}  // namespace frame_cpu_paged::amx
#endif
