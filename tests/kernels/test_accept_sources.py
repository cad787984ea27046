"""The fused acceptance kernels (accept_source.py), checked as far as a Linux CPU allows.

As in test_gpu_sources.py: the full program mx.fast would get is compiled with g++ under stand-ins
for the GPU builtins (emulator/gpu_emulator.h) and run with one thread per lane. Greedy must equal
verify.greedy_accept exactly; rejection must keep the same n as verify.rejection_accept for the same
key and draw next as the float64 inverse CDF of the reference's distribution at the same uniform.
The registry-style self-check (accept_check.py) must pass on these kernels and catch broken ones.
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from emulator_harness import CXX, compile_program
from mlxspec.kernels import accept_source as src
from mlxspec.kernels.accept_check import draw_error, draw_row, inverse_cdf, self_check
from mlxspec.verify import greedy_accept, rejection_accept

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")

KS, VS = (0, 1, 4, 8), (7, 50, 257)
ROUNDS = 12  # rounds per (k, V) in one emulator run
C_TYPES = {mx.float32: "float", mx.float16: "_Float16", mx.bfloat16: "emu::bf16"}
NP_TYPES = {mx.float32: np.float32, mx.float16: np.float16, mx.bfloat16: np.uint16}

HARNESS = """
#include <cstdlib>
#include <fstream>
#include <string>
{source}
using T = {T};
template <typename V> std::vector<V> load(const std::string& path, size_t n) {{
  std::vector<V> v(n); std::ifstream(path, std::ios::binary).read((char*)v.data(), n * sizeof(V)); return v;
}}
// argv: dir k V rounds; each input file holds `rounds` rounds back to back (k = 0: one dummy draft / q row)
int main(int argc, char** argv) {{
  const std::string d = argv[1];
  const int k = std::atoi(argv[2]), V = std::atoi(argv[3]), rounds = std::atoi(argv[4]), kd = k ? k : 1;
  std::vector<int32_t> out(2 * size_t(rounds));
  {load}
  for (int r = 0; r < rounds; ++r) emu::run_columns(1, [&](int lane, int) {{ {call} }});
  std::ofstream(d + "/out", std::ios::binary).write((const char*)out.data(), out.size() * sizeof(int32_t));
}}
"""
LOAD = {
    src.GREEDY: """auto logits = load<T>(d + "/logits", size_t(rounds) * (k + 1) * V);
  auto drafts = load<uint32_t>(d + "/drafts", size_t(rounds) * kd);""",
    src.REJECTION: """auto p = load<T>(d + "/p", size_t(rounds) * (k + 1) * V);
  auto q = load<T>(d + "/q", size_t(rounds) * kd * V);
  auto drafts = load<uint32_t>(d + "/drafts", size_t(rounds) * kd);
  auto u = load<float>(d + "/u", size_t(rounds) * (k + 1));""",
}
ARGS = {
    src.GREEDY: "logits.data() + size_t(r) * (k + 1) * V, shape, drafts.data() + size_t(r) * kd, out.data() + 2 * r",
    src.REJECTION: "p.data() + size_t(r) * (k + 1) * V, shape, q.data() + size_t(r) * kd * V, "
                   "drafts.data() + size_t(r) * kd, u.data() + size_t(r) * (k + 1), out.data() + 2 * r",
}
METAL_CALL = "int shape[2] = {{k + 1, V}}; {name}<T>({args}, uint3{{unsigned(lane), 0, 0}});"
CUDA_CALL = ("Shape shape{{k + 1, V}}; threadIdx = dim3{{unsigned(lane), 0, 0}}; blockIdx = dim3{{0, 0, 0}}; "
             "blockDim = dim3{{32, 1, 1}}; mlx::core::cu::{name}({args});")


def harness_code(backend: str, kind: str, dtype, mutate: tuple[str, str] | None = None) -> str:
    if backend == "metal":  # small sizes: drafts and u take MLX's constant address space path
        name, source = src.metal_source(kind, dtype, {"logits": 99, "p": 99, "q": 99, "drafts": 4, "u": 5})
        call = METAL_CALL.format(name=name, args=ARGS[kind])
    else:
        name, source = src.cuda_source(kind, dtype)
        call = CUDA_CALL.format(name=name, args=ARGS[kind])
    if mutate:
        assert source.count(mutate[0]) == 1, mutate
        source = source.replace(*mutate)
    return HARNESS.format(source=source, T=C_TYPES[dtype], load=LOAD[kind], call=call)


def compile_all(tmp: Path, builds: dict[str, str]) -> dict[str, Path]:
    """Compile {label: code} in parallel (each is ~1-2 s of g++); a failure shows the compiler's error."""
    def build(label: str) -> Path:
        (tmp / f"{label}.cpp").write_text(builds[label])
        compile_program(tmp / f"{label}.cpp", tmp / label)
        return tmp / label

    with ThreadPoolExecutor(4) as pool:
        return dict(zip(builds, pool.map(build, builds)))


MUTANTS = {  # deliberately wrong kernels the self-check must reject
    "greedy-last-max": (src.GREEDY, "if (x > top)", "if (x >= top)"),
    "rejection-accepts-ties": (src.REJECTION, "u[n] * float(q[n * V + drafts[n]]) < float",
                               "u[n] * float(q[n * V + drafts[n]]) <= float"),
    "rejection-ignores-q": (src.REJECTION, "MAX0(float(p[row + (j)]) - float(q[row + (j)]))", "float(p[row + (j)])"),
}


@pytest.fixture(scope="module")
def exes(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("accept")
    builds = {
        "metal-greedy-float32": harness_code("metal", src.GREEDY, mx.float32),
        "cuda-greedy-bfloat16": harness_code("cuda", src.GREEDY, mx.bfloat16),
        "metal-greedy-float16": harness_code("metal", src.GREEDY, mx.float16),
        "metal-rejection-float32": harness_code("metal", src.REJECTION, mx.float32),
        "cuda-rejection-float32": harness_code("cuda", src.REJECTION, mx.float32),
    }
    for label, (kind, old, new) in MUTANTS.items():
        builds[label] = harness_code("metal", kind, mx.float32, (old, new))
    return compile_all(tmp, builds)


def run(exe: Path, tmp: Path, k: int, v: int, rounds: int, inputs: dict[str, mx.array]) -> np.ndarray:
    """Run the emulated kernel on `rounds` stacked rounds; returns (rounds, 2) [n, next]."""
    for name, a in inputs.items():
        (np.array(a.view(mx.uint16)) if a.dtype == mx.bfloat16 else np.array(a)).tofile(tmp / name)
    subprocess.run([str(exe), str(tmp), str(k), str(v), str(rounds)], check=True, timeout=60)
    return np.fromfile(tmp / "out", dtype=np.int32).reshape(rounds, 2)


def emulated(exe: Path, tmp: Path, kind: str):
    """The emulated kernel behind the raw interface accept_check.self_check calls (one round per run)."""
    def call(*arrays: mx.array) -> mx.array:
        names = src.INPUTS[kind]
        rows = dict(zip(names, arrays))
        first = rows["logits" if kind == src.GREEDY else "p"]
        k, v = first.shape[0] - 1, first.shape[1]
        if k == 0:  # the wrapper's dummies for k = 0
            rows["drafts"] = mx.zeros((1,), mx.uint32)
            if kind == src.REJECTION:
                rows["q"] = mx.zeros((1, v), first.dtype)
        return mx.array(run(exe, tmp, k, v, 1, rows)[0])

    return call


def planted_drafts(rng, best: np.ndarray, v: int) -> np.ndarray:
    """Drafts that agree with `best` for a random run, then differ: every n from 0 to k occurs."""
    k = best.shape[0] - 1
    keep = int(rng.integers(0, k + 1))
    drafts = rng.integers(0, v, k)
    drafts[:keep] = best[:keep]
    if keep < k:
        drafts[keep] = (best[keep] + 1) % v
    return drafts.astype(np.uint32)


@pytest.mark.parametrize("label", ["metal-greedy-float32", "cuda-greedy-bfloat16", "metal-greedy-float16"])
def test_greedy_kernel_equals_greedy_accept(exes, tmp_path, label):
    dtype = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}[label.split("-")[-1]]
    rng = np.random.default_rng(1)
    for k in KS:
        for v in VS:
            ties = rng.integers(-2, 3, (ROUNDS // 2, k + 1, v))  # small integers: many equal maxima
            spread = rng.normal(size=(ROUNDS - ROUNDS // 2, k + 1, v)) * 4
            logits = mx.array(np.concatenate([ties, spread]).astype(np.float32)).astype(dtype)
            best = np.array(mx.argmax(logits, axis=-1))
            drafts = np.stack([planted_drafts(rng, b, v) for b in best]) if k else np.zeros((ROUNDS, 1), np.uint32)
            got = run(exes[label], tmp_path, k, v, ROUNDS, {"logits": logits, "drafts": mx.array(drafts)})
            for r in range(ROUNDS):
                n, nxt = greedy_accept(logits[r], mx.array(drafts[r, :k]))
                assert got[r].tolist() == [n.item(), nxt.item()], f"k={k} V={v} round {r}"


def random_probs(rng, rows: int, v: int) -> np.ndarray:
    """Softmax rows with about a third of the tokens at exactly 0 (as top-k / top-p leave them)."""
    logits = rng.normal(size=(rows, v)) * 2
    logits[rng.random((rows, v)) < 0.33] = -np.inf
    logits[:, 0] = np.maximum(logits[:, 0], 0)
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def normalised(row: np.ndarray) -> np.ndarray:
    r = row.astype(np.float64)  # numpy's choice wants a float64 sum of 1
    return r / r.sum()


def rejection_round(rng, k: int, v: int, mode: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """(p, q, drafts, one_hot): mode 0 random q, 1 a deterministic drafter, 2 q = p (all kept),
    3 q_0 = p_0 with a draft p_0 excludes (rejected with no residual: the reference falls back to p_0)."""
    p = random_probs(rng, k + 1, v)
    q = np.eye(v, dtype=np.float32)[rng.integers(0, v, k)] if mode == 1 else random_probs(rng, k, v)
    if mode == 2:
        q = p[:k].copy()
    drafts = np.array([rng.choice(v, p=normalised(row)) for row in q], dtype=np.uint32)
    if k and mode == 3:
        p[0, -1] = 0  # make sure p_0 excludes a token (renormalised below)
        p[0] /= p[0].sum()
        q[0] = p[0]
        drafts[0] = np.flatnonzero(p[0] == 0)[0]
    return p, q.reshape(k, v), drafts, mode == 1


@pytest.mark.parametrize("label", ["metal-rejection-float32", "cuda-rejection-float32"])
def test_rejection_kernel_keeps_reference_n_and_draws_by_inverse_cdf(exes, tmp_path, label):
    from mlxspec.kernels.accept import round_uniforms

    rng = np.random.default_rng(2)
    seen = set()
    for k in KS:
        for v in VS:
            rounds = [rejection_round(rng, k, v, r % 4) for r in range(ROUNDS)]
            keys = [mx.random.key(10_000 * k + 10 * v + r) for r in range(ROUNDS)]
            u = np.stack([np.array(round_uniforms(key, k)) for key in keys])  # what the wrapper passes
            dummy_q, dummy_d = np.zeros((1, v), np.float32), np.zeros(1, np.uint32)  # k = 0: never read
            got = run(exes[label], tmp_path, k, v, ROUNDS, {
                "p": mx.array(np.stack([p for p, *_ in rounds])),
                "q": mx.array(np.stack([q if k else dummy_q for _, q, *_ in rounds])),
                "drafts": mx.array(np.stack([d if k else dummy_d for _, _, d, _ in rounds])),
                "u": mx.array(u)})
            for r, (p, q, drafts, one_hot) in enumerate(rounds):
                n_ref, _ = rejection_accept(mx.array(p), mx.array(drafts), None if one_hot else mx.array(q), keys[r])
                n, token = got[r]
                assert n == n_ref.item(), f"k={k} V={v} round {r}: kept {n}, reference {n_ref.item()}"
                error = draw_error(draw_row(p, q, n), u[r, k], token)
                assert error is None, f"k={k} V={v} round {r}: {error}"
                seen.add("all kept" if n == k else "residual")
    assert seen == {"all kept", "residual"}  # both draws were exercised


def test_inverse_cdf_definition():
    row = np.array([0.0, 0.5, 0.0, 0.25, 0.25], np.float32)
    assert [inverse_cdf(row, u)[0] for u in (0.0, 0.49, 0.5, 0.74, 0.75, 0.999999)] == [1, 1, 3, 3, 4, 4]
    assert draw_error(row, 0.3, 1) is None
    assert draw_error(row, 0.3, 0) is not None  # zero mass is never a valid draw
    assert draw_error(row, 0.3, 3) is not None


def test_self_check_passes_the_kernels_and_catches_wrong_ones(exes, tmp_path):
    greedy = emulated(exes["metal-greedy-float32"], tmp_path, src.GREEDY)
    rejection = emulated(exes["metal-rejection-float32"], tmp_path, src.REJECTION)
    assert self_check(greedy, rejection, dtypes=(mx.float32,)) is None
    for label, (kind, _, _) in MUTANTS.items():
        wrong = emulated(exes[label], tmp_path, kind)
        failure = self_check(*((wrong, rejection) if kind == src.GREEDY else (greedy, wrong)), dtypes=(mx.float32,))
        assert failure is not None, f"self-check missed {label}"


# ---- the drop-in wrappers (accept.py), with mx.fast's kernels replaced by the emulated programs

def fake_jit(exes: dict[str, Path], tmp: Path, labels: dict[tuple, str]):
    """make(kind) -> a stand-in for the kernel object mx.fast returns, running the emulated source."""
    def make(kind: str):
        def kernel(*, inputs, template, grid, threadgroup, output_shapes, output_dtypes):
            assert (grid, threadgroup, output_shapes, output_dtypes) == (src.GRID, src.THREADGROUP, [(2,)], [mx.int32])
            first = inputs[0]
            rows = dict(zip(src.INPUTS[kind], inputs))
            out = run(exes[labels[kind, dict(template)["T"]]], tmp, first.shape[0] - 1, first.shape[1], 1, rows)
            return [mx.array(out[0])]

        return kernel

    return make


GOOD = {(src.GREEDY, mx.float32): "metal-greedy-float32", (src.GREEDY, mx.float16): "metal-greedy-float16",
        (src.GREEDY, mx.bfloat16): "cuda-greedy-bfloat16", (src.REJECTION, mx.float32): "cuda-rejection-float32"}


@pytest.fixture
def on_fake_gpu(exes, tmp_path, monkeypatch):
    """accept.py believes it runs on a Metal device whose JIT builds `labels`' emulated programs."""
    from mlxspec.kernels import accept, registry

    def use(labels: dict[tuple, str]):
        make = fake_jit(exes, tmp_path, labels)
        monkeypatch.setattr(accept, "device_backend_name", lambda device=None: "metal")
        monkeypatch.setattr(accept, "_kernels", lambda name: (accept._greedy_call(make(src.GREEDY)),
                                                                accept._rejection_call(make(src.REJECTION))))
        registry.reset()
        return accept

    yield use
    registry.reset()


def test_wrappers_are_drop_in_replacements_on_a_proven_gpu(on_fake_gpu):
    accept = on_fake_gpu(GOOD)
    assert accept.fused_accept_available() and accept._record().status()["passed"] == ["('greedy+rejection',)"]
    rng, v = np.random.default_rng(3), 50
    for k in (0, 3):
        logits = mx.array(rng.normal(size=(k + 1, v)).astype(np.float32))
        best = np.array(mx.argmax(logits, axis=-1))
        drafts = mx.array(planted_drafts(rng, best, v)) if k else mx.zeros((0,), mx.uint32)
        got, want = accept.fused_greedy_accept(logits, drafts), greedy_accept(logits, drafts)
        assert [(a.item(), a.dtype, a.shape) for a in got] == [(a.item(), a.dtype, a.shape) for a in want]
    for k, q_kind in ((0, "none"), (3, "none"), (3, "probs"), (3, "short vocab")):
        p, q, drafts, _ = rejection_round(rng, k, v, 0)
        q_arg = {"none": None, "probs": mx.array(q), "short vocab": mx.array(q[:, : v - 5])}[q_kind]
        q_full = {"none": np.eye(v, dtype=np.float32)[drafts].reshape(k, v), "probs": q,
                  "short vocab": np.pad(q[:, : v - 5], ((0, 0), (0, 5)))}[q_kind]
        key = mx.random.key(k + len(q_kind))
        n, token = accept.fused_rejection_accept(mx.array(p), mx.array(drafts), q_arg, key)
        n_ref, token_ref = rejection_accept(mx.array(p), mx.array(drafts), q_arg, key)
        assert (n.item(), n.dtype, token.dtype, token.shape) == (n_ref.item(), n_ref.dtype, token_ref.dtype, ())
        u_draw = np.array(accept.round_uniforms(key, k))[k]
        assert draw_error(draw_row(p, q_full, n.item()), u_draw, token.item()) is None, q_kind


def test_a_failed_self_check_warns_once_and_falls_back(on_fake_gpu, caplog):
    accept = on_fake_gpu({**GOOD, (src.GREEDY, mx.float32): "greedy-last-max"})
    logits, drafts = mx.array([[0.0, 2.0, 2.0], [1.0, 1.0, 0.0]]), mx.array([1], mx.uint32)
    with caplog.at_level("WARNING", logger="mlxspec.kernels"):
        for _ in range(2):
            assert not accept.fused_accept_available()
            assert [a.item() for a in accept.fused_greedy_accept(logits, drafts)] == [1, 0]  # the reference's
    assert len(caplog.records) == 1 and "failed its self-check" in caplog.text
    assert "greedy" in next(iter(accept._record().status()["failed"].values()))


def test_cpu_uses_the_reference_without_a_warning(caplog):
    from mlxspec.kernels import accept, registry

    registry.reset()
    with caplog.at_level("WARNING", logger="mlxspec.kernels"):
        assert not accept.fused_accept_available(mx.cpu)
    assert not caplog.records
    p = mx.softmax(mx.random.normal((4, 30), key=mx.random.key(0)), axis=-1)
    drafts, key = mx.array([3, 1, 4], mx.uint32), mx.random.key(5)
    with mx.stream(mx.cpu):
        got = accept.fused_rejection_accept(p, drafts, None, key)
        want = rejection_accept(p, drafts, None, key)
        assert [a.item() for a in got] == [a.item() for a in want]  # the same function, the same token
        assert [a.item() for a in accept.fused_greedy_accept(p, drafts)] == [a.item() for a in greedy_accept(p, drafts)]
    registry.reset()
