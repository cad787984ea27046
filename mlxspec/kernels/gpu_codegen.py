"""The full program `mx.fast.metal_kernel` / `mx.fast.cuda_kernel` would generate for a body.

Shared by every GPU kernel family (qmm, dense, attention, acceptance) so the tests can compile the
exact signature + template + body with g++ under tests/kernels/emulator/gpu_emulator.h.

    fname, text = metal_function(kernel, dtypes, sizes, targs, body)   # one kernel, no header
    src = header + text                                                 # Metal program
    fname, text = cuda_function(kernel, dtypes, targs, body)
    src = cuda_program(header, [text])

`kernel` is (name, inputs, outputs, output dtypes); `dtypes` maps input names to mx dtypes; `sizes`
their element counts (MLX puts Metal inputs of fewer than 8 elements in constant space).
"""

from __future__ import annotations

import mlx.core as mx

METAL_TYPES = {mx.float32: "float", mx.float16: "float16_t", mx.bfloat16: "bfloat16_t", mx.uint32: "uint32_t",
               mx.int32: "int32_t", mx.uint8: "uint8_t"}
CUDA_TYPES = {mx.float32: "float", mx.float16: "__half", mx.bfloat16: "__nv_bfloat16", mx.uint32: "uint32_t",
              mx.int32: "int32_t", mx.uint8: "uint8_t"}
CUDA_PREAMBLE = ('\n#include "mlx/backend/cuda/device/utils.cuh"\n\n#include <cooperative_groups.h>\n\n'
                 "#define inf cuda::std::numeric_limits<float>::infinity()\n\n")
CUDA_NAMESPACE = "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
# LOAD4(p): a 16-byte load from an input, in device or constant space (MLX passes inputs of fewer than 8 elements in
# constant space, and Metal casts no pointer from one to the other). g++ under the emulator has no address spaces:
# there the device overload serves both.
METAL_LOAD4 = """template <typename P> inline uint4 load4(const device P* p) { return *((const device uint4*)p); }
#ifndef MLXSPEC_EMULATOR
template <typename P> inline uint4 load4(const constant P* p) { return *((const constant uint4*)p); }
#endif
#define LOAD4(p) load4(p)
"""
# The builtins mx.fast.metal_kernel passes where a body names them, in its order (mlx/backend/common/metal_kernel.cpp)
METAL_ATTRIBUTES = {"simdgroup_index_in_threadgroup": "uint", "thread_index_in_simdgroup": "uint",
                    "thread_position_in_grid": "uint3", "thread_position_in_threadgroup": "uint3",
                    "threadgroup_position_in_grid": "uint3"}


def _uses(body: str, name: str) -> bool:
    return name in body


def metal_input_names(inputs, dtypes: dict, sizes: dict[str, int]) -> str:
    """The part of MLX's kernel name that spells each input's type (+ 'c' when in constant space)."""
    return "".join(f"_{METAL_TYPES[dtypes[i]]}" + ("c" if sizes[i] < 8 else "") for i in inputs)


def metal_params(inputs, dtypes: dict, sizes: dict[str, int], body: str) -> tuple[list[str], int]:
    """MLX's Metal parameter list for the inputs (with the _shape/_strides/_ndim the body uses); next buffer."""
    params, index = [], 0
    for i in inputs:
        space = "constant" if sizes[i] < 8 else "device"  # MLX: inputs of < 8 elements go to constant space
        params.append(f"  const {space} {METAL_TYPES[dtypes[i]]}* {i} [[buffer({index})]]")
        index += 1
        for suffix, ctype in (("_shape", "int*"), ("_strides", "int64_t*"), ("_ndim", "int&")):
            if _uses(body, i + suffix):
                params.append(f"  const constant {ctype} {i}{suffix} [[buffer({index})]]")
                index += 1
    return params, index


def cuda_params(inputs, dtypes: dict, body: str) -> list[str]:
    """MLX's CUDA parameter list for the inputs (with the _shape/_strides/_ndim the body uses)."""
    params = []
    for i in inputs:
        params.append(f"    const {CUDA_TYPES[dtypes[i]]}* {i}")
        for suffix, ctype in (("_shape", "Shape"), ("_strides", "Strides"), ("_ndim", "int")):
            if _uses(body, i + suffix):
                params.append(f"    const __grid_constant__ {ctype} {i}{suffix}")
    return params


def _targ(v) -> str:
    return METAL_TYPES[v] if isinstance(v, mx.Dtype) else str(v)


def metal_function(kernel: tuple, dtypes: dict, sizes: dict[str, int], targs: list[tuple], body: str) -> tuple[str, str]:
    """(function name, templated kernel + its instantiation) as mx.fast.metal_kernel writes them."""
    name, inputs, outputs, out_dtypes = kernel
    tdef = "<" + ", ".join(_targ(v) for _, v in targs) + ">"
    fname = f"custom_kernel_{name}__" + tdef.strip("<>").replace(", ", "_")  # MLX: "<a, b>" -> "_a_b"
    fname += metal_input_names(inputs, dtypes, sizes) + "".join(f"_{METAL_TYPES[d]}" for d in out_dtypes)
    params, index = metal_params(inputs, dtypes, sizes, body)
    for i, (o, d) in enumerate(zip(outputs, out_dtypes)):
        params.append(f"  device {METAL_TYPES[d]}* {o} [[buffer({index + i})]]")
    params += [f"  {t} {a} [[{a}]]" for a, t in METAL_ATTRIBUTES.items() if _uses(body, a)]
    kinds = ", ".join(("typename " if isinstance(v, mx.Dtype) else "int ") + k for k, v in targs)
    text = f"template <{kinds}>\n[[kernel]] void {fname}(\n" + ",\n".join(params) + ") {\n" + body + "\n}\n"
    text += f'\ntemplate [[host_name("{fname}")]] [[kernel]] decltype({fname}{tdef}) {fname}{tdef};\n'
    return fname, text


def cuda_function(kernel: tuple, dtypes: dict, targs: list[tuple], body: str) -> tuple[str, str]:
    """(function name, __global__ function) as mx.fast.cuda_kernel writes it (template args as constants)."""
    name, inputs, outputs, out_dtypes = kernel
    fname = f"custom_kernel_{name}" + "".join(f"_{_targ(v)}" for _, v in targs)
    params = cuda_params(inputs, dtypes, body) + [f"    {CUDA_TYPES[d]}* {o}" for o, d in zip(outputs, out_dtypes)]
    consts = "".join(f"  using {k} = {CUDA_TYPES[v]};\n" if isinstance(v, mx.Dtype) else f"  constexpr int {k} = {v};\n"
                     for k, v in targs)
    return fname, f"__global__ void {fname}(\n" + ",\n".join(params) + ") {\n" + consts + "\n" + body + "\n}\n\n"


def cuda_program(header: str, functions: list[str]) -> str:
    return CUDA_PREAMBLE + header + CUDA_NAMESPACE + "".join(functions) + "} // namespace mlx::core::cu\n"
