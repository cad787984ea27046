"""Metal's verify rows with the bits of MLX's own one-row qmm (kernels/mlx_rows.py), as far as this CPU allows.

Under the CPU emulator (emulator/gpu_emulator.h) two programs run: MLX's `qmv_fast_impl` itself, pasted from the
installed MLX's quantized.h, once per x row (its one-row call: threadgroup x = the row), and mlxspec's kernel as
`mx.fast.metal_kernel` would generate it, over 16 rows and over 5. Every row must carry MLX's bits, and be within
the reference's tolerance. On a Mac the registry's self-check compares with MLX's real call instead. The wrapper
and the layer choice are tested with stand-ins.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from emulator_harness import C_TYPES, CXX, build_all, from_np, run, save
from mlxspec.kernels import mlx_rows
from mlxspec.kernels.build import KernelUnavailable
from mlxspec.kernels.gpu_codegen import metal_function
from mlxspec.kernels.reference import within_tolerance

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")

N, ROWS, FEW = 24, 16, 5  # 3 threadgroups of 8 outputs

PROGRAM = """
#include <algorithm>
using std::clamp;
using std::min;
#define METAL_FUNC inline
static constexpr int SIMD_SIZE = 32;
template <typename U> inline U select(U a, U b, bool c) {{ return c ? b : a; }}
{helpers}
{mlx_impl}
{ours}
using T = {T}; using S = {S};
std::vector<T> mlx_rows(const T* x, int M, const uint32_t* w, const S* s_, const S* b_, int K) {{  // MLX: a call a row
  std::vector<T> y(size_t(M) * {N}), s(s_, s_ + size_t({N}) * K / {G}), b(b_, b_ + size_t({N}) * K / {G});  // cast to T
  for (int r = 0; r < M; ++r)
    emu::run_grid(2 * ({N} / 8), 1, [&](int lane, int warp, int) {{
      {mlx_call}(w, s.data(), b.data(), x + size_t(r) * K, y.data() + size_t(r) * {N}, K, {N},
                                           uint3{{0, unsigned(warp / 2), 0}}, warp % 2, lane);
    }});
  return y;
}}
std::vector<T> ours(const T* x, int M, const uint32_t* w, const S* s, const S* b, int K) {{  // one launch, M rows
  std::vector<T> y(size_t(M) * {N});
  int xs[2] = {{M, K}}, ws[2] = {{{N}, K * {BITS} / 32}};
  const int capacity = M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : M <= 8 ? 8 : 16;
  emu::run_grid(2 * ({N} / 8), 1, [&](int lane, int warp, int) {{
    const uint3 at{{0, unsigned(warp / 2), 0}};
    switch (capacity) {{
{cases}
    }}
  }});
  return y;
}}
int main(int argc, char** argv) {{
  const std::string d = argv[1];
  const int K = std::atoi(argv[2]);
  auto x = load<T>(d + "/x", size_t({M}) * K);
  auto w = load<uint32_t>(d + "/w", size_t({N}) * K * {BITS} / 32);
  auto s = load<S>(d + "/s", size_t({N}) * K / {G});
  auto b = load<S>(d + "/b", size_t({N}) * K / {G});
  std::ofstream out(d + "/y", std::ios::binary);
  save(out, mlx_rows(x.data(), {M}, w.data(), s.data(), b.data(), K));
  save(out, ours(x.data(), {M}, w.data(), s.data(), b.data(), K));
  save(out, ours(x.data(), {FEW}, w.data(), s.data(), b.data(), K));
}}
"""
CASE = ("        case {r}: {fname}<T, S, {G}, {BITS}, {r}, {FAST}>(x, xs, w, ws, s, b, y.data(), warp % 2, lane, at); break;")
CASES = [  # (x dtype, scales dtype, group size, bits, K): qmv_fast's (K a multiple of its block), qmv's
    (mx.float16, mx.float16, 64, 4, 1024),
    (mx.bfloat16, mx.bfloat16, 32, 8, 512),
    (mx.float32, mx.float32, 128, 4, 512),
    (mx.float16, mx.float16, 64, 4, 576),  # SmolLM2's hidden size: qmv, its last block bounds-checked
    (mx.bfloat16, mx.bfloat16, 32, 8, 800),  # qmv: a last block of 32 lanes x 4 values, part-filled
    (mx.float32, mx.float32, 64, 4, 768),  # qmv over whole blocks: its last one still through the safe path
    (mx.float32, mx.float16, 32, 4, 576),  # a GGUF's rows (float32) over float16 scales: MLX casts the scales up
    (mx.float32, mx.bfloat16, 64, 8, 1024),
]


def program(dtype, scale_dtype, group_size: int, bits: int, k: int) -> str:
    text = mlx_rows.mlx_metal_header()
    impl = mlx_rows._function(text, "METAL_FUNC void qmv_fast_impl(", "METAL_FUNC void qmv_wide_impl(")
    fast = mlx_rows.fast(k, bits)
    sizes = dict.fromkeys(mlx_rows.INPUTS, 1 << 20)
    dtypes = {"x": dtype, "w": mx.uint32, "scales": scale_dtype, "biases": scale_dtype}
    targs = mlx_rows.template_args(dtype, scale_dtype, group_size, bits, 1, k)
    fname, ours = metal_function((mlx_rows.NAME, mlx_rows.INPUTS, mlx_rows.OUTPUTS, [dtype]), dtypes, sizes, targs,
                                 mlx_rows.BODY)
    # (the template's name spells its first instantiation's arguments; the harness instantiates each capacity)
    cases = "\n".join(CASE.format(r=r, fname=fname, G=group_size, BITS=bits, FAST=int(fast)) for r in (1, 2, 4, 8, 16))
    mlx_call = f"qmv_fast_impl<T, {group_size}, {bits}, false>" if fast else f"qmv_impl<T, {group_size}, {bits}>"
    return PROGRAM.format(helpers=mlx_rows.header(text), mlx_impl=impl, ours=ours, T=C_TYPES[dtype],
                          S=C_TYPES[scale_dtype], N=N, M=ROWS,
                          FEW=FEW, G=group_size, BITS=bits, cases=cases, mlx_call=mlx_call)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-over-{c[1]}-g{c[2]}-{c[3]}bit-k{c[4]}".replace("mlx.core.", ""))
def test_every_row_carries_the_bits_of_mlx_s_one_row_kernel(tmp_path, case):
    dtype, scale_dtype, group_size, bits, k = case
    (exe,) = build_all([program(dtype, scale_dtype, group_size, bits, k)])
    wf = mx.random.normal((N, k), key=mx.random.key(1)).astype(scale_dtype)
    w, s, b = mx.quantize(wf, group_size=group_size, bits=bits)
    x = mx.random.normal((ROWS, k), key=mx.random.key(2)).astype(dtype)
    save(tmp_path, x=x, w=w, s=s, b=b)
    run(exe, tmp_path, k)
    raw, size = (tmp_path / "y").read_bytes(), ROWS * N * mx.zeros((), dtype).itemsize
    theirs, ours = (from_np(raw[i * size : (i + 1) * size], dtype, (ROWS, N)) for i in range(2))
    few = from_np(raw[2 * size :], dtype, (FEW, N))
    assert mx.array_equal(ours, theirs).item(), "a row differs from MLX's one-row kernel"
    assert mx.array_equal(few, theirs[:FEW]).item(), "a 5-row launch differs from MLX's one-row calls"
    ok, ratio = within_tolerance(ours, x, w, s, b, group_size, bits)
    assert ok, f"error {ratio:.3g}x the tolerance"


def per_row(launches: list):
    """A metal_kernel stand-in computing each row as MLX's one-row call (its launches recorded: rows, template)."""
    def make(name, input_names, output_names, source, header):
        assert "inline U qdot(" in header and "get_pack_factor" in header  # MLX's own helpers, pasted

        def launch(inputs, template, grid, threadgroup, output_shapes, output_dtypes):
            x, w, s, b = inputs
            t = dict(template)
            launches.append((x.shape[0], t["ROWS"], grid))
            return [mx.concatenate([mx.quantized_matmul(x[i : i + 1], w, s, b, group_size=t["G"], bits=t["BITS"])
                                    for i in range(x.shape[0])])]
        return launch
    return make


def layer(n=64, k=512, dtype=mx.float16, group_size=64, bits=4):
    return mx.quantize(mx.random.normal((n, k), key=mx.random.key(3)).astype(dtype), group_size=group_size, bits=bits)


def test_one_row_is_mlx_s_own_call_and_more_rows_one_launch_of_at_most_16():
    launches = []
    qmm = mlx_rows.mlx_rows_function(make=per_row(launches))
    w, s, b = layer()
    x = mx.random.normal((1, 1, 512)).astype(mx.float16)
    assert mx.array_equal(qmm(x, w, s, b, 64, 4), mx.quantized_matmul(x, w, s, b, group_size=64, bits=4)).item()
    assert launches == []  # MLX's op, not the kernel
    y = qmm(mx.random.normal((1, 21, 512)).astype(mx.float16), w, s, b, 64, 4)
    assert y.shape == (1, 21, 64) and launches == [(16, 16, (32, 16, 1)), (5, 8, (32, 16, 1))]  # 8 outputs a group
    f32 = qmm(mx.random.normal((3, 512)), w, s, b, 64, 4)  # float32 rows over float16 scales: computed in float32
    assert f32.dtype == mx.float32 and launches[-1][0] == 3
    with pytest.raises(ValueError):
        qmm(mx.zeros((3, 512), mx.float16), w[:60], s[:60], b[:60], 64, 4)  # 60 outputs: not whole tiles of 8


@pytest.mark.parametrize("n, k, group_size, bits, dtype, ok", [
    (4096, 4096, 64, 4, mx.float16, True), (14336, 4096, 32, 8, mx.bfloat16, True), (1536, 576, 64, 4, mx.float16, True),
    (100, 512, 64, 4, mx.float16, False), (64, 128, 64, 8, mx.float16, False), (64, 512, 64, 3, mx.float16, False),
    (64, 256, 64, 8, mx.float32, True), (64, 96, 32, 4, mx.float16, True), (64, 64, 64, 4, mx.float16, False),
])
def test_it_takes_the_layers_mlx_runs_through_qmv_fast_or_qmv_over_whole_tiles(n, k, group_size, bits, dtype, ok):
    """N a multiple of 8 (whole tiles of 8 outputs), K not 64 / 128 (qmv_quad), 4 or 8 bits."""
    assert mlx_rows.supports(n, k, group_size, bits, dtype) == ok


def test_another_mlx_s_qmv_fast_is_refused_by_name():
    text = mlx_rows.mlx_metal_header()
    assert mlx_rows.header(text).startswith(mlx_rows.mlx_helpers(text))  # the installed MLX's: mirrored
    assert "inline U qdot_thread(\n    const thread uint8_t* w," in mlx_rows.header(text)  # its qdot over registers
    for kernel in ("qmv_fast_impl", "qmv_impl"):
        at = text.index(f"METAL_FUNC void {kernel}(")  # its loop's accumulation, turned around
        changed = text[:at] + text[at:].replace("result[row] += qdot", "result[row] -= qdot", 1)
        with pytest.raises(KernelUnavailable, match="are not the ones this kernel mirrors"):
            mlx_rows.header(changed)


def test_the_self_check_holds_rows_to_mlx_s_one_row_bits():
    launches = []
    qmm = mlx_rows.mlx_rows_function(make=per_row(launches))
    # float32: MLX's CPU op accumulates float16 in float16 (far past the tolerance); Metal's qmv_fast in float
    assert mlx_rows.self_check(qmm, 64, 512, 64, 4, mx.float32) is None

    def off(x, w, s, b, g, bits, mode="affine"):
        y = qmm(x, w, s, b, g, bits)
        return y * 1.001 if x.shape[0] > 1 else y

    assert "differs from MLX's one-row call" in mlx_rows.self_check(off, 64, 512, 64, 4, mx.float32)


@pytest.mark.parametrize("rows_pass", [True, False])
def test_on_metal_a_layer_qmv_fast_serves_takes_mlx_s_rows_where_their_check_passed(monkeypatch, rows_pass):
    """registry.kernel_for_layer on Metal: a layer MLX's qmv_fast or qmv serves over whole tiles gets the
    "qmm-mlx-rows" family where its self-check passed, else the FMA kernel as before; other layers never meet it."""
    from gpu_stand_ins import per_row_qmm, serve
    from mlxspec.kernels import registry

    calls = []
    launches = []
    rows_qmm = mlx_rows.mlx_rows_function(make=per_row(launches))
    wrong = lambda x, w, s, b, g, bits, mode="affine": rows_qmm(x, w, s, b, g, bits) * (1.0 if rows_pass else 1.001)  # noqa: E731
    def no_matrix_units():
        raise KernelUnavailable("no stand-in")

    serve(monkeypatch, {"qmm": lambda: per_row_qmm(calls), "qmm-mma": no_matrix_units,
                        "qmm-mlx-rows": lambda: rows_qmm if rows_pass else wrong})
    monkeypatch.setattr(registry, "device_backend_name", lambda device=None: "metal")
    try:
        qmm, why = registry.kernel_for_layer(64, 512, 64, 4, mx.float32)
        w, s, b = layer(dtype=mx.float32)
        calls.clear(), launches.clear()
        qmm(mx.ones((3, 512)), w, s, b, 64, 4)
        assert (launches and not calls) if rows_pass else (calls and not launches)
        assert list(registry.kernel("qmm-mlx-rows", "metal").checks.values()) == [
            None if rows_pass else "mlx.core.float32 rows: row 0 of a 16-row call differs from MLX's one-row call"]
        calls.clear()
        registry.kernel_for_layer(60, 512, 64, 4, mx.float32)[0](mx.ones((3, 512)), *layer(n=60, dtype=mx.float32), 64, 4)
        assert calls  # 60 outputs: a part-filled tile of 8, not taken: the FMA kernel
    finally:
        registry.reset()


@pytest.mark.parametrize("model", ["llama q4g64", "gguf Q4_1"])
def test_an_emulated_mac_keeps_verify_rows_equal_to_one_row_steps_with_mlx_s_own_calls(monkeypatch, tmp_path, model):
    """The engine on an emulated Metal GPU (gpu_emulation: MLX's ops drift with the row count), the layers MLX's qmv
    serves taking "qmm-mlx-rows" (stood in: each row as MLX's one-row call): one-row steps go through MLX's op, verify
    rows through the kernel, and an 8-row verify forward still gives each row a one-row step's bits. The GGUF's rows
    are float32 over float16 scales."""
    from gpu_emulation import emulate_gpu
    from gpu_stand_ins import serve
    from model_factory import make_model_dir
    from mlxspec.engine import Engine
    from mlxspec.kernels import registry

    default = mx.default_device()
    mx.set_default_device(mx.cpu)
    try:
        emulate_gpu(monkeypatch, backend="metal")
        launches = []
        serve(monkeypatch, {"qmm-mlx-rows": lambda: mlx_rows.mlx_rows_function(make=per_row(launches))})
        if model == "gguf Q4_1":
            from gguf_fixtures import Dims, write_tiny_llama_gguf

            # this CPU's MLX op sums float16 rows in float16 (Metal's qmv: in float), past the tolerance: the float32
            # rows a GGUF runs are this case's
            monkeypatch.setattr(mlx_rows, "x_dtypes", lambda scale_dtype: [mx.float32])

            path = write_tiny_llama_gguf(tmp_path / "m.gguf", "Q4_1", seed=7, dims=Dims(hidden=256, ffn=512, heads=4,
                                                                                       kv_heads=2))
            engine = Engine.load(str(path), kernels="exact")
        else:
            engine = Engine.load(str(make_model_dir(tmp_path, "llama", hidden=256, intermediate=512, seed=3)),
                                 quantize="q4g64", kernels="exact")
        assert engine.rows.holds(8), engine.rows.failures()
        assert {rows for rows, _, _ in launches} >= {8}  # the verify rows ran the kernel
        checks = registry.kernel("qmm-mlx-rows", "metal").checks  # q/k/v (joined), o, gate/up (joined), down shapes
        assert len(checks) >= 3 and not any(checks.values()), checks
    finally:
        registry.reset()
        mx.set_default_device(default)
