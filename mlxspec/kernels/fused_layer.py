"""One MLX primitive per decoder layer on the CPU: a step's graph shrinks from ~850 nodes to ~100.

MLX spends ~6 us dispatching each graph node on these CPUs; a SmolLM2 step through separate ops
(7 matmuls, 2 norms, 2 ropes, attention, swiglu, reshapes, adds, cache updates per layer) spent
~5 ms of ~17 there. cpu/fused_layer.cpp runs a whole llama-family block (llama, mistral, qwen2,
qwen3's per-head q/k norms; plain or Llama 3 scaled RoPE) in one node with the same kernels and the
same roundings.

    report = use_fused_layers(model)    # after the other CPU kernels are installed (install.py)
    restore_fused_layers(model)

A block is fused only when every part of it already runs mlxspec's CPU kernels (quantized matmul,
RMSNorm, RoPE, swiglu, attention), and a call goes to the fused primitive only for a signature that
gave bit-identical results to the module path on first use (one and several rows, the KV cache
too). Anything else keeps the modules: a GPU, a batch, a cache other than mlx-lm's KVCache (or a
subclass that only changes the stored dtype, `stored_dtype`: mlxspec's HalfKVCache) or mlxspec's
WindowKVCache (its sliding layers: the window mask it made), an architecture other than
llama/qwen2/qwen3's block (qwen3: RMSNorm of each q and k head), gemma3's (qwen3's head norms,
sandwich norms, GeGLU, sliding windows; not in float16, where its residual adds clip) or phi3's
(q/k/v and gate/up as one matmul each: row slices of them; not with its long-rope scaling).
Inside a compiled step (step_graph.py) a block's cache is a KVView: the primitive takes the position
as an array, read when the step runs, and that path is self-checked against the module path too; a
sliding layer's view takes its buffer row and its position as two arrays (they differ once its cache
compacts) and reads from the row its window cache would return from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from . import registry
from ..cache import HalfKVCache, KVView, WindowKVCache
from .hooks import routed
from .tree_mask import TreeMask
from .layers import KernelQuantizedLinear
from .pointwise import KernelOffsetRMSNorm, KernelRMSNorm, KernelRoPE, _ext, geglu_swapped

FUSED_FROM = "_mlxspec_fused_from"  # class attribute of a fused block class: the block class it wraps
GEMMA3 = ("mlx_lm.models.gemma3_text", "TransformerBlock")
PHI3 = ("mlx_lm.models.phi3", "TransformerBlock")  # q/k/v and gate/up as one matmul each
BLOCKS = {("mlx_lm.models.llama", "TransformerBlock"), ("mlx_lm.models.qwen2", "TransformerBlock"),
          ("mlx_lm.models.qwen3", "TransformerBlock"), GEMMA3, PHI3}
GEMMA_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
_classes: dict[type, type] = {}


@dataclass
class LayerPlan:
    """One block's fused primitive, bound once at install to the block's own weight arrays."""

    layer: object  # the extension's FusedLayer: (x, keys, values, offset) -> [out, keys', values']
    kv_heads: int
    head_dim: int
    key_parts: list  # arrays whose dtypes, with x's, make the keys' dtype (norm, k_proj scales, bias)
    signature: tuple
    ok: dict = field(default_factory=dict)  # _ok_key(x, cache) -> (self-check passed, the cache's dtype)


@dataclass(frozen=True)
class RowSlice:
    """Output rows [start, stop) of a quantized layer, as one projection: phi3's q, k and v are rows
    of its qkv_proj, gate and up of its gate_up_proj. The qmm kernel gives each output row the same
    arithmetic whatever the layer's row count, so the slices compute the fused layer's bits."""

    layer: KernelQuantizedLinear
    start: int
    stop: int

    def __getitem__(self, name: str) -> mx.array:
        return self.layer[name][self.start : self.stop]

    def __contains__(self, name: str) -> bool:
        return name in self.layer

    def __getattr__(self, name: str):  # bits, group_size, _qmm, _pack, _bias_of_scale
        return getattr(self.layer, name)


def _projections(block: nn.Module) -> list | None:
    """(q, k, v, o, gate, up, down) as the fused primitive takes them (phi3's fused layers as row
    slices), or None where one does not run the qmm kernel."""
    if not _phi3(block):
        projs = [_get(block, p) for p in PROJECTIONS]
    else:
        attn, mlp = block.self_attn, block.mlp
        qkv, gate_up = attn.qkv_proj, mlp.gate_up_proj
        q, kv = attn.n_heads * attn.head_dim, attn.n_kv_heads * attn.head_dim
        if not isinstance(qkv, KernelQuantizedLinear) or not isinstance(gate_up, KernelQuantizedLinear):
            return None
        half = gate_up["weight"].shape[0] // 2  # gate, then up (mlx-lm's split)
        projs = [RowSlice(qkv, 0, q), RowSlice(qkv, q, q + kv), RowSlice(qkv, q + kv, q + 2 * kv), attn.o_proj,
                 RowSlice(gate_up, 0, half), RowSlice(gate_up, half, 2 * half), mlp.down_proj]
    return projs if all(isinstance(p, (KernelQuantizedLinear, RowSlice)) for p in projs) else None


def _kind(block: nn.Module) -> tuple[str, str]:
    """(module, class) of the block's own class, fused or not: a key of BLOCKS."""
    base = getattr(type(block), FUSED_FROM, type(block))
    return base.__module__, base.__name__


def _phi3(block: nn.Module) -> bool:
    return _kind(block) == PHI3


def _get(block: nn.Module, path: str):
    node = block
    for part in path.split("."):
        node = getattr(node, part, None)
    return node


def _gemma(block: nn.Module) -> bool:
    return _kind(block) == GEMMA3


def _block_norms(block: nn.Module) -> list:
    """The block's own norms: (input, post-attention) or gemma3's four."""
    return [getattr(block, n) for n in (GEMMA_NORMS if _gemma(block) else GEMMA_NORMS[:2])]


def _why_not(block: nn.Module) -> str | None:
    """None if this block is one the fused primitive computes exactly as its modules do."""
    if _kind(block) not in BLOCKS:
        return "{}.{} is not a llama/qwen2/qwen3/gemma3/phi3 block".format(*_kind(block))
    attn, mlp = getattr(block, "self_attn", None), getattr(block, "mlp", None)
    projs = _projections(block)
    if projs is None:
        return "a projection does not run the qmm kernel"
    if _phi3(block) and (attn.qkv_proj["weight"].shape[0] != (attn.n_heads + 2 * attn.n_kv_heads) * attn.head_dim
                         or mlp.gate_up_proj["weight"].shape[0] % 2):
        return "phi3's fused projections do not split into q, k, v and gate, up"
    if _activations(projs) is None:
        return "projections take different activations (f32 and q8)"
    if any(isinstance(p, RowSlice) and (p.start % p._pack or p.stop % p._pack) for p in projs):
        return "a row slice of a packed layer does not start and end on a packed group"
    norm = KernelOffsetRMSNorm if _gemma(block) else KernelRMSNorm  # gemma's norms read 1.0 + weight
    if any(type(n) is not norm for n in _block_norms(block)):
        return "a norm does not run the rms_norm kernel"
    head_norms = _head_norms(attn)
    if any(type(n) is not norm for n in head_norms) or (_gemma(block) and not head_norms):
        return "q_norm/k_norm do not run the rms_norm kernel"
    if head_norms and head_norms[0].eps != head_norms[1].eps:
        return "q_norm and k_norm have different eps"
    if type(attn.rope) is not KernelRoPE:
        return f"rope {type(attn.rope).__name__} does not run the rope kernel"
    if routed(attn, "scaled_dot_product_attention") is None:
        return "attention is not routed to the kernel"
    if not (geglu_swapped(mlp) if _gemma(block) else routed(mlp, "swiglu") is not None):
        return "the MLP's activation does not run its kernel (swiglu, or gemma3's geglu)"
    return None


def _activations(projs: list) -> str | None:
    """'f32' or 'q8' when every projection's kernel takes that kind of activations, else None."""
    kinds = {getattr(p._qmm, "activations", "f32") for p in projs}
    return kinds.pop() if len(kinds) == 1 else None


def _head_norms(attn: nn.Module) -> list:
    """qwen3's RMSNorm of each q and k head, [q_norm, k_norm]; [] for llama/qwen2."""
    return [attn.q_norm, attn.k_norm] if hasattr(attn, "q_norm") else []


def _plan(block: nn.Module) -> LayerPlan:
    attn = block.self_attn
    projs = _projections(block)
    heads, kv_heads = attn.n_heads, attn.n_kv_heads
    head_dim = projs[0]["scales"].shape[0] // heads
    bits, groups, bias = [p.bits for p in projs], [p.group_size for p in projs], [int("bias" in p) for p in projs]
    head_norms = _head_norms(attn)
    norm1, *rest = _block_norms(block)  # the MLP's norm: post_attention_layernorm, gemma's pre_feedforward_layernorm
    norm2, post = (rest[1], [rest[0], rest[2]]) if _gemma(block) else (rest[0], [])
    fixed = [norm1.norm_weight(), *(p[n] for p in projs for n in ("weight", "scales", "biases")), norm2.norm_weight(),
             attn.rope._inv_freq, *(p["bias"] for p in projs if "bias" in p), *(n.norm_weight() for n in head_norms),
             *(n.norm_weight() for n in post)]
    mx.eval(fixed)  # phi3's row slices become views now, not graph nodes of every step
    qk_eps = float(head_norms[0].eps) if head_norms else -1.0
    q8 = _activations(projs) == "q8"
    layer = _ext().FusedLayer(fixed, heads, kv_heads, head_dim, attn.rope.dims, bool(attn.rope.traditional),
                              float(attn.rope.scale), float(attn.scale), float(norm1.eps), float(norm2.eps), groups,
                              bits, bias, qk_norm_eps=qk_eps, q8=q8, post_norm_eps=[float(n.eps) for n in post],
                              packs=[p._pack for p in projs] if q8 else [],
                              bias_of_scale=[p._bias_of_scale for p in projs] if q8 else [])
    k = projs[1]
    key_parts = [norm1.norm_weight(), k["scales"], *([k["bias"]] if "bias" in k else []),
                 *([attn.k_norm.norm_weight()] if head_norms else [])]
    signature = ("fused_layer", type(block).__module__, heads, kv_heads, head_dim, tuple(bits), tuple(groups),
                 tuple(bias), tuple(str(p["scales"].dtype) for p in projs), tuple(p["weight"].shape for p in projs),
                 qk_eps, q8, tuple(p._pack for p in projs), tuple(p._bias_of_scale for p in projs))
    return LayerPlan(layer, kv_heads, head_dim, key_parts, signature)


def _fused_class(base: type) -> type:
    if base not in _classes:
        _classes[base] = type(base.__name__, (base,), {FUSED_FROM: base, "__module__": base.__module__,
                                                       "__call__": _fused_call})
    return _classes[base]


def tree_ready(model: nn.Module, dtype: mx.Dtype, cache: KVCache) -> bool:
    """Can every block of this model run a TreeMask pass (fused, self-checked for `dtype` and the
    kind of cache the model decodes with: `cache`, a fresh one of that kind)?"""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers or mx.default_device() != mx.cpu:
        return False
    probe = mx.zeros((1, 1, 1), dtype)
    for layer in layers:
        if not hasattr(type(layer), FUSED_FROM) or _gemma(layer):  # no tree over a sliding window
            return False
        dims = layer.input_layernorm.weight.shape[0]
        if not _applies(layer, mx.broadcast_to(probe, (1, 1, dims)), None, cache):
            return False
    return True


def _fused_call(self, x: mx.array, mask=None, cache=None):
    base = getattr(type(self), FUSED_FROM)
    if isinstance(mask, TreeMask):  # callers check tree_ready first: the module path has no tree masks
        if not _applies(self, x, "causal" if x.shape[1] > 1 else None, cache):
            raise RuntimeError("a tree pass reached a block the fused kernel cannot run")
        return fused_forward(self._mlxspec_plan, x, cache, mask.parents)
    if _applies(self, x, mask, cache):
        return fused_forward(self._mlxspec_plan, x, cache)
    return base.__call__(self, x, mask, cache)


def _stored_dtype(cache, keys: mx.Dtype) -> mx.Dtype | None:
    """The dtype this cache keeps keys computed in `keys` in, None for a cache the block cannot write
    (the C++ side takes a cache in the keys' dtype, or float16 under float32 keys)."""
    if type(cache) is KVCache:
        return keys
    if isinstance(cache, KVView):  # a compiled step's: its buffers say
        kv = cache.keys.dtype
        return kv if kv == keys or (keys == mx.float32 and kv == mx.float16) else None
    stored = getattr(cache, "stored_dtype", None)
    if not isinstance(cache, (KVCache, WindowKVCache)) or stored is None:
        return None
    kv = stored(keys)
    return kv if kv == keys or (keys == mx.float32 and kv == mx.float16) else None


def _ok_key(x: mx.array, cache) -> tuple:
    """What a block's self-check verdict depends on besides its weights: x's dtype, the kind of cache."""
    if isinstance(cache, KVView):
        return x.dtype, KVView, cache.keys.dtype, cache.window > 0
    return x.dtype, type(cache), getattr(cache, "half", False)


def _applies(block, x: mx.array, mask, cache) -> bool:
    window = isinstance(cache, WindowKVCache)  # a sliding layer: the mask is the window the cache made
    view = isinstance(cache, KVView)  # a compiled step: the mask is the view's causal rows over its buffer
    if not (isinstance(cache, KVCache) or window or view) or x.ndim != 3 or x.shape[0] != 1 or mx.default_device() != mx.cpu:
        return False
    if not (isinstance(mask, mx.array) if window or view else
            mask is None if x.shape[1] == 1 else isinstance(mask, str) and mask == "causal"):
        return False
    if _gemma(block) and x.dtype == mx.float16:  # gemma3 clips its float16 residual adds
        return False
    plan, key = block._mlxspec_plan, _ok_key(x, cache)
    if key not in plan.ok:
        kv = _stored_dtype(cache, mx.result_type(x.dtype, *(a.dtype for a in plan.key_parts)))
        if x.dtype not in (mx.float32, mx.float16, mx.bfloat16) or kv is None:
            return False
        check = lambda: _self_check(block, x.dtype, _like(cache, kv), kv, cache.window if view else None)  # noqa: E731
        kind = ("window",) if window or (view and cache.window) else ()
        plan.ok[key] = (_record().check((*plan.signature, str(x.dtype), str(kv), *kind), check) is None, kv)
    return plan.ok[key][0]


def _like(cache, kv: mx.Dtype):
    """A fresh, empty cache of this one's kind (its window, slack and storage; a view's: the KVCache
    that stores `kv`, its buffers' dtype)."""
    if isinstance(cache, KVView):  # (a HalfKVCache stores float16 keys as they come, float32 ones as float16)
        if cache.window:
            return lambda: WindowKVCache(cache.window, half=kv == mx.float16)
        return HalfKVCache if kv == mx.float16 else KVCache
    if isinstance(cache, WindowKVCache):
        return lambda: WindowKVCache(cache.window, cache.slack, half=cache.half)
    return type(cache)


def _reserve(cache: KVCache, rows: int, kv_heads: int, head_dim: int, dtype: mx.Dtype) -> None:
    """Room for `rows` more positions, allocated as mlx-lm's KVCache.update_and_fetch allocates it."""
    prev = cache.offset
    if cache.keys is not None and prev + rows <= cache.keys.shape[2]:
        return
    n_steps = (cache.step + rows - 1) // cache.step
    new_k = mx.zeros((1, kv_heads, n_steps * cache.step, head_dim), dtype)
    new_v = mx.zeros((1, kv_heads, n_steps * cache.step, head_dim), dtype)
    if cache.keys is None:
        cache.keys, cache.values = new_k, new_v
        return
    if prev % cache.step != 0:
        cache.keys, cache.values = cache.keys[..., :prev, :], cache.values[..., :prev, :]
    cache.keys = mx.concatenate([cache.keys, new_k], axis=2)
    cache.values = mx.concatenate([cache.values, new_v], axis=2)


def fused_forward(plan: LayerPlan, x: mx.array, cache, parents: tuple[int, ...] = ()) -> mx.array:
    """The block on x (1, L, D) in one primitive; this step's keys and values go into the cache.
    `parents`: a tree pass (TreeMask), else the rows are a causal chain. A WindowKVCache makes room
    as its update_and_fetch would, and attention reads the rows that would return, over its window."""
    rows, prev, kv = x.shape[1], cache.offset, plan.ok[_ok_key(x, cache)][1]
    if isinstance(cache, KVView):  # a compiled step: the position is an array, the buffers have room
        sliding = {"position": cache.offset, "window": cache.window} if cache.window else {}  # its own buffer row `at`
        out, cache.keys, cache.values = plan.layer(x, cache.keys, cache.values, cache.at, list(parents), **sliding)
        return out
    if isinstance(cache, WindowKVCache):
        held, past = cache.reserve(rows, (1, plan.kv_heads), plan.head_dim, plan.head_dim, kv, kv)
        out, cache.keys, cache.values = plan.layer(x, cache.keys, cache.values, held, list(parents), position=prev,
                                                   key_start=held - past, window=cache.attention_window)
    else:
        _reserve(cache, rows, plan.kv_heads, plan.head_dim, kv)
        out, cache.keys, cache.values = plan.layer(x, cache.keys, cache.values, prev, list(parents))
    cache.offset += rows
    return out


def _self_check(block, dtype, make_cache, kv: mx.Dtype, view: int | None = None) -> str | None:
    """The fused block equals the module path bit for bit: a 5-row prefix, then 1 and 3 rows, cache
    (made by `make_cache`, holding `kv`) too. `view` (a window, 0 for none): the fused calls go through
    KVViews over fixed buffers with the position as an array (as a compiled step makes them)."""
    base = getattr(type(block), FUSED_FROM)
    dims = block.input_layernorm.weight.shape[0]
    x = (mx.random.normal((1, 9, dims), key=mx.random.key(7)) * 2).astype(dtype)
    view_of = view is not None
    a, b = make_cache(), _Views(block._mlxspec_plan, kv, view or 0) if view_of else make_cache()
    block._mlxspec_plan.ok[_ok_key(x, b.at(0, 0) if view_of else a)] = (True, kv)  # (the key being checked)
    for lo, hi in ((0, 5), (5, 6), (6, 9)):
        rows = x[:, lo:hi]
        mask = a.make_mask(hi - lo) if isinstance(a, WindowKVCache) else "causal" if hi - lo > 1 else None
        want = base.__call__(block, rows, mask, a)
        got = fused_forward(block._mlxspec_plan, rows, b.at(lo, hi - lo) if view_of else b)
        if got.dtype != want.dtype or not mx.array_equal(got, want).item():
            return f"{hi - lo}-row output differs from the module path"
        (ka, va), (kb, vb) = _held(a), b.held(hi) if view_of else _held(b)
        if kb.dtype != ka.dtype or not (mx.array_equal(ka, kb).item() and mx.array_equal(va, vb).item()):
            return f"KV cache after {hi - lo} rows differs from the module path"
    return None


class _Views:
    """Fixed cache buffers seen through a KVView per call, as a compiled step sees its cache (the self-check's)."""

    def __init__(self, plan: LayerPlan, kv: mx.Dtype, window: int = 0, capacity: int = 16):
        shape = (1, plan.kv_heads, capacity, plan.head_dim)
        self.keys, self.values, self.view, self.window = mx.zeros(shape, kv), mx.zeros(shape, kv), None, window

    def at(self, position: int, rows: int) -> KVView:
        """A view for `rows` rows at this position (over the buffers as the last view left them)."""
        if self.view is not None:
            self.keys, self.values = self.view.keys, self.view.values
        offset = mx.array(position, dtype=mx.int32)
        self.view = KVView(self.keys, self.values, offset, offset.reshape(1), offset.reshape(1) + rows, self.window)
        return self.view

    def held(self, positions: int) -> tuple[mx.array, mx.array]:
        return self.view.keys[..., :positions, :], self.view.values[..., :positions, :]


def _held(cache) -> tuple[mx.array, mx.array]:
    """The keys and values a cache holds (a window cache's from its first kept position)."""
    if isinstance(cache, WindowKVCache):
        return tuple(cache.state)
    return cache.keys[..., : cache.offset, :], cache.values[..., : cache.offset, :]


def _load(backend: str):
    if backend != "cpu":
        from .build import KernelUnavailable

        raise KernelUnavailable(f"the fused layer is CPU-only ({backend} keeps its per-op kernels)")
    ext = _ext()
    if ext is None:
        from .build import KernelUnavailable

        raise KernelUnavailable("the CPU extension is unavailable")
    return ext, "one primitive per llama/qwen2/qwen3/gemma3/phi3 block"


registry.register("fused_layer", _load)


def _record() -> registry.KernelRecord:
    return registry.kernel("fused_layer", "cpu")


def use_fused_layers(model: nn.Module) -> dict:
    """Fuse every block whose parts all run the CPU kernels; report {"fused": n, "kept": {path: why}}."""
    report = {"kernel": "fused_layer", "fused": 0, "kept": {}, "error": _record().error}
    if report["error"]:
        return report
    for path, m in model.named_modules():
        if hasattr(type(m), FUSED_FROM) or _kind(m) not in BLOCKS:
            continue
        why = _why_not(m)
        if why:
            report["kept"][path] = why
            continue
        m._mlxspec_plan = _plan(m)
        m.__class__ = _fused_class(type(m))
        report["fused"] += 1
    return report


def restore_fused_layers(model: nn.Module) -> None:
    """The blocks' own classes (their modules) again."""
    for _, m in model.named_modules():
        base = getattr(type(m), FUSED_FROM, None)
        if base is not None:
            m.__class__ = base
            del m._mlxspec_plan


def fused(model: nn.Module) -> bool:
    return any(hasattr(type(m), FUSED_FROM) for _, m in model.named_modules())


def check_typical(dims: int = 256, heads: int = 4, kv_heads: int = 2, ffn: int = 512) -> None:
    """Self-check the fused layer on a small 4-bit llama block now (for `mlxspec doctor`)."""
    from mlx_lm.models import llama

    from .install import install_kernels

    args = llama.ModelArgs(model_type="llama", hidden_size=dims, num_hidden_layers=1, intermediate_size=ffn,
                           num_attention_heads=heads, num_key_value_heads=kv_heads, rms_norm_eps=1e-5, vocab_size=64)
    block = llama.TransformerBlock(args)
    nn.quantize(block, group_size=32, bits=4)
    install_kernels(block)
    mx.eval(block(mx.zeros((1, 2, dims)), "causal", KVCache()))
