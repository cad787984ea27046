"""The definition every kernel must match: MLX's own ops, in pure MLX.

    y = qmm_reference(x, w, scales, biases, group_size, bits)     # x (..., K) -> (..., N)
    y = qmm_reference(x, w, scales, None, 32, 4, mode="mxfp4")    # gpt-oss's experts: no biases

Kernels accumulate in float32 in their own order, so they match the reference to a stated
tolerance, not bit for bit; `within_tolerance` is that statement, used by the tests and by the
per-device self-check.
"""

from __future__ import annotations

import functools

import mlx.core as mx

# |kernel - reference| <= acc_tol(K) * (|x| @ |dequant(w)|.T) + eps(out dtype) * |reference|:
# float32 sums of K products in another order, then one rounding to the output dtype.
ACC_TOL = 2e-6  # at K <= 4096
ACC_K = 4096


def acc_tol(k: int) -> float:
    """The accumulation share of the tolerance for sums of k products: ACC_TOL up to ACC_K, then growing as
    sqrt(k), as the rounding errors of a float32 sum in another order do. The tensor-core qmm's error at
    K = 14336 reached 0.87 of the flat ACC_TOL under the CPU emulator (72 rows, 19 columns), so at a real
    layer's width it could fail a correct kernel; an H100 and an H200 both gave that shape the FMA kernel."""
    return ACC_TOL * max(1.0, k / ACC_K) ** 0.5
EPS = {mx.float32: 0.0, mx.float16: 2.0**-10, mx.bfloat16: 2.0**-7}


def on_cpu(fn):
    """Run a reference on the CPU stream: a GPU backend's float32 matmul need not be float32 (MLX's
    CUDA matmul and SDPA measured up to 80x the tolerance on an H100, TF32-like), and a
    definition must not be the least accurate party to the comparison."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with mx.stream(mx.cpu):
            return fn(*args, **kwargs)

    return wrapper


@functools.lru_cache(maxsize=None)
def output_dtype(x_dtype: mx.Dtype, scales_dtype: mx.Dtype) -> mx.Dtype:
    """The dtype MLX's quantized_matmul returns: the promotion of x's and the scales' dtypes (cached:
    the GPU wrappers ask on every call, and building the two arrays cost ~2 us of a ~8 us call)."""
    return (mx.zeros((1,), x_dtype) + mx.zeros((1,), scales_dtype)).dtype  # lazy: nothing is computed


@on_cpu
def qmm_reference(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array | None, group_size: int, bits: int,
                  mode: str = "affine") -> mx.array:
    """x @ dequant(w).T computed by MLX in float32, returned in the dtype MLX's op would return."""
    out_dtype = output_dtype(x.dtype, scales.dtype)
    f32 = mx.float32
    y = mx.quantized_matmul(x.astype(f32), w, *_params(scales, biases, mode), transpose=True, group_size=group_size,
                            bits=bits, mode=mode)
    return y.astype(out_dtype)


def _params(scales: mx.array, biases: mx.array | None, mode: str) -> tuple:
    """(scales, biases) as MLX's ops take them in float32: affine's in float32; mxfp4's uint8 exponents as they are."""
    if mode == "affine":
        return scales.astype(mx.float32), biases.astype(mx.float32)
    return scales, None


E2M1_CODES = (12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0)  # qmm_q8_kernel.h's kE2m1: 2 v(c) + 12


def mxfp4_as_affine(scales: mx.array) -> tuple[mx.array, mx.array]:
    """An mxfp4 layer's uint8 exponents e as the affine (scale, bias) pair, in float32, that the CPU's
    int8 kernel derives from them in place (SType::e8m0) for codes E2M1_CODES[c]: scale 2^(e - 128),
    bias -12 * scale, so scale * E2M1_CODES[c] + bias is the weight exactly."""
    scale = mx.power(mx.array(2.0, mx.float32), scales.astype(mx.float32) - 128)  # exact powers of two
    return scale, scale * -12.0


@on_cpu
def q8_reference(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array | None, group_size: int, bits: int,
                 mode: str = "affine") -> mx.array:
    """The int8-activation kernel's definition (qmm_q8_kernel.h), in float32 MLX ops over exact
    integer sums: each 32-block of x -> d = amax / 127, q = round_half_even(x * (127 / amax));
    y = sum_b scale * d * (codes . q) + bias * d * sum(q). Returned as float32. mode 'mxfp4': the
    codes are E2M1_CODES[c] and (scale, bias) mxfp4_as_affine's (uint8 exponents are converted)."""
    f32 = mx.float32
    if mode == "mxfp4" and scales.dtype == mx.uint8:
        scales, biases = mxfp4_as_affine(scales)
    k = x.shape[-1]
    xb = x.astype(f32).reshape(-1, k // 32, 32)
    amax = mx.abs(xb).max(axis=-1, keepdims=True)
    inv = mx.where(amax > 0, mx.array(127.0, f32) / mx.where(amax > 0, amax, 1), 0)
    q = mx.round(xb * inv)  # MLX rounds half to even, as the kernel's conversion does
    d = amax / 127.0
    ones = mx.ones(scales.shape, f32)
    codes = mx.dequantize(w, ones, mx.zeros_like(ones), group_size=group_size, bits=bits)  # (N, K), exact integers
    if mode == "mxfp4":
        codes = mx.array(E2M1_CODES, f32)[codes.astype(mx.int32)]
    codes = codes.reshape(codes.shape[0], k // 32, 32)
    dots = mx.einsum("rbi,nbi->rnb", q, codes)  # exact: integer-valued float32 below 2^24
    s, b = (mx.repeat(a.astype(f32), group_size // 32, axis=-1) for a in (scales, biases))  # (N, K/32) per block
    y = (dots * (s[None] * d[..., 0][:, None, :])).sum(-1)
    y = y + (b[None] * (d[..., 0] * q.sum(-1))[:, None, :]).sum(-1)
    return y.reshape(*x.shape[:-1], w.shape[0])


@on_cpu
def magnitude(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array | None, group_size: int, bits: int,
              mode: str = "affine") -> mx.array:
    """|x| @ |dequant(w)|.T in float32: the scale of the rounding error of a dot product."""
    dq = mx.dequantize(w, *_params(scales, biases, mode), group_size=group_size, bits=bits, mode=mode)
    return mx.abs(x.astype(mx.float32)) @ mx.abs(dq.astype(mx.float32)).T


CHECK_COLUMNS = 256  # a self-check compares this many output columns at each end of a wider layer


def checked_columns(*arrays: mx.array | None, axis: int = 0) -> list[mx.array | None]:
    """Each array cut to the columns a self-check compares with the CPU reference (along `axis`: a
    weight's rows, a result's last axis): all of a narrow layer's; of a wider one the first and last
    CHECK_COLUMNS. Kernels compute each output column on its own (tiles of 4 to 32 columns over the
    grid), so both ends cover every position in a tile, the partial last tile and the largest
    offsets; the reference (a float32 CPU matmul, single-threaded MLX) of a 72-row check at a
    vocabulary head's 128256 columns cost over a minute, and a model has several such shapes."""
    def cut(a):
        if a is None or a.shape[axis] <= 2 * CHECK_COLUMNS:
            return a
        ends = (mx.arange(CHECK_COLUMNS), mx.arange(a.shape[axis] - CHECK_COLUMNS, a.shape[axis]))
        return mx.take(a, mx.concatenate(ends), axis=axis)
    return [cut(a) for a in arrays]


@on_cpu
def within_tolerance(y: mx.array, x: mx.array, w: mx.array, scales: mx.array, biases: mx.array | None,
                     group_size: int, bits: int, activations: str = "f32", mode: str = "affine") -> tuple[bool, float]:
    """(ok, worst error as a fraction of the allowed error) for a kernel result y (activations
    'q8': against q8_reference, the same statement of float32 accumulation error), over the
    columns `checked_columns` keeps."""
    (y,), (w, scales, biases) = checked_columns(y, axis=-1), checked_columns(w, scales, biases)
    if activations == "q8":
        ref = q8_reference(x, w, scales, biases, group_size, bits, mode).astype(mx.float32)
    else:
        ref = qmm_reference(x, w, scales, biases, group_size, bits, mode).astype(mx.float32)
    allowed = (acc_tol(x.shape[-1]) * magnitude(x, w, scales, biases, group_size, bits, mode) + EPS[y.dtype] * mx.abs(ref)
               + 1e-30)
    ratio = (mx.abs(y.astype(mx.float32) - ref) / allowed).max().item()
    finite = mx.all(mx.isfinite(y)).item()
    return bool(finite and ratio <= 1.0), float(ratio)


def random_quantized(n: int, k: int, group_size: int, bits: int, dtype=mx.float16, key=None, mode: str = "affine"):
    """Random packed weights (N, K*bits/32) with scales/biases (N, K/G) in `dtype`, cheap at any size
    (mode 'mxfp4': uint8 exponents 2^-9..2^-4, as real experts' are, and biases None)."""
    k1, k2, k3 = mx.random.split(key if key is not None else mx.random.key(0), 3)
    w = mx.random.randint(0, 2**31 - 1, (n, k * bits // 32), key=k1).astype(mx.uint32)
    w = w | (mx.random.randint(0, 2, (n, k * bits // 32), key=k1).astype(mx.uint32) << 31)
    if mode == "mxfp4":
        return w, mx.random.randint(118, 124, (n, k // group_size), key=k2).astype(mx.uint8), None
    scales = (mx.random.uniform(0.5, 1.5, (n, k // group_size), key=k2) * (0.02 / 2**bits)).astype(dtype)
    biases = (mx.random.normal((n, k // group_size), key=k3) * 0.01).astype(dtype)
    return w, scales, biases


@on_cpu
def conv_reference(x: mx.array, weight: mx.array) -> mx.array:
    """A depthwise causal conv1d without padding, (B, T + K - 1, C) by (C, K, 1) -> (B, T, C), computed
    in float32 and returned in x's dtype: the conv kernels' definition."""
    y = mx.conv1d(x.astype(mx.float32), weight.astype(mx.float32), groups=weight.shape[0])
    return y.astype(x.dtype)


@on_cpu
def dense_reference(x: mx.array, w: mx.array) -> mx.array:
    """x @ w.T computed in float32, in the dtype MLX's matmul would return: the dense kernels' definition."""
    return (x.astype(mx.float32) @ w.astype(mx.float32).T).astype(output_dtype(x.dtype, w.dtype))


@on_cpu
def dense_within_tolerance(y: mx.array, x: mx.array, w: mx.array) -> tuple[bool, float]:
    """(ok, worst error as a fraction of the allowed error), with qmm's tolerance rule (acc_tol, EPS),
    over the columns `checked_columns` keeps."""
    (y,), (w,) = checked_columns(y, axis=-1), checked_columns(w)
    ref = dense_reference(x, w).astype(mx.float32)
    mag = mx.abs(x.astype(mx.float32)) @ mx.abs(w.astype(mx.float32)).T
    allowed = acc_tol(x.shape[-1]) * mag + EPS[y.dtype] * mx.abs(ref) + 1e-30
    ratio = (mx.abs(y.astype(mx.float32) - ref) / allowed).max().item()
    return bool(mx.all(mx.isfinite(y)).item() and ratio <= 1.0), float(ratio)
