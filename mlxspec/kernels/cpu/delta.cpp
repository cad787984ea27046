// The gated delta rule (Qwen3.5's and Qwen3-Next's linear attention) as one MLX primitive (CPU stream only),
// and the short causal conv before it (causal_conv, below):
//
//   gated_delta(q, k (B, T, Hk, Dk), v (B, T, Hv, Dv), g, beta (B, T, Hv), state (B, Hv, Dv, Dk))
//     -> [y (B, T, Hv, Dv), state' (B, Hv, Dv, Dk)]            all float32, row-contiguous inputs
//
// Per value head h (reading key head h / (Hv / Hk), as mlx-lm repeats them) and token t, each row S_i of
// the state is read once and written once:
//     S_i *= g;  d = (v_i - S_i . k) * beta;  S_i += d k;  y_i = S_i . q
// where mlx-lm's ops path makes five passes over the state. A token's arithmetic is the same however
// many tokens a call holds (they run in order), so a verify pass's rows equal one-row steps bit for bit.
#include <stdexcept>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
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

namespace nb = nanobind;

namespace mlxspec {

struct DeltaShape {
  int B, T, Hk, Hv, Dk, Dv;
};

// Dot products in LANES interleaved partial sums, added pairwise at the end: a fixed order of the same IEEE
// operations that the compiler may run as vectors (no reassociation: -ffp-contract=off, no fast-math).
constexpr int LANES = 16;

static inline float lanes_sum(float* a) {
  for (int w = LANES / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) a[l] += a[l + w];
  return a[0];
}

// One value head over all tokens: state rows (Dv, Dk) in place, y rows written per token.
static void delta_head(const DeltaShape& s, int b, int h, const float* q, const float* k, const float* v,
                       const float* g, const float* beta, float* S, float* y) {
  const int hk = h / (s.Hv / s.Hk);
  for (int t = 0; t < s.T; ++t) {
    const size_t tok = size_t(b) * s.T + t;
    const float* kt = k + (tok * s.Hk + hk) * s.Dk;
    const float* qt = q + (tok * s.Hk + hk) * s.Dk;
    const float* vt = v + (tok * s.Hv + h) * s.Dv;
    const float gt = g[tok * s.Hv + h], bt = beta[tok * s.Hv + h];
    float* yt = y + (tok * s.Hv + h) * s.Dv;
    for (int i = 0; i < s.Dv; ++i) {
      float* row = S + size_t(i) * s.Dk;
      float acc[LANES] = {}, out[LANES] = {};
      int j = 0;
      for (; j + LANES <= s.Dk; j += LANES)  // element j always adds into lane j % LANES
        for (int l = 0; l < LANES; ++l) {
          row[j + l] *= gt;
          acc[l] += row[j + l] * kt[j + l];
        }
      for (int l = 0; j + l < s.Dk; ++l) {
        row[j + l] *= gt;
        acc[l] += row[j + l] * kt[j + l];
      }
      const float d = (vt[i] - lanes_sum(acc)) * bt;
      for (j = 0; j + LANES <= s.Dk; j += LANES)
        for (int l = 0; l < LANES; ++l) {
          row[j + l] += d * kt[j + l];
          out[l] += row[j + l] * qt[j + l];
        }
      for (int l = 0; j + l < s.Dk; ++l) {
        row[j + l] += d * kt[j + l];
        out[l] += row[j + l] * qt[j + l];
      }
      yt[i] = lanes_sum(out);
    }
  }
}

class GatedDelta : public mx::Primitive {
 public:
  explicit GatedDelta(mx::Stream s) : mx::Primitive(s) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    for (auto& o : outputs) o.set_data(mx::allocator::malloc(o.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (auto& a : inputs) enc.set_input_array(a);
    for (auto& o : outputs) enc.set_output_array(o);
    std::vector<mx::array> in, out;
    for (auto& a : inputs) in.push_back(mx::array::unsafe_weak_copy(a));
    for (auto& o : outputs) out.push_back(mx::array::unsafe_weak_copy(o));
    enc.dispatch([in = std::move(in), out = std::move(out)]() mutable {
      const auto& q = in[0];
      const auto& v = in[2];
      const auto& st = in[5];
      DeltaShape s{int(q.shape(0)), int(q.shape(1)), int(q.shape(2)), int(v.shape(2)), int(q.shape(3)), int(v.shape(3))};
      const size_t head = size_t(s.Dv) * s.Dk;
      float* S = out[1].data<float>();
      std::copy(st.data<float>(), st.data<float>() + st.size(), S);  // then updated in place, head by head
      const int heads = s.B * s.Hv;
      const bool tiny = size_t(heads) * s.T * head < (1 << 15);  // not worth waking the pool
      pool().run(tiny ? 1 : heads, [&](int c) {  // heads are independent: a split changes no arithmetic
        const int first = tiny ? 0 : c, last = tiny ? heads : c + 1;
        for (int bh = first; bh < last; ++bh)
          delta_head(s, bh / s.Hv, bh % s.Hv, in[0].data<float>(), in[1].data<float>(), in[2].data<float>(),
                     in[3].data<float>(), in[4].data<float>(), S + size_t(bh) * head, out[0].data<float>());
      });
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("mlxspec gated_delta runs on the CPU stream only");
  }

  const char* name() const override { return "MlxspecGatedDelta"; }

  bool is_equivalent(const mx::Primitive&) const override { return true; }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    auto y = inputs[2].shape();  // (B, T, Hv, Dv)
    return {y, inputs[5].shape()};
  }
};

static std::vector<mx::array> gated_delta(const mx::array& q, const mx::array& k, const mx::array& v,
                                          const mx::array& g, const mx::array& beta, const mx::array& state,
                                          mx::StreamOrDevice sd) {
  auto s = mx::to_stream(sd, mx::Device::cpu);
  if (s.device != mx::Device::cpu) throw std::invalid_argument("mlxspec gated_delta: CPU streams only");
  for (const mx::array* a : {&q, &k, &v, &g, &beta, &state}) {
    if (a->dtype() != mx::float32) throw std::invalid_argument("mlxspec gated_delta: float32 inputs only");
    if (!a->flags().row_contiguous) throw std::invalid_argument("mlxspec gated_delta: row-contiguous inputs only");
  }
  if (q.ndim() != 4 || k.shape() != q.shape() || v.ndim() != 4 || v.shape(0) != q.shape(0) || v.shape(1) != q.shape(1)
      || v.shape(2) % q.shape(2) || g.shape() != mx::Shape{v.shape(0), v.shape(1), v.shape(2)} || beta.shape() != g.shape()
      || state.shape() != mx::Shape{v.shape(0), v.shape(2), v.shape(3), q.shape(3)})
    throw std::invalid_argument("mlxspec gated_delta: q, k (B, T, Hk, Dk), v (B, T, Hv, Dv), g, beta (B, T, Hv), "
                                "state (B, Hv, Dv, Dk) with Hk dividing Hv");
  auto prim = std::make_shared<GatedDelta>(s);
  return mx::array::make_arrays({v.shape(), state.shape()}, {mx::float32, mx::float32}, prim, {q, k, v, g, beta, state});
}

// The delta-net layers' short causal conv, depthwise: y[b, t, c] = sum_j w[c, j] * x[b, t + j, c], the taps
// added in order j = 0 .. K-1 (so each output has the same arithmetic however many rows a call holds).
class CausalConv : public mx::UnaryPrimitive {
 public:
  explicit CausalConv(mx::Stream s) : mx::UnaryPrimitive(s) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (auto& a : inputs) enc.set_input_array(a);
    enc.set_output_array(out);
    enc.dispatch([x = mx::array::unsafe_weak_copy(inputs[0]), w = mx::array::unsafe_weak_copy(inputs[1]),
                  out = mx::array::unsafe_weak_copy(out)]() mutable {
      const int B = int(out.shape(0)), L = int(out.shape(1)), C = int(out.shape(2)), K = int(w.shape(1));
      const float* xs = x.data<float>();
      const float* ws = w.data<float>();
      float* ys = out.data<float>();
      std::vector<float> wt(size_t(K) * C);  // (K, C): tap j's weights contiguous over channels
      for (int c = 0; c < C; ++c)
        for (int j = 0; j < K; ++j) wt[size_t(j) * C + c] = ws[size_t(c) * K + j];
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < L; ++t) {
          float* y = ys + (size_t(b) * L + t) * C;
          const float* x0 = xs + (size_t(b) * (L + K - 1) + t) * C;
          for (int c = 0; c < C; ++c) y[c] = x0[c] * wt[c];
          for (int j = 1; j < K; ++j) {
            const float* xj = x0 + size_t(j) * C;
            const float* wj = wt.data() + size_t(j) * C;
            for (int c = 0; c < C; ++c) y[c] += xj[c] * wj[c];
          }
        }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("mlxspec causal_conv runs on the CPU stream only");
  }

  const char* name() const override { return "MlxspecCausalConv"; }

  bool is_equivalent(const mx::Primitive&) const override { return true; }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {{inputs[0].shape(0), inputs[0].shape(1) - inputs[1].shape(1) + 1, inputs[0].shape(2)}};
  }
};

static mx::array causal_conv(const mx::array& x, const mx::array& w, mx::StreamOrDevice sd) {
  auto s = mx::to_stream(sd, mx::Device::cpu);
  if (s.device != mx::Device::cpu) throw std::invalid_argument("mlxspec causal_conv: CPU streams only");
  for (const mx::array* a : {&x, &w}) {
    if (a->dtype() != mx::float32) throw std::invalid_argument("mlxspec causal_conv: float32 inputs only");
    if (!a->flags().row_contiguous) throw std::invalid_argument("mlxspec causal_conv: row-contiguous inputs only");
  }
  if (x.ndim() != 3 || w.ndim() != 2 || w.shape(0) != x.shape(2) || x.shape(1) < w.shape(1))
    throw std::invalid_argument("mlxspec causal_conv: x (B, L + K - 1, C) and w (C, K)");
  mx::Shape shape{x.shape(0), x.shape(1) - w.shape(1) + 1, x.shape(2)};
  return mx::array(shape, mx::float32, std::make_shared<CausalConv>(s), {x, w});
}

void register_delta(nb::module_& m) {
  m.def("causal_conv", &causal_conv, nb::arg("x"), nb::arg("w"), nb::kw_only(), nb::arg("stream") = nb::none(),
        "Depthwise causal conv, no padding: (B, L + K - 1, C) with (C, K) taps -> (B, L, C).");
  m.def("gated_delta", &gated_delta, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"),
        nb::arg("state"), nb::kw_only(), nb::arg("stream") = nb::none(),
        "The gated delta rule over T tokens: (y, new state); each state row read and written once a token.");
}

}  // namespace mlxspec
