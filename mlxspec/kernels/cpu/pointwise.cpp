// MLX primitives for pointwise_kernel.h (CPU stream only), registered into the extension module:
//
//   rms_norm(x (..., D), weight (D,), eps)                      -> promote(x, weight)
//   rope(x (..., T, D), inv_freq (dims/2,) fp32, dims, traditional, scale, offset) -> x's dtype
//   swiglu(gate, up)  (same shape)                              -> promote(gate, up)
//   geglu(gate, up)   gelu_approx(gate) * up, likewise (gemma2/3's MLP; fp32 inside, rounded once)
//
// Inputs may be any strided view; outputs are contiguous. Semantics are MLX's (mlx/fast.cpp's
// fallbacks, mlx-lm's swiglu), including the casts MLX makes between steps.
#include <stdexcept>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <optional>
#include <nanobind/stl/variant.h>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"

#include "mlx_io.h"
#include "pointwise_kernel.h"

namespace nb = nanobind;

namespace mlxspec {

enum class PwOp : int { rms_norm = 0, rope = 1, swiglu = 2, geglu = 3 };

struct PwParams {
  float eps = 0, scale = 1;
  int dims = 0, offset = 0;
  bool traditional = false;
  bool operator==(const PwParams& o) const {
    return eps == o.eps && scale == o.scale && dims == o.dims && offset == o.offset && traditional == o.traditional;
  }
};

static void rms_norm_rows(const mx::array& x, const mx::array& w, float eps, mx::array& out) {
  const int D = x.shape(-1);
  const int64_t rows = x.size() / D;
  std::vector<float> xr(D), wr(D), y(D);
  row_to_f32(w, 0, wr.data());
  const mx::Dtype t = out.dtype();
  for (int64_t r = 0; r < rows; ++r) {
    row_to_f32(x, r, xr.data());
    rms_norm_row(xr.data(), wr.data(), D, eps, [t](float v) { return round_to(v, t); }, y.data());
    store_f32(y.data(), D, out, size_t(r) * D);
  }
}

static void rope_rows(const mx::array& x, const mx::array& inv_freq, const PwParams& p, mx::array& out) {
  const int D = x.shape(-1), T = x.shape(-2), half = p.dims / 2;
  const int64_t rows = x.size() / D;
  const mx::Dtype t = out.dtype();
  std::vector<float> c(size_t(T) * half), s(size_t(T) * half), xr(D), y(D);
  std::vector<float> f(half);
  row_to_f32(inv_freq, 0, f.data());
  for (int i = 0; i < T; ++i)  // MLX: positions (arange(T) + offset) * scale; cos/sin cast to x's dtype
    rope_angles_rounded((float(i) + float(p.offset)) * p.scale, f.data(), half, [t](float v) { return round_to(v, t); },
                        c.data() + size_t(i) * half, s.data() + size_t(i) * half);
  for (int64_t r = 0; r < rows; ++r) {
    const int i = int(r % T);
    row_to_f32(x, r, xr.data());
    rope_row(xr.data(), y.data(), D, p.dims, p.traditional, c.data() + size_t(i) * half, s.data() + size_t(i) * half);
    store_f32(y.data(), D, out, size_t(r) * D);
  }
}

// y = act(g) * u row by row: swiglu_span or geglu_span
template <class Span>
static void gated_rows(const mx::array& g, const mx::array& u, mx::array& out, Span span) {
  const int D = g.shape(-1);
  const int64_t rows = g.size() / D;
  std::vector<float> gr(D), ur(D), y(D);
  for (int64_t r = 0; r < rows; ++r) {
    row_to_f32(g, r, gr.data());
    row_to_f32(u, r, ur.data());
    span(gr.data(), ur.data(), y.data(), D);
    store_f32(y.data(), D, out, size_t(r) * D);
  }
}

class Pointwise : public mx::UnaryPrimitive {
 public:
  Pointwise(mx::Stream s, PwOp op, PwParams p) : mx::UnaryPrimitive(s), op_(op), p_(p) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (auto& a : inputs) enc.set_input_array(a);
    enc.set_output_array(out);
    const bool at = inputs.size() == 3;  // rope with its offset as an array (a compiled step's position)
    enc.dispatch([a = mx::array::unsafe_weak_copy(inputs[0]), b = mx::array::unsafe_weak_copy(inputs[1]),
                  position = mx::array::unsafe_weak_copy(at ? inputs[2] : inputs[0]), at,
                  out = mx::array::unsafe_weak_copy(out), op = op_, p = p_]() mutable {
      if (at) p.offset += position.data<int32_t>()[0];
      if (op == PwOp::rms_norm) rms_norm_rows(a, b, p.eps, out);
      else if (op == PwOp::rope) rope_rows(a, b, p, out);
      else if (op == PwOp::swiglu) gated_rows(a, b, out, swiglu_span);
      else gated_rows(a, b, out, geglu_span);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error("mlxspec pointwise kernels run on the CPU stream only");
  }

  const char* name() const override { return "MlxspecPointwise"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const Pointwise&>(other);
    return op_ == o.op_ && p_ == o.p_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override { return {inputs[0].shape()}; }

 private:
  PwOp op_;
  PwParams p_;
};

static void check_float(const mx::array& a, const char* what) {
  if (a.dtype() != mx::float32 && a.dtype() != mx::float16 && a.dtype() != mx::bfloat16)
    throw std::invalid_argument(std::string("mlxspec ") + what + ": inputs must be float32, float16 or bfloat16");
}

static mx::Stream cpu_stream(mx::StreamOrDevice s) {
  auto stream = mx::to_stream(s, mx::Device::cpu);
  if (stream.device != mx::Device::cpu) throw std::invalid_argument("mlxspec pointwise kernels: CPU streams only");
  return stream;
}

static mx::array rms_norm(const mx::array& x, const mx::array& w, float eps, mx::StreamOrDevice s) {
  check_float(x, "rms_norm");
  check_float(w, "rms_norm");
  if (x.ndim() < 1 || w.ndim() != 1 || w.shape(0) != x.shape(-1))
    throw std::invalid_argument("mlxspec rms_norm: weight must be (D,) for x (..., D)");
  auto out_type = mx::promote_types(x.dtype(), w.dtype());
  return mx::array(x.shape(), out_type, std::make_shared<Pointwise>(cpu_stream(s), PwOp::rms_norm, PwParams{eps}), {x, w});
}

static mx::array rope(const mx::array& x, const mx::array& inv_freq, int dims, bool traditional, float scale,
                      int offset, std::optional<mx::array> position, mx::StreamOrDevice s) {
  check_float(x, "rope");
  if (x.ndim() < 2 || dims <= 0 || dims % 2 || dims > x.shape(-1))
    throw std::invalid_argument("mlxspec rope: x must be (..., T, D) with an even dims <= D");
  if (inv_freq.dtype() != mx::float32 || inv_freq.ndim() != 1 || inv_freq.shape(0) != dims / 2)
    throw std::invalid_argument("mlxspec rope: inv_freq must be float32 of shape (dims / 2,)");
  PwParams p;
  p.dims = dims, p.traditional = traditional, p.scale = scale, p.offset = offset;
  auto stream = cpu_stream(s);
  std::vector<mx::array> inputs = {x, inv_freq};
  if (position) {  // added to offset when the step runs: one graph serves every position
    if (position->size() != 1) throw std::invalid_argument("mlxspec rope: position must be one number");
    inputs.push_back(mx::astype(*position, mx::int32, stream));  // any shape holding one number
  }
  return mx::array(x.shape(), x.dtype(), std::make_shared<Pointwise>(stream, PwOp::rope, p), std::move(inputs));
}

static mx::array gated(const mx::array& gate, const mx::array& up, mx::StreamOrDevice s, PwOp op, const char* name) {
  check_float(gate, name);
  check_float(up, name);
  if (gate.shape() != up.shape() || gate.ndim() < 1)
    throw std::invalid_argument(std::string("mlxspec ") + name + ": gate and up must have one shape");
  auto out_type = mx::promote_types(gate.dtype(), up.dtype());
  return mx::array(gate.shape(), out_type, std::make_shared<Pointwise>(cpu_stream(s), op, PwParams{}), {gate, up});
}

static mx::array swiglu(const mx::array& gate, const mx::array& up, mx::StreamOrDevice s) {
  return gated(gate, up, s, PwOp::swiglu, "swiglu");
}

static mx::array geglu(const mx::array& gate, const mx::array& up, mx::StreamOrDevice s) {
  return gated(gate, up, s, PwOp::geglu, "geglu");
}

void register_pointwise(nb::module_& m) {
  m.def("rms_norm", &rms_norm, nb::arg("x"), nb::arg("weight"), nb::arg("eps"), nb::kw_only(),
        nb::arg("stream") = nb::none(), "MLX's rms_norm: (x * rsqrt(mean(x^2) + eps)) * weight, one pass per row.");
  m.def("rope", &rope, nb::arg("x"), nb::arg("inv_freq"), nb::arg("dims"), nb::arg("traditional"), nb::arg("scale"),
        nb::arg("offset"), nb::kw_only(), nb::arg("position") = nb::none(), nb::arg("stream") = nb::none(),
        "MLX's rope with positions (offset [+ position, an array] + t) * scale and the given inverse frequencies.");
  m.def("swiglu", &swiglu, nb::arg("gate"), nb::arg("up"), nb::kw_only(), nb::arg("stream") = nb::none(),
        "silu(gate) * up, one pass.");
  m.def("geglu", &geglu, nb::arg("gate"), nb::arg("up"), nb::kw_only(), nb::arg("stream") = nb::none(),
        "gelu_approx(gate) * up (tanh GELU), one pass.");
}

}  // namespace mlxspec
