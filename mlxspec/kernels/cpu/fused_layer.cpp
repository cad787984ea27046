// One decoder layer of a llama-family model (llama, mistral, qwen2, SmolLM) as ONE MLX primitive:
//
//   n1 = rms_norm(x);  q, k, v = rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1)
//                      (qwen3: rope(q_norm(q_proj(n1))), rope(k_norm(k_proj(n1))), RMSNorm per head)
//   h  = x + o_proj(attention(q, [cache keys ; k], [cache values ; v]))
//   out = h + down_proj(swiglu(gate_proj(n2), up_proj(n2)))        n2 = rms_norm(h)
//
// gemma3 (`gemma`): the same with qwen3's head norms, sandwich norms and GeGLU:
//   h  = x + post_attention_norm(o_proj(attention(...)))
//   out = h + post_feedforward_norm(down_proj(geglu(gate_proj(n2), up_proj(n2))))
// and a sliding window: attention reads the cache from row key_start (the rows the module path's
// window cache returns), rows see their last `window` keys, rope runs at `position` (the cache's
// rows and the positions differ once a window cache compacts).
//
// Outputs (out, k, v); FusedLayer then writes k and v into the KV cache with MLX's SliceUpdate
// (donated in place, as mlx-lm's cache update is), so the cache stays an ordinary MLX value and the
// graph orders every read and write.
//
// Why: the same layer as separate ops is ~28 MLX graph nodes and MLX spends ~6 us dispatching each
// on these CPUs: ~850 nodes and ~5 ms of a ~17 ms SmolLM2 step. Fused, a step has ~100 nodes.
//
// Exactness: each stage is the per-row arithmetic of the separate kernels (qmm_kernel.h,
// sdpa_kernel.h, pointwise_kernel.h), rounded to the same dtypes at the same points as the module
// path with mlxspec's kernels, so the output is bit-identical to that path (fused_layer.py checks it
// per signature on first use) and every row is independent of the number of rows.
#include <algorithm>
#include <stdexcept>
#include <variant>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"

#include "mlx_io.h"
#include "parallel.h"
#include "pointwise_kernel.h"

namespace nb = nanobind;

namespace mlxspec {

enum Proj : int { kQ = 0, kK, kV, kO, kGate, kUp, kDown, kProjs };

// Inputs: x, norm1 weight, (w, scales, biases) for each projection in Proj order, norm2 weight,
// inv_freq, cache keys, cache values, then the bias vector of each projection that has one, then
// (qwen3's per-head norms) the q_norm and k_norm weights.
constexpr int kX = 0, kNorm1 = 1, kW0 = 2, kNorm2 = kW0 + 3 * kProjs, kInvFreq = kNorm2 + 1, kKeys_ = kInvFreq + 1,
              kValues = kKeys_ + 1, kBias0 = kValues + 1;

constexpr int kMaxTree = 64;  // rows of a tree pass (one bit each in a visibility mask)

struct LayerParams {
  int offset = 0, heads = 0, kv_heads = 0, head_dim = 0, rope_dims = 0, isa = 0;
  bool traditional = false;
  float rope_scale = 1, attn_scale = 1, eps1 = 0, eps2 = 0;
  int group[kProjs] = {}, bits[kProjs] = {}, pack[kProjs] = {1, 1, 1, 1, 1, 1, 1};  // pack: QmmProblem::pack
  float bias_of_scale[kProjs] = {};  // QmmProblem::bias_of_scale
  bool bias[kProjs] = {};
  bool qk_norm = false;  // RMSNorm of each q and k head (qwen3) before rope, with eps_qk
  bool q8 = false;       // projections take int8 activations (qmm_q8_kernel.h), as the module path's q8 kernel
  float eps_qk = 0;
  bool gemma = false;    // sandwich norms (their weights after the q/k norms) and GeGLU
  float eps_pa = 0, eps_pf = 0;  // post-attention and post-feedforward norms' eps (gemma)
  int position = 0;      // rope position of row 0 (the cache's row count `offset` unless a window cache compacted)
  int key_start = 0;     // first cache row attention reads
  int window = 0;        // rows see at most this many keys, their last ones (0: all)
  bool dynamic = false;  // the offset is an input (an int32 array, read when the step runs: a compiled step's)
  bool dynamic_position = false;  // so is the rope position (after the offset): a compiled step's sliding layer
  // A tree of rows (a verify pass over a draft tree): row m sits at position offset + depth[m] and
  // attends to the cache and its ancestors (bit j of visible[m]). tree == false: a causal chain.
  bool tree = false;
  int depth[kMaxTree] = {};
  uint64_t visible[kMaxTree] = {};
};

// The dtype of every intermediate, as the module path's ops promote them.
struct LayerTypes {
  mx::Dtype n1 = mx::float32, h = mx::float32, n2 = mx::float32, act = mx::float32, out = mx::float32;
  mx::Dtype pa = mx::float32, pf = mx::float32;  // gemma's post-attention and post-feedforward norms' outputs
  mx::Dtype kv = mx::float32;  // the KV cache's: the keys' dtype, or float16 under float32 keys (a half cache)
  mx::Dtype qmm[kProjs] = {mx::float32, mx::float32, mx::float32, mx::float32, mx::float32, mx::float32, mx::float32};
  mx::Dtype proj[kProjs] = {mx::float32, mx::float32, mx::float32, mx::float32, mx::float32, mx::float32, mx::float32};
};

static DType attention_dtype(mx::Dtype d) {
  return d == mx::float32 ? DType::f32 : (d == mx::float16 ? DType::f16 : DType::bf16);
}

static void round_span(float* y, size_t n, mx::Dtype t) {
  if (t == mx::float32) return;
  for (size_t i = 0; i < n; ++i) y[i] = round_to(y[i], t);
}

// fp32 rows (M, K) -> the qmm kernel's input order for `bits` (values unchanged).
static void prepare(const float* x, int M, int K, int bits, float* out) {
  prepare_x(x, K, 1, M, K, bits, out, [](float v) { return v; });
}

struct Scratch {  // per stream thread, reused across calls
  std::vector<float> x, n, xp4, xp8, q, k, v, att, o, h, g, u, a, d;
  std::vector<uint8_t> qt, kt, vt;  // q, k, v in the attention dtype
  std::vector<float> c, s, f, w1, w2, tmp, hw, hrow;  // hw, hrow: a per-head norm's weights and input row
  Q8Buffer q84, q88;  // rows quantized for 4-bit and 8-bit projections (q8 layers)
};

// The input slot of the q_norm weight (k_norm's is the next): after the biases.
static int qk_norm_slot(const LayerParams& p) {
  int slot = kBias0;
  for (int i = 0; i < kProjs; ++i) slot += p.bias[i];
  return slot;
}

// gemma's post-attention norm weight slot (the post-feedforward norm's is the next): after the q/k norms.
static int post_norm_slot(const LayerParams& p) { return qk_norm_slot(p) + (p.qk_norm ? 2 : 0); }

// rms_norm over each Dh-wide row of y in place (qwen3's heads: rows of L * heads; gemma's sandwich
// norms: L rows of D), rounded to t: the per-op kernel's arithmetic.
static void norm_rows(float* y, int rows, int Dh, const mx::array& w, float eps, mx::Dtype t, Scratch& sc) {
  sc.hw.resize(Dh), sc.hrow.resize(Dh);
  row_to_f32(w, 0, sc.hw.data());
  for (int r = 0; r < rows; ++r) {
    float* row = y + size_t(r) * Dh;
    std::copy(row, row + Dh, sc.hrow.begin());
    rms_norm_row(sc.hrow.data(), sc.hw.data(), Dh, eps, [t](float v) { return round_to(v, t); }, row);
  }
  round_span(y, size_t(rows) * Dh, t);
}

static float* aligned(std::vector<float>& v, size_t n) {
  v.resize(n + 16);
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(v.data()) + 63) & ~uintptr_t(63));
}

// The qmm kernel's input for a projection: prepared once per distinct bit width.
static const float* input_for(int bits, const float* rows, int M, int K, Scratch& sc, bool& ready4, bool& ready8) {
  bool& ready = bits == 4 ? ready4 : ready8;
  float* buf = aligned(bits == 4 ? sc.xp4 : sc.xp8, size_t(M) * K);
  if (!ready) prepare(rows, M, K, bits, buf), ready = true;
  return buf;
}

static QmmProblem problem(const std::vector<mx::array>& in, int proj, const LayerParams& p, const float* x, int M) {
  const auto &w = in[kW0 + 3 * proj], &s = in[kW0 + 3 * proj + 1], &b = in[kW0 + 3 * proj + 2];
  const int K = int(int64_t(w.shape(1)) * 32 / p.bits[proj]);
  QmmProblem q{x, w.data<uint8_t>(), s.data<uint8_t>(), b.data<uint8_t>(), stype(s.dtype()), M, w.shape(0), K,
                p.group[proj], p.bits[proj]};
  q.pack = p.pack[proj], q.bias_of_scale = p.bias_of_scale[proj];
  return q;
}

// A projection's problem over `rows` (M, K), natural order: their fp32 kernel input or, in a q8
// layer, their int8 blocks; prepared once per distinct bit width (r4/r8 say which are ready).
static QmmProblem input_problem(const std::vector<mx::array>& in, int proj, const LayerParams& p, const float* rows,
                                int M, int K, Scratch& sc, bool& r4, bool& r8) {
  const int bits = p.bits[proj];
  if (!p.q8) return problem(in, proj, p, input_for(bits, rows, M, K, sc, r4, r8), M);
  bool& ready = bits == 4 ? r4 : r8;
  Q8Buffer& buf = bits == 4 ? sc.q84 : sc.q88;
  if (!ready) quantize_rows(rows, K, M, K, bits, Isa(p.isa), buf), ready = true;
  QmmProblem q = problem(in, proj, p, nullptr, M);
  q.q8 = &buf.rows;
  return q;
}

// y (M, N) fp32 from the kernel -> rounded to the projection's dtype, plus its bias (rounded again).
static void finish_projection(const std::vector<mx::array>& in, const LayerParams& p, const LayerTypes& t, int proj,
                              float* y, int M, int N, Scratch& sc) {
  round_span(y, size_t(M) * N, t.qmm[proj]);  // the matmul's output dtype
  if (!p.bias[proj]) return;
  int slot = kBias0;
  for (int i = 0; i < proj; ++i) slot += p.bias[i];
  sc.tmp.resize(N);
  row_to_f32(in[slot], 0, sc.tmp.data());
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) y[size_t(m) * N + n] += sc.tmp[n];
  round_span(y, size_t(M) * N, t.proj[proj]);
}

static void rope_rows_f32(float* x, int M, int heads, int D, const LayerParams& p, const float* c, const float* s,
                          std::vector<float>& row) {
  const int half = p.rope_dims / 2;
  row.resize(D);
  for (int m = 0; m < M; ++m)
    for (int h = 0; h < heads; ++h) {
      float* r = x + (size_t(m) * heads + h) * D;
      std::copy(r, r + D, row.begin());
      rope_row(row.data(), r, D, p.rope_dims, p.traditional, c + size_t(m) * half, s + size_t(m) * half);
    }
}

static void layer(const std::vector<mx::array>& in, mx::array& out, mx::array& k_out, mx::array& v_out,
                  const LayerParams& p, const LayerTypes& t) {
  thread_local Scratch sc;
  const Isa isa = Isa(p.isa);
  const mx::array& x = in[kX];
  const int L = x.shape(1), D = x.shape(2), H = p.heads, KV = p.kv_heads, Dh = p.head_dim;
  const int Dv = in[kW0 + 3 * kV].shape(0) / KV, I = in[kW0 + 3 * kGate].shape(0);
  const mx::Dtype at = t.proj[kQ];  // q, k, v and the attention output share it (checked at build)
  const SType ast = stype(at), kvst = stype(t.kv);

  // 1. n1 = rms_norm(x), rounded to its dtype
  float* xf = aligned(sc.x, size_t(L) * D);
  float* n = aligned(sc.n, size_t(L) * D);
  for (int m = 0; m < L; ++m) row_to_f32(x, m, xf + size_t(m) * D);
  sc.w1.resize(D), sc.w2.resize(D);
  row_to_f32(in[kNorm1], 0, sc.w1.data());
  row_to_f32(in[kNorm2], 0, sc.w2.data());
  auto rounder = [](mx::Dtype d) { return [d](float v) { return round_to(v, d); }; };
  for (int m = 0; m < L; ++m) rms_norm_row(xf + size_t(m) * D, sc.w1.data(), D, p.eps1, rounder(t.n1), n + size_t(m) * D);
  round_span(n, size_t(L) * D, t.n1);

  // 2. q, k, v projections in one pool job
  bool r4 = false, r8 = false;
  float* q = aligned(sc.q, size_t(L) * H * Dh);
  float* k = aligned(sc.k, size_t(L) * KV * Dh);
  float* v = aligned(sc.v, size_t(L) * KV * Dv);
  QmmProblem qkv[3];
  for (int i = 0; i < 3; ++i) qkv[i] = input_problem(in, kQ + i, p, n, L, D, sc, r4, r8);
  float* ys[3] = {q, k, v};
  run_qmm_many(isa, qkv, ys, 3);
  finish_projection(in, p, t, kQ, q, L, H * Dh, sc);
  finish_projection(in, p, t, kK, k, L, KV * Dh, sc);
  finish_projection(in, p, t, kV, v, L, KV * Dv, sc);
  if (p.qk_norm) {  // qwen3: each head of q and k RMS-normed (dtype unchanged: checked at build)
    norm_rows(q, L * H, Dh, in[qk_norm_slot(p)], p.eps_qk, at, sc);
    norm_rows(k, L * KV, Dh, in[qk_norm_slot(p) + 1], p.eps_qk, at, sc);
  }

  // 3. rope on q and k at positions offset + m, or offset + depth[m] in a tree (cos/sin rounded to
  //    the dtype, as MLX does)
  const int half = p.rope_dims / 2;
  sc.f.resize(half), sc.c.resize(size_t(L) * half), sc.s.resize(size_t(L) * half);
  row_to_f32(in[kInvFreq], 0, sc.f.data());
  for (int m = 0; m < L; ++m)
    rope_angles_rounded((float(p.tree ? p.depth[m] : m) + float(p.position)) * p.rope_scale, sc.f.data(), half, rounder(at),
                        sc.c.data() + size_t(m) * half, sc.s.data() + size_t(m) * half);
  rope_rows_f32(q, L, H, Dh, p, sc.c.data(), sc.s.data(), sc.tmp);
  rope_rows_f32(k, L, KV, Dh, p, sc.c.data(), sc.s.data(), sc.tmp);
  round_span(q, size_t(L) * H * Dh, at);
  round_span(k, size_t(L) * KV * Dh, at);

  // 4. the step's keys/values in the cache layout (1, KV, L, D), in the cache's dtype (a half cache
  //    rounds them here, as its astype does): the outputs the caller writes into its cache
  for (int m = 0; m < L; ++m)
    for (int g = 0; g < KV; ++g) {
      store_floats(k + (size_t(m) * KV + g) * Dh, Dh, kvst, k_out.data<uint8_t>() + ((size_t(g) * L + m) * Dh) * k_out.itemsize());
      store_floats(v + (size_t(m) * KV + g) * Dv, Dv, kvst, v_out.data<uint8_t>() + ((size_t(g) * L + m) * Dv) * v_out.itemsize());
    }
  // q as (1, H, L, Dh) in the attention dtype
  sc.qt.resize(size_t(L) * H * Dh * at.size());
  for (int m = 0; m < L; ++m)
    for (int h = 0; h < H; ++h)
      store_floats(q + (size_t(m) * H + h) * Dh, Dh, ast, sc.qt.data() + ((size_t(h) * L + m) * Dh) * at.size());

  // 5. attention over cache rows [0, offset) and this step's rows (queries in their own dtype
  //    where the cache has another)
  //    (from row key_start: a window cache's rows; windowed calls are causal at any L, as the module path's)
  const mx::array &kc = in[kKeys_], &vc = in[kValues];
  const int T = p.offset - p.key_start + L;
  float* att = aligned(sc.att, size_t(H) * L * Dv);
  const uint8_t* k0 = kc.data<uint8_t>() + size_t(p.key_start) * kc.strides()[2] * kc.itemsize();
  const uint8_t* v0 = vc.data<uint8_t>() + size_t(p.key_start) * vc.strides()[2] * vc.itemsize();
  SdpaProblem sp{sc.qt.data(), k0, v0, attention_dtype(t.kv), {int64_t(H) * L * Dh, int64_t(L) * Dh, Dh, 1}, {}, {},
                 1, H, KV, L, T, Dh, Dv, p.attn_scale, L > 1 || p.window > 0, att};
  if (t.kv != at) sp.qdtype = int(attention_dtype(at));
  for (int i = 0; i < 4; ++i) sp.ks[i] = kc.strides()[i], sp.vs[i] = vc.strides()[i];
  sp.split = p.offset - p.key_start;
  sp.window = p.window;
  if (p.tree) sp.visible = p.visible;
  sp.k2 = k_out.data<uint8_t>(), sp.v2 = v_out.data<uint8_t>();
  const int64_t k2s[4] = {int64_t(KV) * L * Dh, int64_t(L) * Dh, Dh, 1}, v2s[4] = {int64_t(KV) * L * Dv, int64_t(L) * Dv, Dv, 1};
  std::copy(k2s, k2s + 4, sp.k2s), std::copy(v2s, v2s + 4, sp.v2s);
  run_sdpa(isa, sp);
  // (1, H, L, Dv) -> rows (L, H * Dv), rounded to the attention dtype
  float* o_in = aligned(sc.o, size_t(L) * H * Dv);
  for (int m = 0; m < L; ++m)
    for (int h = 0; h < H; ++h)
      for (int d = 0; d < Dv; ++d) o_in[(size_t(m) * H + h) * Dv + d] = round_to(att[(size_t(h) * L + m) * Dv + d], at);

  // 6. h = x + o_proj(attention)
  r4 = r8 = false;
  QmmProblem op = input_problem(in, kO, p, o_in, L, H * Dv, sc, r4, r8);
  float* h = aligned(sc.h, size_t(L) * D);
  run_qmm(isa, op, h);
  finish_projection(in, p, t, kO, h, L, D, sc);
  if (p.gemma) norm_rows(h, L, D, in[post_norm_slot(p)], p.eps_pa, t.pa, sc);
  for (size_t i = 0; i < size_t(L) * D; ++i) h[i] = round_to(xf[i] + h[i], t.h);

  // 7. n2 = rms_norm(h); gate and up in one pool job; a = swiglu(gate, up)
  for (int m = 0; m < L; ++m) rms_norm_row(h + size_t(m) * D, sc.w2.data(), D, p.eps2, rounder(t.n2), n + size_t(m) * D);
  round_span(n, size_t(L) * D, t.n2);
  r4 = r8 = false;
  float* g = aligned(sc.g, size_t(L) * I);
  float* u = aligned(sc.u, size_t(L) * I);
  QmmProblem gu[2] = {input_problem(in, kGate, p, n, L, D, sc, r4, r8), input_problem(in, kUp, p, n, L, D, sc, r4, r8)};
  float* gus[2] = {g, u};
  run_qmm_many(isa, gu, gus, 2);
  finish_projection(in, p, t, kGate, g, L, I, sc);
  finish_projection(in, p, t, kUp, u, L, I, sc);
  float* a = aligned(sc.a, size_t(L) * I);
  if (p.gemma) geglu_span(g, u, a, L * I);
  else swiglu_span(g, u, a, L * I);
  round_span(a, size_t(L) * I, t.act);

  // 8. out = h + down_proj(a)
  r4 = r8 = false;
  QmmProblem dp = input_problem(in, kDown, p, a, L, I, sc, r4, r8);
  float* d = aligned(sc.d, size_t(L) * D);
  run_qmm(isa, dp, d);
  finish_projection(in, p, t, kDown, d, L, D, sc);
  if (p.gemma) norm_rows(d, L, D, in[post_norm_slot(p) + 1], p.eps_pf, t.pf, sc);
  for (size_t i = 0; i < size_t(L) * D; ++i) d[i] = h[i] + d[i];
  store_f32(d, size_t(L) * D, out);
}

class FusedDecoderLayer : public mx::Primitive {
 public:
  FusedDecoderLayer(mx::Stream s, LayerParams p, LayerTypes t) : mx::Primitive(s), p_(p), t_(t) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    for (int i = kW0; i < kNorm2; ++i)
      if (!inputs[i].flags().row_contiguous) throw std::invalid_argument("mlxspec fused layer: weights must be contiguous");
    for (int i : {kKeys_, kValues})  // strides are known now (not when the graph was built)
      if (inputs[i].strides()[3] != 1) throw std::invalid_argument("mlxspec fused layer: cache rows must be contiguous");
    for (auto& o : outputs) o.set_data(mx::allocator::malloc(o.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (auto& a : inputs) enc.set_input_array(a);
    for (auto& o : outputs) enc.set_output_array(o);
    std::vector<mx::array> in;
    in.reserve(inputs.size());
    for (auto& a : inputs) in.push_back(mx::array::unsafe_weak_copy(a));
    enc.dispatch([in = std::move(in), out = mx::array::unsafe_weak_copy(outputs[0]),
                  k = mx::array::unsafe_weak_copy(outputs[1]), v = mx::array::unsafe_weak_copy(outputs[2]), p = p_,
                  t = t_]() mutable {
      if (p.dynamic_position) {
        p.position = std::max(0, int(in.back().data<int32_t>()[0]));
        in.pop_back();
      }
      if (p.dynamic) {  // clamped to the room in the buffer (never read out of bounds; no throw in a task)
        const int room = int(in[kKeys_].shape(2)) - int(in[kX].shape(1));
        p.offset = std::max(0, std::min(room, int(in.back().data<int32_t>()[0])));
        if (!p.dynamic_position) p.position = p.offset;
        if (p.window > 0) p.key_start = p.offset - std::min(p.offset, p.window - 1);  // as the window cache returns
        in.pop_back();
      }
      layer(in, out, k, v, p, t);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("mlxspec fused layer: this primitive runs on the CPU stream only");
  }

  const char* name() const override { return "MlxspecFusedDecoderLayer"; }

  bool is_equivalent(const mx::Primitive&) const override { return false; }  // offsets differ per step

 private:
  LayerParams p_;
  LayerTypes t_;
};

static mx::Dtype float_type(const mx::array& a, const char* what) {
  if (a.dtype() != mx::float32 && a.dtype() != mx::float16 && a.dtype() != mx::bfloat16)
    throw std::invalid_argument(std::string("mlxspec fused layer: ") + what + " must be float32, float16 or bfloat16");
  return a.dtype();
}

// The dtypes the module path would produce, or an error naming what the fused layer cannot match.
static LayerTypes layer_types(const std::vector<mx::array>& in, const LayerParams& p) {
  LayerTypes t;
  auto bias_of = [&](int proj) -> const mx::array* {
    int slot = kBias0;
    for (int i = 0; i < proj; ++i) slot += p.bias[i];
    return p.bias[proj] ? &in[slot] : nullptr;
  };
  auto proj_type = [&](mx::Dtype x, int proj) {
    t.qmm[proj] = mx::promote_types(x, float_type(in[kW0 + 3 * proj + 1], "scales"));
    const mx::array* b = bias_of(proj);
    return b ? mx::promote_types(t.qmm[proj], float_type(*b, "biases")) : t.qmm[proj];
  };
  t.n1 = mx::promote_types(float_type(in[kX], "x"), float_type(in[kNorm1], "norm weights"));
  for (int i : {kQ, kK, kV}) t.proj[i] = proj_type(t.n1, i);
  if (t.proj[kQ] != t.proj[kK] || t.proj[kQ] != t.proj[kV])
    throw std::invalid_argument("mlxspec fused layer: q, k and v projections have different dtypes");
  if (p.qk_norm && (mx::promote_types(t.proj[kQ], float_type(in[qk_norm_slot(p)], "q_norm")) != t.proj[kQ] ||
                    mx::promote_types(t.proj[kK], float_type(in[qk_norm_slot(p) + 1], "k_norm")) != t.proj[kK]))
    throw std::invalid_argument("mlxspec fused layer: q_norm/k_norm would change the attention dtype");
  t.kv = float_type(in[kKeys_], "the KV cache");
  if (in[kValues].dtype() != t.kv)
    throw std::invalid_argument("mlxspec fused layer: the cache's keys and values have different dtypes");
  if (t.kv != t.proj[kK] && !(t.proj[kK] == mx::float32 && t.kv == mx::float16))
    throw std::invalid_argument("mlxspec fused layer: the KV cache's dtype differs from the keys' (and is not a float16 cache of float32 keys)");
  t.proj[kO] = proj_type(t.proj[kQ], kO);
  if (p.gemma) t.pa = mx::promote_types(t.proj[kO], float_type(in[post_norm_slot(p)], "post-attention norm"));
  t.h = mx::promote_types(p.gemma ? t.pa : t.proj[kO], in[kX].dtype());
  t.n2 = mx::promote_types(t.h, float_type(in[kNorm2], "norm weights"));
  t.proj[kGate] = proj_type(t.n2, kGate);
  t.proj[kUp] = proj_type(t.n2, kUp);
  t.act = mx::promote_types(t.proj[kGate], t.proj[kUp]);
  t.proj[kDown] = proj_type(t.act, kDown);
  if (p.gemma) t.pf = mx::promote_types(t.proj[kDown], float_type(in[post_norm_slot(p) + 1], "post-feedforward norm"));
  t.out = mx::promote_types(t.h, p.gemma ? t.pf : t.proj[kDown]);
  return t;
}

static void check_shapes(const std::vector<mx::array>& in, const LayerParams& p) {
  const auto& x = in[kX];
  if (x.ndim() != 3 || x.shape(0) != 1 || x.shape(1) < 1) throw std::invalid_argument("mlxspec fused layer: x must be (1, L, D)");
  const int D = x.shape(2), KV = p.kv_heads, Dh = p.head_dim;
  auto cols = [&](int proj) { return int(in[kW0 + 3 * proj].shape(0)); };
  auto rows_in = [&](int proj) { return int(int64_t(in[kW0 + 3 * proj].shape(1)) * 32 / p.bits[proj]); };
  for (int i = 0; i < kProjs; ++i) {
    const auto &w = in[kW0 + 3 * i], &s = in[kW0 + 3 * i + 1], &b = in[kW0 + 3 * i + 2];
    if ((p.bits[i] != 4 && p.bits[i] != 8) || p.group[i] % kBlock || w.dtype() != mx::uint32 || w.ndim() != 2)
      throw std::invalid_argument("mlxspec fused layer: projections must be 4/8-bit with groups of a multiple of 32");
    if (rows_in(i) % p.group[i] || s.shape() != mx::Shape{w.shape(0), rows_in(i) / p.group[i]} || b.shape() != s.shape() ||
        b.dtype() != s.dtype())
      throw std::invalid_argument("mlxspec fused layer: scales/biases do not match a projection");
    if (w.shape(0) % p.pack[i]) throw std::invalid_argument("mlxspec fused layer: a packed projection's N % pack != 0");
  }
  if (p.heads % KV || cols(kQ) != p.heads * Dh || cols(kK) != KV * Dh || cols(kV) % KV || cols(kV) / KV != Dh)
    throw std::invalid_argument("mlxspec fused layer: head counts do not match the projections (or value dim != key dim)");
  if (rows_in(kQ) != D || rows_in(kK) != D || rows_in(kV) != D || rows_in(kO) != cols(kQ) || cols(kO) != D ||
      rows_in(kGate) != D || rows_in(kUp) != D || cols(kGate) != cols(kUp) || rows_in(kDown) != cols(kGate) || cols(kDown) != D)
    throw std::invalid_argument("mlxspec fused layer: projection shapes do not chain");
  if (in[kNorm1].shape() != mx::Shape{D} || in[kNorm2].shape() != mx::Shape{D})
    throw std::invalid_argument("mlxspec fused layer: norm weights must be (D,)");
  if (p.rope_dims <= 0 || p.rope_dims % 2 || p.rope_dims > Dh || in[kInvFreq].dtype() != mx::float32 ||
      in[kInvFreq].shape() != mx::Shape{p.rope_dims / 2})
    throw std::invalid_argument("mlxspec fused layer: inv_freq must be float32 (rope_dims / 2,)");
  for (int c : {kKeys_, kValues}) {
    const auto& a = in[c];
    if (a.ndim() != 4 || a.shape(0) != 1 || a.shape(1) != KV || a.shape(3) != Dh || a.shape(2) < p.offset)
      throw std::invalid_argument("mlxspec fused layer: cache must be (1, KV, >= offset, head_dim)");
  }
  int slot = kBias0;
  for (int i = 0; i < kProjs; ++i)
    if (p.bias[i] && (slot >= int(in.size()) || in[slot++].shape() != mx::Shape{cols(i)}))
      throw std::invalid_argument("mlxspec fused layer: a bias does not match its projection");
  if (p.qk_norm) {
    for (int i = 0; i < 2; ++i)
      if (slot >= int(in.size()) || in[slot++].shape() != mx::Shape{Dh})
        throw std::invalid_argument("mlxspec fused layer: q_norm/k_norm weights must be (head_dim,)");
  }
  if (p.gemma) {
    for (int i = 0; i < 2; ++i)
      if (slot >= int(in.size()) || in[slot++].shape() != mx::Shape{D})
        throw std::invalid_argument("mlxspec fused layer: post-attention/post-feedforward norm weights must be (D,)");
  }
  if (slot != int(in.size())) throw std::invalid_argument("mlxspec fused layer: more inputs than biases and norms declared");
}

static void set_tree(LayerParams& p, const std::vector<int>& parents, int L) {
  if (int(parents.size()) != L || L > kMaxTree || parents[0] != -1)
    throw std::invalid_argument("mlxspec fused layer: a tree needs one parent per row (<= 64 rows), -1 for row 0");
  p.tree = true;
  p.depth[0] = 0, p.visible[0] = 1;
  for (int m = 1; m < L; ++m) {
    const int up = parents[m];
    if (up < 0 || up >= m) throw std::invalid_argument("mlxspec fused layer: a tree row's parent must come before it");
    p.depth[m] = p.depth[up] + 1;
    p.visible[m] = p.visible[up] | (uint64_t(1) << m);
  }
}

// A layer's fixed inputs and sizes, bound once; each call adds x, the KV cache and the offset.
class FusedLayer {
 public:
  FusedLayer(std::vector<mx::array> fixed, int heads, int kv_heads, int head_dim, int rope_dims, bool traditional,
             float rope_scale, float attn_scale, float eps1, float eps2, const std::vector<int>& groups,
             const std::vector<int>& bits, const std::vector<int>& bias, int isa, float qk_norm_eps, bool q8,
             const std::vector<float>& post_norm_eps, const std::vector<int>& packs,
             const std::vector<float>& bias_of_scale)
      : fixed_(std::move(fixed)) {
    if (groups.size() != kProjs || bits.size() != kProjs || bias.size() != kProjs)
      throw std::invalid_argument("mlxspec fused layer: 7 projections (q, k, v, o, gate, up, down)");
    if (heads <= 0 || kv_heads <= 0 || head_dim <= 0) throw std::invalid_argument("mlxspec fused layer: bad sizes");
    p_.heads = heads, p_.kv_heads = kv_heads, p_.head_dim = head_dim, p_.rope_dims = rope_dims;
    p_.traditional = traditional, p_.rope_scale = rope_scale, p_.attn_scale = attn_scale, p_.eps1 = eps1, p_.eps2 = eps2;
    p_.qk_norm = qk_norm_eps >= 0, p_.eps_qk = qk_norm_eps, p_.q8 = q8;
    if (!post_norm_eps.empty() && (post_norm_eps.size() != 2 || !p_.qk_norm))
      throw std::invalid_argument("mlxspec fused layer: gemma takes 2 post-norm eps and q/k norms");
    p_.gemma = !post_norm_eps.empty();
    if (p_.gemma) p_.eps_pa = post_norm_eps[0], p_.eps_pf = post_norm_eps[1];
    for (int i = 0; i < kProjs; ++i) p_.group[i] = groups[i], p_.bits[i] = bits[i], p_.bias[i] = bias[i] != 0;
    if (!packs.empty() && (packs.size() != kProjs || !q8))
      throw std::invalid_argument("mlxspec fused layer: packs: one per projection, with q8");
    for (int i = 0; i < int(packs.size()); ++i) {
      if (packs[i] < 1) throw std::invalid_argument("mlxspec fused layer: packs must be >= 1");
      p_.pack[i] = packs[i];
    }
    if (!bias_of_scale.empty() && (bias_of_scale.size() != kProjs || !q8))
      throw std::invalid_argument("mlxspec fused layer: bias_of_scale: one per projection, with q8");
    for (int i = 0; i < int(bias_of_scale.size()); ++i) p_.bias_of_scale[i] = bias_of_scale[i];
    Isa chosen = isa < 0 ? best_isa() : Isa(isa);
    if (!isa_compiled(chosen)) throw std::invalid_argument("mlxspec fused layer: that ISA is not compiled in");
    p_.isa = int(chosen);
    // fixed = norm1, (w, scales, biases) x 7, norm2, inv_freq, biases, q/k norms: x and the cache go in between
    if (int(fixed_.size()) < kKeys_ - 1) throw std::invalid_argument("mlxspec fused layer: too few fixed inputs");
  }

  // x (1, L, D), cache keys/values (1, KV, >= offset + L, Dh) -> [out (1, L, D), keys', values'] where
  // keys' = keys with this step's rows written at [offset, offset + L) (a SliceUpdate, as mlx-lm's).
  // parents (optional, L entries): row m's parent row (-1 for row 0, else < m): a tree pass.
  // position (rope; -1: offset), key_start (first cache row attention reads), window (0: none): a window cache's.
  // offset: an int, or an int32 array holding one (read when the step runs: a compiled step's position;
  // then no key_start, and the buffers must have room for the rows from it). With a window, a compiled
  // step's sliding layer: position is an array too (its buffer's rows and the positions differ), and
  // attention reads from the row a window cache would return from (offset - min(offset, window - 1)).
  std::vector<mx::array> operator()(const mx::array& x, const mx::array& keys, const mx::array& values,
                                    const std::variant<int, mx::array>& at, const std::vector<int>& parents,
                                    const std::variant<int, mx::array>& position, int key_start, int window) {
    const bool dynamic = std::holds_alternative<mx::array>(at);
    const bool dynamic_position = std::holds_alternative<mx::array>(position);
    const int fixed_position = dynamic_position ? -1 : std::get<int>(position);
    const int offset = dynamic ? 0 : std::get<int>(at);
    std::vector<mx::array> in;
    in.reserve(fixed_.size() + 3);
    in.push_back(x);
    in.insert(in.end(), fixed_.begin(), fixed_.begin() + (kKeys_ - 1));
    in.push_back(keys);
    in.push_back(values);
    in.insert(in.end(), fixed_.begin() + (kKeys_ - 1), fixed_.end());
    LayerParams p = p_;
    if (offset < 0) throw std::invalid_argument("mlxspec fused layer: negative offset");
    p.offset = offset;
    if (key_start < 0 || key_start > offset || window < 0)
      throw std::invalid_argument("mlxspec fused layer: key_start must be in [0, offset] and window >= 0");
    p.position = fixed_position < 0 ? offset : fixed_position, p.key_start = key_start, p.window = window;
    if (!parents.empty() && (window || key_start)) throw std::invalid_argument("mlxspec fused layer: no tree over a window");
    if (!parents.empty()) set_tree(p, parents, x.shape(1));
    if (dynamic && (fixed_position >= 0 || key_start || (window > 0) != dynamic_position))
      throw std::invalid_argument("mlxspec fused layer: an array offset takes no key_start, and an array position "
                                  "exactly with a window");
    if (dynamic_position && !dynamic) throw std::invalid_argument("mlxspec fused layer: an array position needs an array offset");
    check_shapes(in, p);
    LayerTypes t = layer_types(in, p);
    const int L = x.shape(1), D = x.shape(2), KV = p.kv_heads, Dh = p.head_dim;
    if (keys.shape(2) < offset + L) throw std::invalid_argument("mlxspec fused layer: no room in the cache");
    auto stream = mx::default_stream(mx::Device::cpu);
    if (dynamic) {
      const auto& a = std::get<mx::array>(at);
      if (a.size() != 1) throw std::invalid_argument("mlxspec fused layer: an array offset holds one number");
      p.dynamic = true;
      in.push_back(mx::reshape(mx::astype(a, mx::int32, stream), {1}, stream));
    }
    if (dynamic_position) {  // after the offset: read (and popped) first
      const auto& a = std::get<mx::array>(position);
      if (a.size() != 1) throw std::invalid_argument("mlxspec fused layer: an array position holds one number");
      p.dynamic_position = true;
      in.push_back(mx::reshape(mx::astype(a, mx::int32, stream), {1}, stream));
    }
    auto outs = mx::array::make_arrays({{1, L, D}, {1, KV, L, Dh}, {1, KV, L, Dh}}, {t.out, t.kv, t.kv},
                                       std::make_shared<FusedDecoderLayer>(stream, p, t), in);
    if (dynamic) {  // written where the step runs, as step_graph.KVView writes
      const auto& start = in[in.size() - (dynamic_position ? 2 : 1)];
      return {outs[0], mx::slice_update(keys, outs[1], start, {2}, stream), mx::slice_update(values, outs[2], start, {2}, stream)};
    }
    const mx::Shape start{0, 0, offset, 0}, stop{1, KV, offset + L, Dh};
    return {outs[0], mx::slice_update(keys, outs[1], start, stop, stream), mx::slice_update(values, outs[2], start, stop, stream)};
  }

 private:
  std::vector<mx::array> fixed_;
  LayerParams p_;
};

void register_fused_layer(nb::module_& m) {
  nb::class_<FusedLayer>(m, "FusedLayer", "One llama-family decoder layer in one primitive (see fused_layer.cpp).")
      .def(nb::init<std::vector<mx::array>, int, int, int, int, bool, float, float, float, float, const std::vector<int>&,
                    const std::vector<int>&, const std::vector<int>&, int, float, bool, const std::vector<float>&,
                    const std::vector<int>&, const std::vector<float>&>(),
           nb::arg("fixed"), nb::arg("heads"), nb::arg("kv_heads"), nb::arg("head_dim"), nb::arg("rope_dims"),
           nb::arg("traditional"), nb::arg("rope_scale"), nb::arg("attn_scale"), nb::arg("eps1"), nb::arg("eps2"),
           nb::arg("groups"), nb::arg("bits"), nb::arg("bias"), nb::arg("isa") = -1, nb::arg("qk_norm_eps") = -1.0f,
           nb::arg("q8") = false, nb::arg("post_norm_eps") = std::vector<float>{}, nb::arg("packs") = std::vector<int>{},
           nb::arg("bias_of_scale") = std::vector<float>{},
           "qk_norm_eps >= 0: qwen3's per-head q_norm and k_norm (their weights follow the biases in `fixed`); "
           "q8: int8 activations in every projection (as the q8 qmm); post_norm_eps (2 values): gemma3's "
           "sandwich norms (weights after the q/k norms) and GeGLU; packs (7 values, q8): each projection's "
           "QmmProblem::pack; bias_of_scale (7 values, q8): each projection's QmmProblem::bias_of_scale")
      .def("__call__", &FusedLayer::operator(), nb::arg("x"), nb::arg("keys"), nb::arg("values"), nb::arg("offset"),
           nb::arg("parents") = std::vector<int>{}, nb::arg("position") = -1, nb::arg("key_start") = 0,
           nb::arg("window") = 0, "[out, keys with this step's rows written, values likewise]");
}

}  // namespace mlxspec
