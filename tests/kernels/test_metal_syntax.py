"""Every Metal program mlxspec hands mx.fast.metal_kernel, read by a compiler that keeps Metal's rules.

No Mac runs here, and the emulator builds Metal programs with g++, where `device`, `constant` and
`threadgroup` mean nothing. Apple's compiler (clang underneath) refuses what g++ lets through: a
`constant` input (MLX passes inputs of fewer than 8 elements there: `params`, `length`, `tree` outside tree
passes, a tiny layer's weights) given where `device` memory is wanted, a threadgroup array passed as a thread
pointer, a float where a bfloat is wanted without a cast, max(float, int), a bool shuffled across a
SIMD-group, more than 32 KB of threadgroup memory, a table at program scope outside constant space.

The programs are MLX's own: the wrappers (gpu.py, gpu_attention.py, accept.py) launch their kernels under
mx.export_function, which runs nothing but records each launch's program as mx.fast.metal_kernel wrote it
(signature from the inputs' dtypes and sizes, template arguments, builtins), Metal or not. Zig's bundled clang
(the `ziglang` dev dependency) then reads each with -fsyntax-only against metal_syntax/metal_stdlib.h: Metal's
functions declared with their overloads, its address spaces as clang's. A program that passes may still fail on
a Mac for what a declaration cannot show (a register limit, a fragment layout); one that fails here would fail
there. Found this way (2026-11-28): the simdgroup qmm named a tiny layer's weights `device` (they are `constant`).
"""

from __future__ import annotations

import functools
import importlib.util
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import pytest

from mlxspec.kernels import accept, gpu, gpu_attention, mlx_rows
from mlxspec.kernels.reference import random_quantized
from mlxspec.kernels.tree_mask import tree_rows

HEADER = Path(__file__).parent / "metal_syntax"
BUFFER_SLOTS = 31  # a kernel's buffer arguments: [[buffer(0)]] .. [[buffer(30)]] (inputs, their shapes and strides, outputs)
THREADGROUP_BYTES = 32768  # every Apple GPU's threadgroup memory (CUDA allows 48 KB: a CUDA-sized array can break Metal)
FLAGS = ["-x", "c++", "-std=c++17", "-fsyntax-only", "-Werror", "-Wvla", "-Wimplicit-float-conversion",
         "-Wno-unknown-attributes", "-Wno-unused-value", "-Wno-unused-command-line-argument"]
METAL_INCLUDE = re.compile(r"^#include <metal_\w+>$", re.M)
ATTRIBUTE = re.compile(r"\[\[[^\[\]]*\]\]")  # [[kernel]], [[buffer(0)]], [[host_name("...")]]: clang would warn
# A threadgroup declaration (a type, then names with their dimensions, at a statement's start): static storage in
# address space 3 (a pointer to threadgroup memory is left as it is)
_NAME = r"\w+(?:\s*\[[^\]]+\])*"  # a name and its dimensions
TG_DECLARATION = re.compile(rf"((?:^|(?<=[;{{}}]))\s*)__mlxspec_threadgroup\s+([\w:]+)\s+((?:{_NAME}\s*,\s*)*{_NAME})\s*;",
                            re.M)
DECLARATOR = re.compile(r"\s*(\w+)((?:\s*\[[^\]]+\])*)\s*")
F16, BF16, F32 = mx.float16, mx.bfloat16, mx.float32


@functools.cache
def _clang() -> tuple[list[str] | None, str]:
    """(the compiler, or None and why): Zig's clang, if it reads the header (_Float16 and __bf16 arithmetic)."""
    if importlib.util.find_spec("ziglang") is None:
        return None, "ziglang (a dev dependency) is not installed"
    cmd = [sys.executable, "-m", "ziglang", "clang"]
    probe = subprocess.run([*cmd, *FLAGS, "-I", str(HEADER), "-"], input='#include "metal_stdlib.h"\n',
                           capture_output=True, text=True)
    return (cmd, "") if probe.returncode == 0 else (None, f"Zig's clang cannot read the header: {probe.stderr[:300]}")


def clang() -> list[str]:
    cmd, why = _clang()
    if cmd is None:
        pytest.skip(why)
    return cmd


def _threadgroup(match: re.Match, names: list[str]) -> str:
    """A threadgroup declaration as static address-space-3 storage, then an assert on the kernel's total so far."""
    lead, type_, declarators = match.groups()
    out = lead
    for declarator in declarators.split(","):
        name, dims = DECLARATOR.fullmatch(declarator).groups()
        names.append(name)
        total = " + ".join(f"sizeof({n})" for n in names)
        out += (f"static __attribute__((address_space(3))) {type_} {name}{dims}; "
                f'static_assert({total} <= {THREADGROUP_BYTES}, "threadgroup memory over Metal\'s 32 KB"); ')
    return out


def program_scope_variables(program: str) -> list[str]:
    """Variables declared outside every function and not in constant space: Metal refuses them ("program scope
    variable must reside in constant address space"), C++ does not."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", program, flags=re.S)
    text = re.sub(r"^\s*#(?:[^\n]*\\\n)*[^\n]*$", "", text, flags=re.M)  # preprocessor lines, continued ones too
    while True:  # innermost braces first: a function's body ends its declaration, an initializer stays in its own
        braces = re.sub(r"(\)\s*(?:const\s*)?)?\{[^{}]*\}", lambda m: f"{m.group(1)};" if m.group(1) else "()", text)
        if braces == text:
            break
        text = braces
    found = []
    for statement in (s.strip() for s in text.split(";")):
        words = statement.split()
        if words and "(" not in statement.split("=")[0] and "constant" not in words and words[0] not in (
                "typedef", "using", "template", "struct", "class", "enum", "namespace", "extern"):
            found.append(statement)
    return found


def metal_errors(program: str) -> str:
    """The compiler's errors for one program as MLX writes it (empty: none)."""
    if variables := program_scope_variables(program):
        return f"program scope variables outside constant space: {variables}"
    if (slots := max(map(int, re.findall(r"\[\[buffer\((\d+)\)\]\]", program)), default=0)) >= BUFFER_SLOTS:
        return f"buffer({slots}): a Metal kernel has {BUFFER_SLOTS} buffer slots"
    text = ATTRIBUTE.sub("", METAL_INCLUDE.sub("", program))  # the header stands for Metal's own
    source = f'#include "metal_stdlib.h"\n{text}'
    pre = subprocess.run([*clang(), "-E", "-P", *FLAGS[:3], "-I", str(HEADER), "-"], input=source,
                         capture_output=True, text=True)
    if pre.returncode:
        return pre.stderr
    kernels = re.split(r"(?=^\s*template\s*<)", pre.stdout, flags=re.M)  # each kernel's own total (and helpers')
    out = []
    for part in kernels:
        names: list[str] = []
        out.append(TG_DECLARATION.sub(lambda m: _threadgroup(m, names), part))
    text = "".join(out).replace("__mlxspec_threadgroup", "__attribute__((address_space(3)))")
    done = subprocess.run([*clang(), *FLAGS, "-"], input=text, capture_output=True, text=True)
    return done.stderr if done.returncode else ""


def mlx_metal_programs(fn, *args) -> set[str]:
    """The Metal programs MLX writes for fn(*args)'s kernel launches, as it would hand them to Apple's compiler:
    mx.fast.metal_kernel writes a launch's program at the call (its signature from the inputs' dtypes and sizes,
    the template arguments, the builtins the body names) and mx.export_function records it, even without Metal
    (it traces, it runs nothing). Each program is a length-prefixed string in the exported file."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "launches.mlxfn"
        mx.export_function(str(path), fn, *args)
        data = path.read_bytes()
    programs = set()
    for kernel in re.finditer(rb"\[\[kernel\]\] void", data):
        for start in range(kernel.start(), 8, -1):  # the string's start: its 8-byte length reaches past the kernel
            size = int.from_bytes(data[start - 8 : start], "little")
            if kernel.start() < start + size <= len(data):
                programs.add(data[start : start + size].decode())
                break
    return programs


@pytest.fixture(scope="module")
def metal():
    """mlxspec's Metal wrappers, made here as on a Mac (they ask mx.metal.is_available first; the calls only trace)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mx.metal, "is_available", lambda: True)
        qmm = gpu.metal_qmm_function()
        return {"qmm": qmm, "gather": gpu.metal_gather_qmm_function(), "dense": gpu.metal_dense_function(),
                "simdgroup": gpu.metal_mma_qmm_function(fallback=qmm), "sdpa": gpu_attention.metal_sdpa_function(),
                "sdpa-mma": gpu_attention.metal_sdpa_simdgroup_function(), "accept": accept._kernels("metal"),
                "mlx-rows": mlx_rows.mlx_rows_function()}


def _normal(shape, dtype, seed=0):
    return mx.random.normal(shape, key=mx.random.key(seed)).astype(dtype)


def _qmm_launches(k):
    """(fn, *args) of the matmul kernels' launches: every width in float16, whole words (4) and a bit stream (3)
    in the other dtypes, one and 16 rows, a layer small enough for constant space, mxfp4, the gathers."""
    for dtype in (F16, BF16, F32):
        layouts = ((4, 64), (2, 32), (3, 64), (5, 128), (6, 64), (8, 32)) if dtype == F16 else ((4, 64), (3, 64))
        for bits, group in layouts:
            w, s, b = random_quantized(64, 256, group, bits, dtype, key=mx.random.key(bits))
            for kernel in (k["qmm"], k["simdgroup"]):
                for rows in (1, 16):
                    yield (lambda x, w, s, b, f=kernel, g=group, n=bits: f(x, w, s, b, g, n)), \
                        _normal((rows, 256), dtype), w, s, b
        w, s, b = random_quantized(1, 32, 32, 4, F16)  # a 1 x 32 layer: every input under 8 elements (constant space)
        for kernel, rows in ((k["qmm"], 1), (k["simdgroup"], 9)):
            yield (lambda x, w, s, b, f=kernel: f(x, w, s, b, 32, 4)), _normal((rows, 32), dtype), w, s, b
        yield k["dense"], _normal((3, 64), dtype), _normal((32, 64), dtype)
    for x_dtype, dtype, bits, group, kk in ((F16, F16, 4, 64, 1024), (BF16, BF16, 8, 32, 1024), (F32, F32, 4, 128, 1024),
                                            (F16, F16, 4, 64, 576), (F32, F16, 4, 32, 576)):  # the last: a GGUF's rows
        w, s, b = random_quantized(64, kk, group, bits, dtype, key=mx.random.key(bits))  # MLX's qmv_fast / qmv rows
        for rows in (2, 16):
            yield (lambda x, w, s, b, g=group, n=bits: k["mlx-rows"](x, w, s, b, g, n)), _normal((rows, kk), x_dtype), w, s, b
    w, s, _ = random_quantized(64, 256, 32, 4, mode="mxfp4")
    yield (lambda x, w, s: k["qmm"](x, w, s, None, 32, 4, mode="mxfp4")), _normal((3, 256), BF16), w, s
    w, s, b = (mx.stack([a] * 3) for a in random_quantized(64, 256, 64, 4, F16))
    for per_expert in (1, 4):
        yield (lambda x, w, s, b, i, p=per_expert: k["gather"](x, w, s, b, i, 64, 4, per_expert=p)), \
            _normal((4, 256), F16), w, s, b, mx.array([2, 0, 2, 1], mx.uint32)


def _attention_launches(k):
    """Both families: float16 / bfloat16 / float32 / float32 over float16, keys in one chunk, a few, or past the
    direct launch; windows, sinks and softcaps, a buffer with `length`, a draft tree's pass."""
    parents = (-1, 0, 0, 1, 1, 2, 3, 3)
    for sdpa in (k["sdpa"], k["sdpa-mma"]):
        for dtype, kv_dtype, d in ((F16, F16, 128), (BF16, BF16, 64), (F32, F32, 256), (F32, F16, 128)):
            q, rows = _normal((1, 8, 3, d), dtype), _normal((1, 8, len(parents), d), dtype)
            for keys in (100, 300, 1300):
                kv = _normal((1, 2, keys, d), kv_dtype, 1)
                yield (lambda q, k, v, f=sdpa: f(q, k, v, 0.1, True)), q, kv, kv
                yield (lambda q, k, v, s, f=sdpa: f(q, k, v, 0.1, True, window=128, sinks=s, softcap=30.0)), \
                    q, kv, kv, _normal((8,), F32)
                yield (lambda q, k, v, n, f=sdpa: f(q, k, v, 0.1, True, length=n)), \
                    q, kv, kv, mx.array([keys - 7], mx.int32)
                yield (lambda q, k, v, t, f=sdpa: f(q, k, v, 0.1, True, tree=t)), \
                    rows, kv, kv, tree_rows(parents, keys - len(parents))


def _accept_launches(k):
    """Greedy and rejection acceptance in each dtype, with no drafts, 3 (drafts and uniforms in constant space), 12."""
    greedy, rejection = k["accept"]
    for dtype in (F16, BF16, F32):
        for drafts in (0, 3, 12):
            d = mx.arange(drafts, dtype=mx.uint32)
            yield greedy, _normal((drafts + 1, 100), dtype), d
            p = mx.softmax(_normal((drafts + 1, 100), F32), axis=-1).astype(dtype)
            q = mx.softmax(_normal((max(drafts, 1), 100), F32, 1), axis=-1).astype(dtype)
            yield rejection, p, q, d, mx.random.uniform(shape=(drafts + 1,))


FAMILIES = {"qmm, gather and dense": _qmm_launches, "attention": _attention_launches, "acceptance": _accept_launches}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_metal_program_keeps_metal_s_rules(metal, family):
    programs = set()
    for fn, *args in FAMILIES[family](metal):
        programs |= mlx_metal_programs(fn, *args)
    assert len(programs) > 10
    for program in sorted(programs):
        errors = metal_errors(program)
        assert not errors, f"a {family} program breaks Metal's rules:\n{errors[:4000]}"


# What Apple's compiler refuses, each put into a real program: the check must refuse it too
BREAKS = {
    "constant input to a device helper": ("inline float first_(const device float* p) { return p[0]; }\n",
                                          "const float sc = params[0]", "const float sc = first_(params)",
                                          "no matching function"),
    "threadgroup array as a thread pointer": ("inline float first_(thread const float* p) { return p[0]; }\n",
                                              "const float sc = params[0]",
                                              "threadgroup float tg_[8]; const float sc = first_(tg_)",
                                              "no matching function"),
    "ambiguous max(float, int)": ("", "const float sc = params[0]", "const float sc = metal::max(params[0], 0)",
                                  "ambiguous"),
    "float into bfloat": ("", "const float sc = params[0]", "bfloat16_t b_ = params[0]; const float sc = params[0]",
                          "implicit conversion"),
    "half4 into float4": ("", "const float sc = params[0]", "half4 h_ = 0; float4 f_ = h_; const float sc = params[0]",
                          "cannot initialize"),
    "bool across a SIMD-group": ("", "const float sc = params[0]",
                                 "bool b_ = simd_shuffle(true, ushort(1)); const float sc = params[0]",
                                 "no matching function"),
    "a program-scope table outside constant space": ("const float table_[2] = {1.0f, 2.0f};\n",
                                                     "const float sc = params[0]", "const float sc = table_[0]",
                                                     "program scope"),
    "over 32 KB of threadgroup memory": ("", "const float sc = params[0]",
                                         "threadgroup float big_[6000]; threadgroup float more_[3000]; "
                                         "more_[0] = big_[0]; const float sc = params[0]",
                                         "32 KB"),
}


@pytest.mark.parametrize("name", BREAKS)
def test_the_check_refuses_what_metal_refuses(metal, name):
    helper, old, new, message = BREAKS[name]
    sdpa = metal["sdpa-mma"]
    program, = mlx_metal_programs(lambda q, k: sdpa(q, k, k, 0.1, True), _normal((1, 8, 1, 128), F16),
                                  _normal((1, 2, 100, 128), F16))
    assert not metal_errors(program)
    assert old in program
    broken = program.replace("inline void mma8(", helper + "inline void mma8(", 1).replace(old, new, 1)
    assert message in metal_errors(broken)


def test_the_check_counts_buffer_slots(metal):
    sdpa = metal["sdpa"]
    program, = mlx_metal_programs(lambda q, k: sdpa(q, k, k, 0.1, True), _normal((1, 8, 1, 64), F16),
                                  _normal((1, 2, 100, 64), F16))
    last = max(map(int, re.findall(r"\[\[buffer\((\d+)\)\]\]", program)))
    assert metal_errors(program) == "" and last < BUFFER_SLOTS - 1
    assert "buffer slots" in metal_errors(program.replace(f"[[buffer({last})]]", f"[[buffer({BUFFER_SLOTS})]]"))
