// Standalone check of the kernels' instruction-set paths, without MLX (tests/kernels/test_isa_paths.py):
// every ISA compiled for this target against the portable one, bit for bit, on the quantized
// matmul (4/8 bits, group sizes 32/64/128, f32/f16 scales, 1-5, 8 and 11 rows, odd column counts) and on the
// few-row attention (fp32, and fp16 against fp32 holding the same values), the int8-activation
// matmul (x quantized and multiplied by each ISA's path; rows of a many-row call against a 4-row call), and the vectorised exp / swiglu spans against their scalar loops; then a digest of the portable results, which must be the same on every
// machine (the arithmetic is fixed), so an arm64 build run under qemu is compared with this one.
//
//   g++ -O2 -std=c++17 -ffp-contract=off isa_check.cpp && ./a.out
//   -> "best=avx512 checked=... mismatches=0 digest=..."
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "pointwise_kernel.h"
#include "qmm_kernel.h"
#include "qmm_q8_kernel.h"
#include "sdpa_kernel.h"

using namespace mlxspec;

namespace {

uint32_t state = 12345;
uint32_t next() { return state = state * 1664525u + 1013904223u; }
float uniform() { return float(next() >> 8) / float(1 << 24) - 0.5f; }  // [-0.5, 0.5)

struct Digest {
  uint64_t h = 1469598103934665603ull;
  void add(const std::vector<float>& v) {
    for (float f : v) {
      uint32_t b;
      std::memcpy(&b, &f, 4);
      h = (h ^ b) * 1099511628211ull;
    }
  }
};

const Isa kIsas[] = {Isa::generic, Isa::avx512, Isa::avx2, Isa::neon};
const char* kNames[] = {"generic", "avx512", "avx2", "neon"};

std::vector<float> run_qmm(Isa isa, const QmmProblem& p) {
  std::vector<float> y(size_t(p.M) * p.N);
  run_columns(isa, p, 0, p.N, y.data());
  return y;
}

// The int8-activation matmul on one ISA: x quantized by that ISA's path, then its tiles.
std::vector<float> run_qmm_q8(Isa isa, QmmProblem p, const std::vector<float>& x) {
  std::vector<float> y(size_t(p.M) * p.N);
  Q8Buffer buf;
  quantize_rows(x.data(), p.K, p.M, p.K, p.bits, isa, buf);
  run_columns_q8(isa, p, buf.rows, 0, p.N, y.data());
  return y;
}

std::vector<float> run_sdpa(Isa isa, SdpaProblem p) {
  std::vector<float> out(size_t(p.B) * p.H * p.M * p.Dv);
  p.out = out.data();
  for (int g = 0; g < p.KV; ++g) sdpa_rows(isa, p, 0, g, 0, p.H / p.KV * p.M);
  return out;
}

}  // namespace

int main() {
  Digest digest;
  int checked = 0, mismatches = 0;
  auto compare = [&](const std::vector<float>& ref, const std::vector<float>& y, const char* what, Isa isa) {
    ++checked;
    if (std::memcmp(ref.data(), y.data(), ref.size() * sizeof(float)) != 0) {
      ++mismatches;
      std::printf("mismatch: %s on %s\n", what, kNames[int(isa)]);
    }
  };
  const int K = 256, N = 37;
  for (int bits : {4, 8})
    for (int G : {32, 64, 128})
      for (SType st : {SType::f32, SType::f16})
        for (int M : {1, 2, 3, 4, 5, 8, 11}) {  // every row-tile size of every ISA
          std::vector<uint8_t> w(size_t(N) * K * bits / 8);
          for (auto& b : w) b = uint8_t(next() >> 24);
          std::vector<float> sf(size_t(N) * K / G), bf(sf.size()), xr(size_t(M) * K), x(xr.size());
          std::vector<uint16_t> sh(sf.size()), bh(sf.size());
          for (size_t i = 0; i < sf.size(); ++i) {  // f16 values exactly representable in both types
            sh[i] = uint16_t(0x2000 + (next() >> 22)), bh[i] = uint16_t(0xa000 + (next() >> 22));
            sf[i] = half_to_float(sh[i]), bf[i] = half_to_float(bh[i]);
          }
          for (auto& v : xr) v = uniform();
          prepare_x(xr.data(), K, 1, M, K, bits, x.data(), [](float v) { return v; });
          const void* s = st == SType::f32 ? static_cast<const void*>(sf.data()) : sh.data();
          const void* b = st == SType::f32 ? static_cast<const void*>(bf.data()) : bh.data();
          QmmProblem p{x.data(), w.data(), s, b, st, M, N, K, G, bits};
          std::vector<float> ref = run_qmm(Isa::generic, p);
          digest.add(ref);
          for (Isa isa : kIsas)
            if (isa != Isa::generic && isa_compiled(isa)) compare(ref, run_qmm(isa, p), "qmm", isa);
        }
  // int8 activations: K with partial 128-chunks (96: 3 blocks, 160: 5, 576: 18), group sizes 32-128
  // and 96 (not a divisor of a chunk: the portable path on every ISA), 1-11 rows, f32/f16 scales
  struct KG { int K, G; };
  for (int bits : {4, 8})
    for (const KG& kg : {KG{256, 32}, KG{256, 64}, KG{256, 128}, KG{96, 32}, KG{160, 32}, KG{576, 64}, KG{192, 96}})
      for (SType st : {SType::f32, SType::f16})
        for (int M : {1, 2, 3, 4, 5, 8, 11}) {
          const int Kq = kg.K, G = kg.G;
          std::vector<uint8_t> w(size_t(N) * Kq * bits / 8);
          for (auto& b : w) b = uint8_t(next() >> 24);
          std::vector<float> sf(size_t(N) * Kq / G), bf(sf.size()), xr(size_t(M) * Kq);
          std::vector<uint16_t> sh(sf.size()), bh(sf.size());
          for (size_t i = 0; i < sf.size(); ++i) {
            sh[i] = uint16_t(0x2000 + (next() >> 22)), bh[i] = uint16_t(0xa000 + (next() >> 22));
            sf[i] = half_to_float(sh[i]), bf[i] = half_to_float(bh[i]);
          }
          for (auto& v : xr) v = uniform() * 3;
          xr[0] = 0.f;  // a block with a zero and (below) an all-zero block
          if (M > 1) std::fill(xr.begin() + Kq, xr.begin() + Kq + 32, 0.f);
          if (M == 3) {  // the int16 pairs' extremes: codes 0/255 in pairs times -127s, and a NaN (-> -127)
            for (size_t i = 0; i < w.size(); ++i) w[i] = (i / 2) % 2 ? 255 : 0;
            std::fill(xr.begin() + 2 * Kq, xr.end(), -1.f);
            xr[2 * Kq + 5] = std::nanf("");
          }
          const void* s = st == SType::f32 ? static_cast<const void*>(sf.data()) : sh.data();
          const void* b = st == SType::f32 ? static_cast<const void*>(bf.data()) : bh.data();
          QmmProblem p{nullptr, w.data(), s, b, st, M, N, Kq, G, bits};
          std::vector<float> ref = run_qmm_q8(Isa::generic, p, xr);
          digest.add(ref);
          for (Isa isa : kIsas)
            if (isa != Isa::generic && isa_compiled(isa)) compare(ref, run_qmm_q8(isa, p, xr), "qmm q8", isa);
          if (bits == 4 && G == 32) {  // the same codes read as mxfp4's e2m1 values (kE2m1), uint8 exponents
            std::vector<uint8_t> ex(sf.size());
            for (auto& e : ex) e = uint8_t(112 + next() % 16);
            ex[0] = 0;  // 2^-128: a subnormal scale
            QmmProblem pe = p;
            pe.e2m1 = true, pe.stype = SType::e8m0, pe.scales = pe.biases = ex.data();
            std::vector<float> ref_e = run_qmm_q8(Isa::generic, pe, xr);
            digest.add(ref_e);
            for (Isa isa : kIsas)
              if (isa != Isa::generic && isa_compiled(isa)) compare(ref_e, run_qmm_q8(isa, pe, xr), "qmm q8 e2m1", isa);
          }
          if (M == 11) {  // rows 3-6 alone give the rows of the 11-row call
            QmmProblem p4 = p;
            p4.M = 4;
            std::vector<float> x4(xr.begin() + 3 * Kq, xr.begin() + 7 * Kq), y4 = run_qmm_q8(best_isa(), p4, x4);
            std::vector<float> want(ref.begin() + 3 * N, ref.begin() + 7 * N);
            compare(want, y4, "qmm q8 rows", best_isa());
          }
        }
  struct Shape { int H, KV, M, T, D, Dv; };
  for (const Shape& sh : {Shape{4, 2, 3, 29, 32, 16}, Shape{9, 3, 1, 70, 64, 64}})  // the second: a SmolLM2 step
    for (bool causal : {false, true}) {
      const int H = sh.H, KV = sh.KV, M = sh.M, T = sh.T, D = sh.D, Dv = sh.Dv;
      std::vector<float> q(size_t(H) * M * D), k(size_t(KV) * T * D), v(size_t(KV) * T * Dv);
      for (auto* a : {&q, &k, &v})
        for (auto& f : *a) f = uniform() * 4;
      SdpaProblem p{q.data(), k.data(), v.data(), DType::f32, {H * M * D, M * D, D, 1}, {KV * T * D, T * D, D, 1},
                    {KV * T * Dv, T * Dv, Dv, 1}, 1, H, KV, M, T, D, Dv, 0.125f, causal, nullptr};
      std::vector<float> ref = run_sdpa(Isa::generic, p);
      digest.add(ref);
      for (Isa isa : kIsas)
        if (isa != Isa::generic && isa_compiled(isa)) compare(ref, run_sdpa(isa, p), "sdpa", isa);
      // fp16 q, k, v (converted as they are read) against fp32 ones holding the same values
      std::vector<uint16_t> qh(q.size()), kh(k.size()), vh(v.size());
      for (auto [a, h] : {std::pair{&q, &qh}, std::pair{&k, &kh}, std::pair{&v, &vh}})
        for (size_t i = 0; i < a->size(); ++i) (*h)[i] = float_to_half((*a)[i]), (*a)[i] = half_to_float((*h)[i]);
      std::vector<float> ref16 = run_sdpa(Isa::generic, p);
      SdpaProblem ph = p;
      ph.q = qh.data(), ph.k = kh.data(), ph.v = vh.data(), ph.dtype = DType::f16;
      for (Isa isa : kIsas)
        if (isa_compiled(isa)) compare(ref16, run_sdpa(isa, ph), "sdpa f16", isa);
      std::vector<float> sinks(H);  // gpt-oss's extra logit per head
      for (auto& f : sinks) f = uniform() * 4;
      SdpaProblem ps = p;
      ps.sinks = sinks.data();
      std::vector<float> refs = run_sdpa(Isa::generic, ps);
      digest.add(refs);
      for (Isa isa : kIsas)
        if (isa != Isa::generic && isa_compiled(isa)) compare(refs, run_sdpa(isa, ps), "sdpa sinks", isa);
    }
  {  // a sliding window (W = 5) over 6 causal rows: every ISA alike, and each row equal to a one-row
     // call over exactly its window's keys (its first key at index 0 there, at index m here)
    const int H = 4, KV = 2, M = 6, T = 14, D = 32, W = 5;
    std::vector<float> q(size_t(H) * M * D), k(size_t(KV) * T * D), v(size_t(KV) * T * D);
    for (auto* a : {&q, &k, &v})
      for (auto& f : *a) f = uniform() * 4;
    SdpaProblem p{q.data(), k.data(), v.data(), DType::f32, {H * M * D, M * D, D, 1}, {KV * T * D, T * D, D, 1},
                  {KV * T * D, T * D, D, 1}, 1, H, KV, M, T, D, D, 0.125f, true, nullptr};
    p.window = W;
    std::vector<float> ref = run_sdpa(Isa::generic, p);
    digest.add(ref);
    for (Isa isa : kIsas)
      if (isa != Isa::generic && isa_compiled(isa)) compare(ref, run_sdpa(isa, p), "sdpa window", isa);
    for (int m = 0; m < M; ++m) {
      SdpaProblem one = p;
      const int last = T - M + m;  // the row's own position
      one.q = q.data() + size_t(m) * D, one.M = 1, one.T = W;
      one.k = k.data() + size_t(last - W + 1) * D, one.v = v.data() + size_t(last - W + 1) * D;
      one.window = 0;
      std::vector<float> got = run_sdpa(best_isa(), one), want(size_t(H) * D);
      for (int h = 0; h < H; ++h)
        std::copy(ref.begin() + (size_t(h) * M + m) * D, ref.begin() + (size_t(h) * M + m + 1) * D, want.begin() + size_t(h) * D);
      compare(want, got, "sdpa window row", best_isa());
    }
  }
  {  // exp over softmax-like inputs and swiglu, span (vector bodies where compiled) vs scalar loops
    const int n = 1 << 16;
    std::vector<float> s(n), e(n), es(n), a(n), u(n), y(n), ys(n);
    for (int i = 0; i < n; ++i) s[i] = -90.0f * float(i) / n + uniform() * 1e-3f, a[i] = uniform() * 40, u[i] = uniform();
    s[0] = 0.0f, s[1] = -0.0f, s[2] = -87.0f, s[3] = -200.0f, a[0] = 0.0f, a[1] = -0.0f, a[2] = 95.0f, a[3] = -95.0f;
    e = s;
    exp_shifted_span(e.data(), 0.5f, n);
    for (int i = 0; i < n; ++i) es[i] = exp_nonpositive(s[i] - 0.5f);
    swiglu_span(a.data(), u.data(), y.data(), n);
    for (int i = 0; i < n; ++i) swiglu_span(a.data() + i, u.data() + i, ys.data() + i, 1);  // the scalar loop
    digest.add(es);
    digest.add(ys);
    compare(es, e, "exp span", best_isa());
    compare(ys, y, "swiglu span", best_isa());
  }
  std::printf("best=%s checked=%d mismatches=%d digest=%016llx\n", kNames[int(best_isa())], checked, mismatches,
              static_cast<unsigned long long>(digest.h));
  return mismatches ? 1 : 0;
}
