// Attention for a few query rows against a KV cache, on the CPU: out = softmax(q k^T * scale) v.
//
// q (B, H, M, D), k (B, KV, T, D), v (B, KV, T, Dv); head h reads kv head h / (H / KV) (GQA). k and v
// share a dtype; q may have another (fp32 queries over an fp16 cache): all are read as fp32, exactly.
// Causal: query row m sees keys t < T - M + m + 1 (the new rows are the last M positions); with a
// window W as well, only the last W of those (a sliding-window layer: t > T - M + m - W).
// Tree (`visible` set): row m sees keys t < T - M and tail key T - M + j iff bit j of visible[m]
// (its ancestors and itself): its softmax, sum and value FMAs run over exactly those keys in
// order, so a tree row equals a one-row step over the cache holding the prefix and its path.
// All query rows of one kv head (H/KV heads x M rows) share each read of a key and value row.
//
// Sinks (gpt-oss): one logit per query head with no value row, in each row's max and, last, in its sum.
//
// Exactness rule, as for the matmul: a row's result depends only on its own query and the keys it
// sees, through the same sequence of operations whatever M, so a verify pass gives bit-identical
// rows to one-token steps.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "scalar_math.h"
#include "simd.h"

namespace mlxspec {

enum class DType : int { f32 = 0, f16 = 1, bf16 = 2 };

struct SdpaProblem {
  const void *q, *k, *v;  // element pointers (offsets applied)
  DType dtype;            // of q, k and v
  int64_t qs[4], ks[4], vs[4];  // element strides; the last must be 1
  int B, H, KV, M, T, D, Dv;
  float scale;
  bool causal;
  float* out;  // (B, H, M, Dv) fp32
  // Optional second segment: key/value rows t >= split come from k2/v2 (row t - split), e.g. a
  // step's new rows not yet written into the cache (fused_layer.cpp). Same values, same arithmetic.
  int split = 1 << 30;
  const void *k2 = nullptr, *v2 = nullptr;
  int64_t k2s[4] = {0, 0, 0, 0}, v2s[4] = {0, 0, 0, 0};
  const uint64_t* visible = nullptr;  // (M,) tree rows' visible tail keys (M <= 64), or causal/full
  int qdtype = -1;  // q's DType where it differs from k's and v's (fp32 queries over an fp16 cache), else -1
  int window = 0;   // causal rows see at most this many keys, their last ones (0: all)
  const float* sinks = nullptr;  // (H,) a logit per query head joining every row's softmax, or none
  float softcap = 0;  // > 0: each score s becomes softcap * tanh(s / softcap) (Gemma 2), else as is
};

// Does query row m (of M) see key t? (every row sees the keys before the tail)
inline bool sees(const SdpaProblem& p, int m, int t) {
  const int tail = p.T - p.M;
  return t < tail || ((p.visible[m] >> (t - tail)) & 1u);
}

inline float to_float(const void* p, int64_t i, DType t) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    default: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
}

// One row of n elements starting at element index i -> fp32 (f32 rows are used in place).
inline const float* row_f32(const void* base, int64_t i, int n, DType t, float* buf) {
  if (t == DType::f32) return static_cast<const float*>(base) + i;
  load_floats(base, size_t(i), n, t == DType::f16 ? SType::f16 : SType::bf16, buf);
  return buf;
}

// Key (or value) row t of kv head (b, g) as fp32, from whichever segment holds it.
inline const float* kv_row(const SdpaProblem& p, bool value, int b, int g, int t, int n, float* buf) {
  if (t >= p.split) {
    const int64_t* s = value ? p.v2s : p.k2s;
    return row_f32(value ? p.v2 : p.k2, b * s[0] + g * s[1] + int64_t(t - p.split) * s[2], n, p.dtype, buf);
  }
  const int64_t* s = value ? p.vs : p.ks;
  return row_f32(value ? p.v : p.k, b * s[0] + g * s[1] + int64_t(t) * s[2], n, p.dtype, buf);
}

// Hints to load key (or value) rows [t0, t1) of kv head (b, g) soon, a cache line at a time: the
// kernel reads rows in blocks and lane slices, which the hardware prefetchers follow badly (one
// thread streamed a long cache at ~3.5 GB/s without these). No effect on results.
inline void prefetch_kv_rows(const SdpaProblem& p, bool value, int b, int g, int t0, int t1) {
  const int64_t* s = value ? p.vs : p.ks;
  const int n = value ? p.Dv : p.D, size = p.dtype == DType::f32 ? 4 : 2;
  const char* base = static_cast<const char*>(value ? p.v : p.k);
  for (int t = t0; t < std::min(t1, std::min(p.T, p.split)); ++t) {
    const char* row = base + (b * s[0] + g * s[1] + int64_t(t) * s[2]) * size;
    for (int i = 0; i < n * size; i += 64) prefetch(row + i);
  }
}

constexpr int kKeys = 16;  // keys per score block (one vector of 16 scores)

#if defined(__AVX512F__)
// 16 rows of 16 floats -> 16 columns, in registers (the usual unpack / shuffle / lane-exchange steps).
inline void transpose16(const float* const* rows, int d0, float* out) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(rows[i] + d0);
  for (int i = 0; i < 16; i += 2) t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88), t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88), t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i)
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88), r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(out + i * kKeys, r[i]);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
// 8 rows of 8 floats (rows[i] + d0) -> 8 columns: out[j * kKeys + i] = rows[i][d0 + j].
inline void transpose8(const float* const* rows, int d0, float* out) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows[i] + d0);
  for (int i = 0; i < 8; i += 2) t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(out + i * kKeys, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(out + (i + 4) * kKeys, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}
#endif

// Key rows (nk of them, D floats each) -> kt (D, 16): kt[d][l] = rows[l][d], zero past nk. Only
// moves values: the arithmetic that follows is the same whichever way they were moved.
template <class I>
inline void transpose_keys(const float* const* rows, int nk, int D, float* kt) {
#if defined(__AVX512F__)
  if constexpr (std::is_same<I, Avx512Isa>::value) {
    if (nk == kKeys && D % 16 == 0) {
      for (int d0 = 0; d0 < D; d0 += 16) transpose16(rows, d0, kt + size_t(d0) * kKeys);
      return;
    }
  }
#endif
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same<I, Avx2Isa>::value) {
    if (nk == kKeys && D % 8 == 0) {  // two 8x8 blocks per 8 dims: keys 0-7, then 8-15
      for (int d0 = 0; d0 < D; d0 += 8) {
        transpose8(rows, d0, kt + size_t(d0) * kKeys);
        transpose8(rows + 8, d0, kt + size_t(d0) * kKeys + 8);
      }
      return;
    }
  }
#endif
  std::fill(kt, kt + size_t(D) * kKeys, 0.0f);
  for (int l = 0; l < nk; ++l)
    for (int d = 0; d < D; ++d) kt[d * kKeys + l] = rows[l][d];
}
constexpr int kRowBlock = 4;  // query rows sharing each key/value load
constexpr int kValueChunk = 64;  // keys whose value rows one pass over the lanes keeps in L1

// scores[r][t] = (q_r . k_t) * scale for t in [t0, t0 + nk), rows rb..rb+RB: kt is the key block
// transposed (D, 16), so each score is one lane of a 16-wide FMA chain over d = 0..D-1.
template <class I, int RB>
inline void score_block(const float* q, int D, const float* kt, int nk, float scale, float* const* out) {
  using V = typename I::V;
  V s[RB];
  for (int r = 0; r < RB; ++r) s[r] = I::zero();
  for (int d = 0; d < D; ++d) {
    V k = I::load(kt + d * kKeys);
    for (int r = 0; r < RB; ++r) s[r] = I::fma(I::set1(q[r * D + d]), k, s[r]);
  }
  alignas(64) float tmp[kKeys];
  for (int r = 0; r < RB; ++r) {
    I::store(tmp, s[r]);
    for (int l = 0; l < nk; ++l) out[r][l] = tmp[l] * scale;
  }
}

// acc[r][0..16) += sum over t in [t0, t1) of p[r][t] * v[t][0..16), in key order. v: fp32, or fp16 /
// bf16 (T = uint16_t, st says which) converted 16 at a time as they are read (exact conversions).
template <class I, int RB, class T = float>
inline void value_block(const float* const* p, const T* v, int64_t v_stride, int t0, int t1, float* const* acc,
                        SType st = SType::f32) {
  using V = typename I::V;
  V a[RB];
  alignas(64) float row[16];
  for (int r = 0; r < RB; ++r) a[r] = I::load(acc[r]);
  for (int t = t0; t < t1; ++t) {
    V vr;
    if constexpr (std::is_same<T, float>::value) {
      vr = I::load(v + (t - t0) * v_stride);
    } else {
      load_floats(v + (t - t0) * v_stride, 0, 16, st, row);
      vr = I::load(row);
    }
    for (int r = 0; r < RB; ++r) a[r] = I::fma(I::set1(p[r][t]), vr, a[r]);
  }
  for (int r = 0; r < RB; ++r) I::store(acc[r], a[r]);
}

// f(std::integral_constant<int, n>) for a row block of n = 1..kRowBlock rows (a block is never
// padded with empty rows: their FMAs were a quarter of a one-token step's attention).
template <class F>
inline void with_row_block(int n, F&& f) {
  switch (n) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    default: return f(std::integral_constant<int, kRowBlock>{});
  }
}

// Rows [r0, r1) of kv head (b, g); row r is query head g * (H/KV) + r / M, query row r % M.
template <class I>
void sdpa_rows(const SdpaProblem& p, int b, int g, int r0, int r1) {
  const int rep = p.H / p.KV, rows = r1 - r0;
  const int D = p.D, Dv16 = (p.Dv + 15) / 16 * 16;
  // scratch per thread, reused across calls (a decoding step calls this ~100 times)
  thread_local std::vector<float> q, scores, acc, kt, vrows, buf, keybuf;
  thread_local std::vector<int> seen, first, row_m;
  thread_local std::vector<float> compact, row_max;
  q.assign(size_t(rows) * D, 0.0f), scores.assign(size_t(rows) * p.T, 0.0f), acc.assign(size_t(rows) * Dv16, 0.0f);
  kt.resize(size_t(D) * kKeys), buf.resize(std::max(D, p.Dv)), keybuf.resize(size_t(kKeys) * D);
  seen.assign(rows, 0);  // keys each row attends to: [first, seen)
  first.assign(rows, 0);
  row_m.assign(rows, 0);
  row_max.assign(rows, 0.0f);
  for (int r = 0; r < rows; ++r) {
    int h = g * rep + (r0 + r) / p.M, m = (r0 + r) % p.M;
    int64_t qi = b * p.qs[0] + h * p.qs[1] + m * p.qs[2];
    for (int d = 0; d < D; ++d) q[size_t(r) * D + d] = to_float(p.q, qi + d, p.qdtype < 0 ? p.dtype : DType(p.qdtype));
    seen[r] = p.causal ? p.T - p.M + m + 1 : p.T;
    if (p.visible) seen[r] = p.T - p.M + (p.visible[m] ? 64 - __builtin_clzll(p.visible[m]) : 0);  // last seen + 1
    if (p.window > 0) first[r] = std::max(0, seen[r] - p.window);
    row_m[r] = m;
  }
  const int t_end = *std::max_element(seen.begin(), seen.end());
  // Keys before every row's first (a window's, over a compiled step's whole buffer) are never read: start at
  // the block holding the earliest first key (blocks keep their places, so each score is computed as before)
  const int t_begin = p.visible ? 0 : *std::min_element(first.begin(), first.end()) / kKeys * kKeys;
  for (int t0 = t_begin; t0 < t_end; t0 += kKeys) {  // scores: each key block read and transposed once
    int nk = std::min(kKeys, t_end - t0);
    prefetch_kv_rows(p, false, b, g, t0 + 2 * kKeys, t0 + 3 * kKeys);
    const float* rows_in[kKeys];
    for (int l = 0; l < nk; ++l) rows_in[l] = kv_row(p, false, b, g, t0 + l, D, keybuf.data() + size_t(l) * D);
    transpose_keys<I>(rows_in, nk, D, kt.data());
    for (int r = 0; r < rows; r += kRowBlock)
      with_row_block(std::min(kRowBlock, rows - r), [&](auto rb) {
        constexpr int RB = decltype(rb)::value;
        float* out[RB];
        for (int i = 0; i < RB; ++i) out[i] = scores.data() + size_t(r + i) * p.T + t0;
        score_block<I, RB>(q.data() + size_t(r) * D, D, kt.data(), nk, p.scale, out);
      });
  }
  if (p.softcap > 0)  // elementwise, before each row's max: a row's scores do not depend on the others
    for (int r = 0; r < rows; ++r)
      for (int t = t_begin; t < t_end; ++t) {
        float& s = scores[size_t(r) * p.T + t];
        s = p.softcap * std::tanh(s / p.softcap);
      }
  for (int r = 0; r < rows; ++r) {  // softmax numerators; scores past a row's keys become 0
    float* s = scores.data() + size_t(r) * p.T;
    float mx = p.sinks ? p.sinks[g * rep + (r0 + r) / p.M] : -INFINITY;
    if (p.visible) {  // a tree row: keys it does not see score 0 and are skipped below
      for (int t = 0; t < seen[r]; ++t)
        if (sees(p, row_m[r], t)) mx = std::max(mx, s[t]);
      for (int t = 0; t < seen[r]; ++t) s[t] = sees(p, row_m[r], t) ? exp_nonpositive(s[t] - mx) : 0.0f;
    } else {  // over the row's own keys, from its first: as a one-row call over exactly those keys
      mx = max_span(s + first[r], seen[r] - first[r], mx);
      exp_shifted_span(s + first[r], mx, seen[r] - first[r]);
    }
    row_max[r] = mx;
    for (int t = 0; t < first[r]; ++t) s[t] = 0.0f;
    for (int t = seen[r]; t < t_end; ++t) s[t] = 0.0f;
  }
  // Value rows in fp32, padded to 16 lanes: each segment's own rows where they already are (a
  // multiple of 16 wide, contiguous; fp16/bf16 converted as they are read), else a copy. Same
  // values, same order of FMAs either way.
  const bool direct = p.Dv == Dv16 && p.vs[3] == 1 && (t_end <= p.split || p.v2s[3] == 1);
  if (!direct) {
    vrows.assign(size_t(t_end) * Dv16, 0.0f);
    for (int t = 0; t < t_end; ++t) {
      const float* vr = kv_row(p, true, b, g, t, p.Dv, buf.data());
      std::copy(vr, vr + p.Dv, vrows.data() + size_t(t) * Dv16);
    }
  }
  // acc rows += p rows . value rows [t0, t1), lanes [d0, d0 + 16): segment by segment, in key order
  auto values = [&](auto rb, const float* const* pr, int t0, int t1, int d0, float* const* ac) {
    constexpr int RB = decltype(rb)::value;
    if (!direct) return value_block<I, RB>(pr, vrows.data() + size_t(t0) * Dv16 + d0, Dv16, t0, t1, ac);
    const int mid = std::min(std::max(t0, p.split), t1);
    auto segment = [&](const void* v, const int64_t* s, int row0, int n0, int n1) {  // rows [n0, n1), row0 first
      const int64_t i = b * s[0] + g * s[1] + int64_t(row0) * s[2] + d0;
      if (p.dtype == DType::f32) return value_block<I, RB>(pr, static_cast<const float*>(v) + i, s[2], n0, n1, ac);
      value_block<I, RB>(pr, static_cast<const uint16_t*>(v) + i, s[2], n0, n1, ac,
                         p.dtype == DType::f16 ? SType::f16 : SType::bf16);
    };
    if (mid > t0) segment(p.v, p.vs, t0, t0, mid);
    if (t1 > mid) segment(p.v2, p.v2s, mid - p.split, mid, t1);
  };
  for (int r = 0; r < rows; r += kRowBlock) with_row_block(std::min(kRowBlock, rows - r), [&](auto rb) {
    constexpr int RB = decltype(rb)::value;
    const float* pr[RB];
    for (int i = 0; i < RB; ++i) pr[i] = scores.data() + size_t(r + i) * p.T;
    // Keys every row of the block sees, then the causal tail one row at a time (each row's own
    // sequence of FMAs over its keys, whatever rows share its block).
    int common = p.T;
    for (int i = 0; i < RB; ++i) common = std::min(common, seen[r + i]);
    common = std::min(common, t_end);
    if (p.visible) common = std::min(common, p.T - p.M);  // the tail: each row its own keys, one at a time
    if (p.window > 0) common = 0;  // windows start at each row's own key: every row alone, in key order
    // Keys the whole block sees, kValueChunk at a time with every lane block of the chunk before the
    // next chunk: its value rows are read from memory once and then from L1 (lane block by lane block
    // over all keys re-streamed the cache from memory at long context: 4x slower). Each lane's FMAs
    // still run over the keys in order.
    for (int c0 = 0; c0 < common; c0 += kValueChunk)
      for (int d0 = 0; d0 < Dv16; d0 += 16) {
        const int ahead = c0 + kValueChunk + d0 / 16 * (kValueChunk * 16 / Dv16);  // the next chunk's rows, spread
        if (direct) prefetch_kv_rows(p, true, b, g, ahead, std::min(common, ahead + kValueChunk * 16 / Dv16));
        float* ac[RB];
        for (int i = 0; i < RB; ++i) ac[i] = acc.data() + size_t(r + i) * Dv16 + d0;
        values(rb, pr, c0, std::min(common, c0 + kValueChunk), d0, ac);
      }
    for (int d0 = 0; d0 < Dv16; d0 += 16) {
      float* ac[RB];
      for (int i = 0; i < RB; ++i) ac[i] = acc.data() + size_t(r + i) * Dv16 + d0;
      for (int i = 0; i < RB; ++i) {
        if (!p.visible) {
          values(std::integral_constant<int, 1>{}, pr + i, std::max(common, first[r + i]), seen[r + i], d0, ac + i);
          continue;
        }
        for (int t = common; t < seen[r + i]; ++t)
          if (sees(p, row_m[r + i], t)) values(std::integral_constant<int, 1>{}, pr + i, t, t + 1, d0, ac + i);
      }
    }
  });
  for (int r = 0; r < rows; ++r) {
    int h = g * rep + (r0 + r) / p.M, m = (r0 + r) % p.M;
    const float* s = scores.data() + size_t(r) * p.T;
    float total;
    if (p.visible) {  // the sum over the row's own keys, packed in order as a one-row step holds them
      compact.clear();
      for (int t = 0; t < seen[r]; ++t)
        if (sees(p, m, t)) compact.push_back(s[t]);
      total = sum16(compact.data(), int(compact.size()));
    } else {
      total = sum16(s + first[r], seen[r] - first[r]);
    }
    if (p.sinks) total += exp_nonpositive(p.sinks[h] - row_max[r]);  // the sink's share of the sum, last
    float* o = p.out + ((size_t(b) * p.H + h) * p.M + m) * p.Dv;
    for (int d = 0; d < p.Dv; ++d) o[d] = acc[size_t(r) * Dv16 + d] / total;
  }
}

inline void sdpa_rows(Isa isa, const SdpaProblem& p, int b, int g, int r0, int r1) {
#if defined(__ARM_NEON) && defined(__aarch64__)
  if (isa == Isa::neon) return sdpa_rows<NeonIsa>(p, b, g, r0, r1);
#endif
#if defined(__AVX512F__)
  if (isa == Isa::avx512) return sdpa_rows<Avx512Isa>(p, b, g, r0, r1);
#endif
#if defined(__AVX2__) && defined(__FMA__)
  if (isa == Isa::avx2) return sdpa_rows<Avx2Isa>(p, b, g, r0, r1);
#endif
  sdpa_rows<GenericIsa>(p, b, g, r0, r1);
}

}  // namespace mlxspec
