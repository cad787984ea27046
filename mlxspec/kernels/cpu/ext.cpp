// MLX extension: mlxspec's CPU kernels as MLX primitives (CPU stream only).
//
// Python:
//   qmm(x (..., K), w, scales, biases, group_size, bits, isa=-1, q8=False, e2m1=False, stream=None) -> (..., N)
//     the multi-row quantized matmul of qmm_kernel.h (q8: x rounded to int8 blocks, qmm_q8_kernel.h);
//     output dtype = promotion of x and scales. e2m1 (with q8, 4 bits, group 32): mxfp4 codes read
//     through kE2m1, scales its uint8 exponents (biases: the same array, unread), output dtype x's
//   gather_qmm(x (P, K), w (E, N, .), scales, biases, indices (P,), group_size, bits, isa=-1, q8=False) -> (P, N)
//     row p times expert indices[p] (mixture-of-experts layers), the same tiles as qmm
//   sdpa(q (B, H, M, D), k (B, KV, T, D), v (B, KV, T, Dv), scale, causal, isa=-1, window=0, sinks=None, stream=None)
//     -> (B, H, M, Dv); sinks (H,) float32: gpt-oss's extra logit per head
//     few-row attention of sdpa_kernel.h, in q's dtype (k and v share one, q may differ)
//   rms_norm, rope, swiglu: the per-token ops of pointwise.cpp
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"

#include "mlx_io.h"
#include "parallel.h"

namespace mx = mlx::core;
namespace nb = nanobind;

namespace mlxspec {

static int default_threads() {
  if (const char* env = std::getenv("MLXSPEC_KERNEL_THREADS")) return std::max(1, std::atoi(env));
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool& pool() {
  static ThreadPool p(default_threads());
  return p;
}

static SType stype_of(mx::Dtype d) {
  if (d == mx::float32) return SType::f32;
  if (d == mx::float16) return SType::f16;
  if (d == mx::bfloat16) return SType::bf16;
  if (d == mx::uint8) return SType::e8m0;  // mxfp4's exponents (with e2m1 codes only: checked below)
  throw std::invalid_argument("mlxspec qmm: scales/biases must be float32, float16 or bfloat16 (uint8: mxfp4)");
}

static float* aligned64(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t(63));
}

// x (..., K), any strides -> fp32 scratch (M, K) in the kernel's order, M = all leading dims.
static void convert_x(const mx::array& x, int bits, float* out) {
  const int K = x.shape(-1);
  const int64_t M = x.size() / K, s1 = x.strides().back();
  for (int64_t r = 0; r < M; ++r) {
    const int64_t off = row_offset(x, r);
    float* o = out + size_t(r) * K;
    if (x.dtype() == mx::float32) {
      prepare_x(x.data<float>() + off, 0, s1, 1, K, bits, o, [](float v) { return v; });
    } else if (x.dtype() == mx::float16) {
      prepare_x(x.data<uint16_t>() + off, 0, s1, 1, K, bits, o, half_to_float);
    } else {
      prepare_x(x.data<uint16_t>() + off, 0, s1, 1, K, bits, o, bf16_to_float);
    }
  }
}

// Columns per chunk: ~4 chunks per thread (claimed by the caller and the pool's workers).
static int column_chunk(const QmmProblem& p, int threads) {
  return std::max(kColumnBlock, (p.N / (4 * threads) + kColumnBlock - 1) / kColumnBlock * kColumnBlock);
}

static bool tiny(const QmmProblem& p) { return double(p.N) * p.K * std::max(1, std::min(p.M, 4)) < (1 << 18); }

// Columns [n0, n1) of one problem: the fp32 kernel, or the int8-activation one where x is quantized.
static void columns(Isa isa, const QmmProblem& p, int n0, int n1, float* y) {
  if (p.q8) run_columns_q8(isa, p, *p.q8, n0, n1, y);
  else run_columns(isa, p, n0, n1, y);
}

void run_qmm(Isa isa, const QmmProblem& p, float* y) { run_qmm_many(isa, &p, &y, 1); }

void run_qmm_many(Isa isa, const QmmProblem* problems, float* const* y, int count) {
  bool all_tiny = true;
  for (int i = 0; i < count; ++i) all_tiny = all_tiny && tiny(problems[i]);
  if (all_tiny || pool().size() == 1) {
    for (int i = 0; i < count; ++i) columns(isa, problems[i], 0, problems[i].N, y[i]);
    return;
  }
  // chunk c -> (problem, column range): the problems' columns one after another
  int per[8], first[9] = {0};
  if (count > 8) throw std::invalid_argument("mlxspec qmm: at most 8 problems per job");
  for (int i = 0; i < count; ++i) {
    per[i] = column_chunk(problems[i], pool().size());
    first[i + 1] = first[i] + (problems[i].N + per[i] - 1) / per[i];
  }
  pool().run(first[count], [&](int c) {
    int i = 0;
    while (c >= first[i + 1]) ++i;
    const int n0 = (c - first[i]) * per[i];
    columns(isa, problems[i], n0, std::min(problems[i].N, n0 + per[i]), y[i]);
  });
}

// x (M, K) rows times w: y (M, N), written to out in its dtype.
static void matmul_rows(std::vector<mx::array>& in, mx::array& out, int G, int bits, Isa isa, bool q8, bool e2m1, int pack,
                        float bias_of_scale) {
  const auto &x = in[0], &w = in[1], &s = in[2], &b = in[3];
  int K = x.shape(-1), N = w.shape(0), M = int(x.size() / K);
  thread_local std::vector<float> xbuf, yf;  // scratch, reused across calls on the stream thread
  xbuf.resize(size_t(M) * K + 16);
  yf.resize(size_t(M) * N);
  float* xf = aligned64(xbuf.data());  // 64-byte rows start: split-line loads cost 40% here
  convert_x(x, q8 ? 8 : bits, xf);  // q8: natural order, then quantized per 32-block
  QmmProblem p{xf, w.data<uint8_t>(), s.data<uint8_t>(), b.data<uint8_t>(), stype_of(s.dtype()), M, N, K, G, bits};
  p.e2m1 = e2m1, p.pack = pack, p.bias_of_scale = bias_of_scale;
  thread_local Q8Buffer xq;
  if (q8) quantize_rows(xf, K, M, K, bits, isa, xq), p.q8 = &xq.rows;
  run_qmm(isa, p, yf.data());
  store_f32(yf.data(), out.size(), out);
}

// Row p of x (P, K) times expert idx[p] of w (E, N, K*bits/32): out (P, N). The rows of one expert
// run as one multi-row problem of the same tiles as qmm, so each row gets the bits of a one-row
// qmm call with its expert's weights, whatever other rows share the call.
static void gather_rows(std::vector<mx::array>& in, mx::array& out, int G, int bits, Isa isa, bool q8, bool e2m1, int, float) {
  const auto &x = in[0], &w = in[1], &s = in[2], &b = in[3], &idx = in[4];
  const int K = x.shape(-1), E = w.shape(0), N = w.shape(1), P = int(x.size() / K);
  const size_t w_bytes = size_t(N) * w.shape(2) * 4, s_bytes = size_t(N) * (K / G) * s.itemsize();
  thread_local std::vector<float> xbuf, yf;
  xbuf.resize(size_t(P) * K + 16), yf.resize(size_t(P) * N);
  float* xf = aligned64(xbuf.data());
  convert_x(x, q8 ? 8 : bits, xf);
  std::vector<std::vector<int>> rows(E);  // the rows each expert serves, in order
  const uint32_t* ids = idx.data<uint32_t>();
  for (int p = 0; p < P; ++p) {
    if (ids[p] >= uint32_t(E)) throw std::out_of_range("mlxspec gather_qmm: expert index out of range");
    rows[ids[p]].push_back(p);
  }
  thread_local std::vector<float> ex[8], ey[8];
  thread_local Q8Buffer eq[8];
  QmmProblem problems[8];
  float* ys[8];
  int batch[8], count = 0;
  auto flush = [&] {  // up to 8 experts in one job: their columns share the threads
    run_qmm_many(isa, problems, ys, count);
    for (int i = 0; i < count; ++i)
      for (size_t r = 0; r < rows[batch[i]].size(); ++r)
        std::copy(ys[i] + r * N, ys[i] + (r + 1) * N, yf.data() + size_t(rows[batch[i]][r]) * N);
    count = 0;
  };
  for (int e = 0; e < E; ++e) {
    const int M = int(rows[e].size());
    if (!M) continue;
    ex[count].resize(size_t(M) * K + 16), ey[count].resize(size_t(M) * N);
    float* xe = aligned64(ex[count].data());
    for (int r = 0; r < M; ++r) std::copy(xf + size_t(rows[e][r]) * K, xf + size_t(rows[e][r] + 1) * K, xe + size_t(r) * K);
    problems[count] = QmmProblem{xe, w.data<uint8_t>() + e * w_bytes, s.data<uint8_t>() + e * s_bytes,
                                 b.data<uint8_t>() + e * s_bytes, stype_of(s.dtype()), M, N, K, G, bits};
    problems[count].e2m1 = e2m1;
    if (q8) quantize_rows(xe, K, M, K, bits, isa, eq[count]), problems[count].q8 = &eq[count].rows;
    ys[count] = ey[count].data(), batch[count++] = e;
    if (count == 8) flush();
  }
  if (count) flush();
  store_f32(yf.data(), out.size(), out);
}

// inputs {x, w, scales, biases}: x (..., K) times w; with a fifth, indices (P,): x (P, K), row p
// times expert indices[p] of w (E, N, .) (mixture-of-experts layers).
class QuantizedMatmulRows : public mx::UnaryPrimitive {
 public:
  QuantizedMatmulRows(mx::Stream s, int group_size, int bits, int isa, bool q8, bool e2m1, int pack, float bias_of_scale)
      : mx::UnaryPrimitive(s), group_size_(group_size), bits_(bits), isa_(isa), pack_(pack), bias_of_scale_(bias_of_scale),
        q8_(q8), e2m1_(e2m1) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    for (size_t i = 1; i < inputs.size(); ++i)
      if (!inputs[i].flags().row_contiguous) throw std::invalid_argument("mlxspec qmm: w/scales/biases must be contiguous");
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    std::vector<mx::array> in;
    for (const auto& a : inputs) enc.set_input_array(a), in.push_back(mx::array::unsafe_weak_copy(a));
    enc.set_output_array(out);
    enc.dispatch([in = std::move(in), out = mx::array::unsafe_weak_copy(out), G = group_size_, bits = bits_,
                  isa = Isa(isa_), q8 = q8_, e2m1 = e2m1_, pack = pack_, c = bias_of_scale_]() mutable {
      (in.size() == 5 ? gather_rows : matmul_rows)(in, out, G, bits, isa, q8, e2m1, pack, c);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("mlxspec qmm: this primitive runs on the CPU stream only");
  }

  const char* name() const override { return "MlxspecQuantizedMatmulRows"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const QuantizedMatmulRows&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_ && isa_ == o.isa_ && pack_ == o.pack_ &&
           bias_of_scale_ == o.bias_of_scale_ && q8_ == o.q8_ && e2m1_ == o.e2m1_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    if (inputs.size() == 5) return {mx::Shape{inputs[0].shape(0), inputs[1].shape(1)}};
    auto shape = inputs[0].shape();
    shape.back() = inputs[1].shape(0);
    return {shape};
  }

 private:
  int group_size_, bits_, isa_, pack_;
  float bias_of_scale_;
  bool q8_, e2m1_;
};

// A matmul primitive over x (..., K) and w (..., N, K*bits/32) with scales and biases (..., N,
// K/group_size), after the checks both calls share; `inputs` end with indices for gather_qmm.
static mx::array matmul_primitive(const char* what, mx::Shape out_shape, std::vector<mx::array> inputs,
                                  int group_size, int bits, int isa, bool q8, bool e2m1, mx::StreamOrDevice s,
                                  int pack = 1, float bias_of_scale = 0.f) {
  const auto &x = inputs[0], &w = inputs[1], &scales = inputs[2], &biases = inputs[3];
  auto fail = [&](const std::string& why) { throw std::invalid_argument(std::string("mlxspec ") + what + ": " + why); };
  if (bits != 4 && bits != 8) fail("bits must be 4 or 8");
  if (e2m1 && !(q8 && bits == 4 && group_size == kBlock)) fail("e2m1 (mxfp4) codes need q8, 4 bits and group size 32");
  if (e2m1 != (inputs[2].dtype() == mx::uint8)) fail("uint8 scales (mxfp4 exponents) go with e2m1 codes, and only they");
  if (group_size % kBlock != 0) fail("group_size must be a multiple of 32");
  if (pack < 1 || (pack > 1 && (!q8 || inputs.size() != 4 || w.shape(0) % pack)))
    fail("pack > 1 (codes packed by packing.py) needs q8, a 2-D w and N a multiple of pack");
  if (bias_of_scale != 0.f && (!q8 || e2m1 || inputs.size() != 4)) fail("bias_of_scale needs q8 affine codes and a 2-D w");
  const int K = x.shape(-1);
  if (w.dtype() != mx::uint32 || int64_t(w.shape(-1)) * 32 / bits != K || K % group_size != 0)
    fail("w (..., N, K*bits/32) uint32 does not match x's K, or K is not a multiple of group_size");
  auto groups = w.shape();
  groups.back() = K / group_size;
  if (scales.shape() != groups || biases.shape() != groups || biases.dtype() != scales.dtype())
    fail("scales/biases must be (..., N, K/group_size) of one dtype");
  stype_of(scales.dtype());
  if (x.dtype() != mx::float32 && x.dtype() != mx::float16 && x.dtype() != mx::bfloat16)
    fail("x must be float32, float16 or bfloat16");
  Isa chosen = isa < 0 ? best_isa() : Isa(isa);
  if (!isa_compiled(chosen)) fail("that ISA is not compiled in");
  auto stream = mx::to_stream(s, mx::Device::cpu);
  if (stream.device != mx::Device::cpu) fail("CPU streams only");
  auto out_type = e2m1 ? x.dtype() : mx::promote_types(x.dtype(), scales.dtype());
  return mx::array(std::move(out_shape), out_type,
                   std::make_shared<QuantizedMatmulRows>(stream, group_size, bits, int(chosen), q8, e2m1, pack, bias_of_scale),
                   std::move(inputs));
}

static mx::array qmm(const mx::array& x, const mx::array& w, const mx::array& scales, const mx::array& biases,
                     int group_size, int bits, int isa, bool q8, bool e2m1, int pack, float bias_of_scale,
                     mx::StreamOrDevice s) {
  if (x.ndim() < 1 || w.ndim() != 2) throw std::invalid_argument("mlxspec qmm: x must be (..., K) and w (N, K*bits/32)");
  // x may be any strided view; the kernel reads it through its strides (w etc. must be contiguous).
  auto out_shape = x.shape();
  out_shape.back() = w.shape(0);
  return matmul_primitive("qmm", std::move(out_shape), {x, w, scales, biases}, group_size, bits, isa, q8, e2m1, s, pack, bias_of_scale);
}

// ---------------------------------------------------------------- mixture-of-experts matmul

static mx::array gather_qmm(const mx::array& x, const mx::array& w, const mx::array& scales, const mx::array& biases,
                            const mx::array& indices, int group_size, int bits, int isa, bool q8, bool e2m1,
                            mx::StreamOrDevice s) {
  if (w.ndim() != 3 || indices.ndim() != 1 || indices.dtype() != mx::uint32)
    throw std::invalid_argument("mlxspec gather_qmm: w, scales, biases (E, N, .), indices (P,) uint32");
  if (x.ndim() != 2 || x.shape(0) != indices.shape(0))
    throw std::invalid_argument("mlxspec gather_qmm: x must be (P, K), one row per index");
  return matmul_primitive("gather_qmm", mx::Shape{x.shape(0), w.shape(1)}, {x, w, scales, biases, indices},
                          group_size, bits, isa, q8, e2m1, s);
}

static DType dtype_of(mx::Dtype d) {
  if (d == mx::float32) return DType::f32;
  if (d == mx::float16) return DType::f16;
  if (d == mx::bfloat16) return DType::bf16;
  throw std::invalid_argument("mlxspec sdpa: q, k, v must be float32, float16 or bfloat16");
}

// Work items: (batch, kv head, chunk of query rows); rows of one kv head share key/value reads.
void run_sdpa(Isa isa, const SdpaProblem& p) {
  const int rows = p.H / p.KV * p.M;
  const int per_head = std::max(1, std::min(rows, (2 * pool().size() + p.B * p.KV - 1) / (p.B * p.KV)));
  // at most 64 rows per item: its scores (rows x T floats) stay small even for a long prefill
  // and at least a row block (kRowBlock rows share each key read): a smaller chunk only transposes
  // the same keys again and pads its block (one-row steps: 3 query heads per kv head, one item each)
  const int chunk = std::max(std::min(64, (rows + per_head - 1) / per_head), std::min(rows, kRowBlock));
  const int chunks = (rows + chunk - 1) / chunk;
  const double work = double(p.B) * p.H * p.M * p.T * (p.D + p.Dv);
  pool().run(work < (1 << 16) ? 1 : p.B * p.KV * chunks, [&](int i) {
    if (work < (1 << 16) && i == 0) {  // tiny: everything inline
      for (int b = 0; b < p.B; ++b)
        for (int g = 0; g < p.KV; ++g) sdpa_rows(isa, p, b, g, 0, rows);
      return;
    }
    int c = i % chunks, g = (i / chunks) % p.KV, b = i / chunks / p.KV;
    sdpa_rows(isa, p, b, g, c * chunk, std::min(rows, (c + 1) * chunk));
  });
}

class FewRowAttention : public mx::UnaryPrimitive {
 public:
  FewRowAttention(mx::Stream s, float scale, bool causal, int isa, int window, bool sinks, bool length,
                  float softcap)
      : mx::UnaryPrimitive(s), scale_(scale), causal_(causal), isa_(isa), window_(window), sinks_(sinks),
        length_(length), softcap_(softcap) {}

  // inputs {q, k, v[, sinks (H,) float32][, length: one int32]}: with a length, only keys [0, length) of k
  // and v count (a compiled step's cache buffer): the same arithmetic as a call over k[:, :, :length]

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const auto &q = inputs[0], &k = inputs[1], &v = inputs[2];
    for (auto* a : {&q, &k, &v})
      if (a->strides()[3] != 1 && a->shape(3) > 1) throw std::invalid_argument("mlxspec sdpa: last dim must be contiguous");
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) enc.set_input_array(a);
    enc.set_output_array(out);
    const bool with_sinks = sinks_;
    enc.dispatch([q = mx::array::unsafe_weak_copy(q), k = mx::array::unsafe_weak_copy(k),
                  v = mx::array::unsafe_weak_copy(v), out = mx::array::unsafe_weak_copy(out),
                  sinks = mx::array::unsafe_weak_copy(with_sinks ? inputs[3] : q), with_sinks,
                  length = mx::array::unsafe_weak_copy(length_ ? inputs.back() : q), with_length = length_,
                  scale = scale_, causal = causal_, isa = Isa(isa_), window = window_, softcap = softcap_]() mutable {
      int T = k.shape(2);  // a length is clamped to [rows, keys] (never read out of bounds; no throw in a task)
      if (with_length) T = std::max(causal ? q.shape(2) : 1, std::min(T, int(length.data<int32_t>()[0])));
      SdpaProblem p{q.data<uint8_t>(), k.data<uint8_t>(), v.data<uint8_t>(), dtype_of(k.dtype()), {}, {}, {},
                    q.shape(0), q.shape(1), k.shape(1), q.shape(2), T, q.shape(3), v.shape(3),
                    scale, causal, nullptr};
      if (q.dtype() != k.dtype()) p.qdtype = int(dtype_of(q.dtype()));
      p.window = window;
      p.softcap = softcap;
      if (with_sinks) p.sinks = sinks.data<float>();
      for (int i = 0; i < 4; ++i) p.qs[i] = q.strides()[i], p.ks[i] = k.strides()[i], p.vs[i] = v.strides()[i];
      thread_local std::vector<float> buf;
      buf.resize(out.size());
      p.out = buf.data();
      run_sdpa(isa, p);
      store_f32(buf.data(), out.size(), out);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("mlxspec sdpa: this primitive runs on the CPU stream only");
  }

  const char* name() const override { return "MlxspecFewRowAttention"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const FewRowAttention&>(other);
    return scale_ == o.scale_ && causal_ == o.causal_ && isa_ == o.isa_ && window_ == o.window_ &&
           sinks_ == o.sinks_ && length_ == o.length_ && softcap_ == o.softcap_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    auto shape = inputs[0].shape();
    shape[3] = inputs[2].shape(3);
    return {shape};
  }

 private:
  float scale_;
  bool causal_;
  int isa_, window_;
  bool sinks_, length_;
  float softcap_;
};

static mx::array sdpa(const mx::array& q, const mx::array& k, const mx::array& v, float scale, bool causal,
                      int isa, int window, std::optional<mx::array> sinks, std::optional<mx::array> length, float softcap,
                      mx::StreamOrDevice s) {
  if (window < 0 || (window > 0 && !causal)) throw std::invalid_argument("mlxspec sdpa: a window needs causal rows");
  if (!(softcap >= 0)) throw std::invalid_argument("mlxspec sdpa: softcap must be >= 0");
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4)
    throw std::invalid_argument("mlxspec sdpa: q, k, v must be (B, heads, rows, dim)");
  if (v.dtype() != k.dtype()) throw std::invalid_argument("mlxspec sdpa: one dtype for k and v");
  dtype_of(q.dtype()), dtype_of(k.dtype());
  if (k.shape(0) != q.shape(0) || v.shape(0) != q.shape(0) || k.shape(1) != v.shape(1) || q.shape(1) % k.shape(1) ||
      k.shape(2) != v.shape(2) || k.shape(3) != q.shape(3))
    throw std::invalid_argument("mlxspec sdpa: shapes do not match (GQA needs heads % kv heads == 0)");
  if (causal && q.shape(2) > k.shape(2)) throw std::invalid_argument("mlxspec sdpa: more query rows than keys");
  auto stream = mx::to_stream(s, mx::Device::cpu);
  if (stream.device != mx::Device::cpu) throw std::invalid_argument("mlxspec sdpa: CPU streams only");
  Isa chosen = isa < 0 ? best_isa() : Isa(isa);
  if (!isa_compiled(chosen)) throw std::invalid_argument("mlxspec sdpa: that ISA is not compiled in");
  std::vector<mx::array> inputs = {q, k, v};
  if (sinks) {
    if (sinks->dtype() != mx::float32 || sinks->ndim() != 1 || sinks->shape(0) != q.shape(1) || !sinks->flags().row_contiguous)
      throw std::invalid_argument("mlxspec sdpa: sinks must be (heads,) contiguous float32");
    inputs.push_back(*sinks);
  }
  if (length) {  // read when the step runs: a compiled step's cache length is an array of its graph
    if (length->size() != 1) throw std::invalid_argument("mlxspec sdpa: length must be one number");
    inputs.push_back(mx::astype(*length, mx::int32, stream));  // any shape holding one number
  }
  auto shape = q.shape();
  shape[3] = v.shape(3);
  return mx::array(shape, q.dtype(),
                   std::make_shared<FewRowAttention>(stream, scale, causal, int(chosen), window, bool(sinks), bool(length),
                                                     softcap),
                   std::move(inputs));
}

void register_pointwise(nb::module_& m);  // pointwise.cpp
void register_fused_layer(nb::module_& m);  // fused_layer.cpp
void register_delta(nb::module_& m);  // delta.cpp

}  // namespace mlxspec

NB_MODULE(_mlxspec_cpu, m) {
  m.doc() = "mlxspec CPU kernels: multi-row quantized matmul, few-row attention";
  m.def("qmm", &mlxspec::qmm, nb::arg("x"), nb::arg("w"), nb::arg("scales"), nb::arg("biases"),
        nb::arg("group_size"), nb::arg("bits"), nb::arg("isa") = -1, nb::kw_only(), nb::arg("q8") = false,
        nb::arg("e2m1") = false, nb::arg("pack") = 1, nb::arg("bias_of_scale") = 0.0f, nb::arg("stream") = nb::none(),
        "y (..., N) = x (..., K) @ dequant(w).T, every row computed as a one-row call would compute it; "
        "pack > 1: w's codes are packed in groups of that many columns (q8 only, qmm_q8_kernel.h's ColumnCodes); "
        "bias_of_scale != 0: biases are that times the scales (q8 only; not read).");
  m.def("gather_qmm", &mlxspec::gather_qmm, nb::arg("x"), nb::arg("w"), nb::arg("scales"), nb::arg("biases"),
        nb::arg("indices"), nb::arg("group_size"), nb::arg("bits"), nb::arg("isa") = -1, nb::kw_only(),
        nb::arg("q8") = false, nb::arg("e2m1") = false, nb::arg("stream") = nb::none(),
        "y (P, N): row p of x (P, K) times expert indices[p] of w (E, N, K*bits/32), each row as a one-row qmm computes it.");
  m.def("sdpa", &mlxspec::sdpa, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("scale"), nb::arg("causal"),
        nb::arg("isa") = -1, nb::kw_only(), nb::arg("window") = 0, nb::arg("sinks") = nb::none(),
        nb::arg("length") = nb::none(), nb::arg("softcap") = 0.0f, nb::arg("stream") = nb::none(),
        "softmax(q k^T * scale) v for few query rows (GQA, causal over the last rows, optionally within a "
        "sliding window of keys, optionally with a sink logit per head), rows independent of M; length (an "
        "array): only keys [0, length) count, as if k and v were cut there; softcap > 0: scores s become "
        "softcap * tanh(s / softcap) first (Gemma 2).");
  mlxspec::register_pointwise(m);
  mlxspec::register_delta(m);
  mlxspec::register_fused_layer(m);
  m.def("best_isa", [] { return int(mlxspec::best_isa()); });
  m.def("isa_compiled", [](int isa) { return mlxspec::isa_compiled(mlxspec::Isa(isa)); });
  m.def("threads", [] { return mlxspec::pool().size(); });
  m.def("q8_path", [] { return std::string(mlxspec::q8_path_name()); },
        "the int8-activation path the best ISA runs: avx512-vnni, avx2 or portable (a lane-by-lane emulation)");
}
