"""Swap a model's quantized linear layers for kernel-backed ones, where the kernel proved itself.

    report = use_kernels(model)      # {"device", "swapped": {path: kernel}, "kept": {path: why}, "widened": ...}

Only `nn.QuantizedLinear` layers change (same parameters, same names), and mlx-lm's
`QuantizedSwitchLinear` (the stacked experts of MoE models: each row times its expert as a one-row
matmul: on the CPU through the qmm tiles, on GPUs through the gather kernel). gpt-oss's "mxfp4"
layers (4-bit e2m1 codes, power-of-two scales) run the GPU kernels, and on the CPU the int8-activation
one (activations='q8'). Embedding lookups stay MLX's; with head=True a tied `nn.QuantizedEmbedding`'s
`as_linear` (the output head of tied models) also uses the kernel. On the CPU, 2/3/5/6-bit layers first get their codes re-packed one
per byte (`widen_to_8bit`: the same weights, 8-bit layout), since the kernel reads 4 and 8 bits; the
GPU kernels read every width in place. With int8 activations (the CPU), the swapped layers' codes
(a tied head's table too) are then packed 4 columns chunk by chunk for the int8 tiles (packing.py:
the same bytes reordered, one stream a tile), and biases that are a fixed multiple of the scales
(GGUF Q4_0, Q8_0) are computed instead of read; restore_layers puts MLX's layout back.
Everything the kernel cannot do or did not pass its self-check for keeps MLX's op, with the reason
in the report.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from typing import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import afm7
from mlx_lm.models.switch_layers import QuantizedSwitchLinear

from .gpu import AFFINE_BITS
from .passes import prompt_chunk, prompt_pairs
from .packing import code_rows, implied_bias, layout_args, pack_layer, packable, unpack_layer
from .registry import device_backend_name, gather_for_layer, kernel_for_layer


class KernelQuantizedLinear(nn.QuantizedLinear):
    """nn.QuantizedLinear whose matmul is a custom kernel: y = qmm(x, w, scales, biases) (+ bias).
    _pack > 1: its codes are packed for the int8 CPU kernel; _bias_of_scale != 0: its biases are that
    times its scales, computed by the kernel (packing.py). restore_layers undoes both."""

    _pack, _bias_of_scale = 1, 0.0  # packing.layout_args
    _shared, _rows = None, None  # projections.py (GPUs): this layer's rows of a joined q/k/v or gate/up launch
    _gpu = False  # a GPU kernel: prompt chunks take MLX's op (passes.py)

    @classmethod
    def wrap(cls, layer: nn.QuantizedLinear, qmm: Callable[..., mx.array], kernel: str) -> "KernelQuantizedLinear":
        new = _new_like(cls, layer, kernel)
        new._qmm = qmm
        return new

    def __call__(self, x: mx.array) -> mx.array:
        if self._gpu and prompt_chunk(x):
            return super().__call__(x)  # nn.QuantizedLinear: MLX's quantized_matmul (views of a joined matrix too)
        if self._shared is not None:
            y = self._shared(x)[..., self._rows]
        else:
            y = self._qmm(x, self["weight"], self["scales"], self.get("biases"), self.group_size, self.bits,
                          **self._mode, **layout_args(self))
        return y + self["bias"] if "bias" in self else y


class KernelSplitQuantizedLinear(KernelQuantizedLinear):
    """A quantized layer that computes several projections as one matrix and returns its output split at
    `indices` (AFM's FusedQuantizedLinear: q, k and v), through the kernel."""

    def __call__(self, x: mx.array) -> mx.array:
        return super().__call__(x).split(self.indices, axis=-1)


SPLIT_OUTPUTS = {afm7.FusedQuantizedLinear: KernelSplitQuantizedLinear}  # its class -> the kernel's (same names)


def _new_like(cls, layer, kernel: str):
    """A `cls` holding `layer`'s parameters (the same arrays), its layout, and what kernel calls add:
    {"mode": ...} for other modes than affine (every kernel's default)."""
    new = cls.__new__(cls)
    nn.Module.__init__(new)
    new.group_size, new.bits, new.mode = layer.group_size, layer.bits, layer.mode
    _copy_params(layer, new)
    mode = getattr(layer, "mode", "affine")
    new.kernel, new._mode = kernel, {} if mode == "affine" else {"mode": mode}
    return new


class KernelQuantizedSwitchLinear(QuantizedSwitchLinear):
    """mlx-lm's QuantizedSwitchLinear (MoE experts) through a gather kernel (CPU or GPU): each (token,
    expert) row is computed as a one-row matmul with that expert's weights, whatever rows share the call."""

    _gpu, _top_k = False, 0  # GPUs: prompt chunks take MLX's gather where the model says its top-k (passes.py)

    @classmethod
    def wrap(cls, layer: QuantizedSwitchLinear, gather: Callable[..., mx.array], kernel: str):
        new = _new_like(cls, layer, kernel)
        new.global_scale, new._gather = None, gather
        return new

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool = False) -> mx.array:
        # SwitchGLU passes one row per (token, expert): anything else, and a GPU's prompt chunk, MLX's gather_qmm
        if x.shape[-2] != 1 or (self._gpu and prompt_pairs(indices, self._top_k)):
            return super().__call__(x, indices, sorted_indices)
        lead = mx.broadcast_shapes(x.shape[:-2], indices.shape)
        k = x.shape[-1]
        rows = mx.broadcast_to(x, (*lead, 1, k)).reshape(-1, k)  # (P, K): a token's row once per expert
        ids = mx.broadcast_to(indices, lead).reshape(-1).astype(mx.uint32)
        # rows one expert can get: a token takes an expert once. Sorted (flat) pairs give no bound: 8 rows a
        # pass then (more passes where an expert has more; 16 rows a pass hold ~1.5x the registers)
        most = math.prod(lead[:-1]) if len(lead) > 1 else min(len(ids), 8)
        grouped = {"per_expert": most} if getattr(self._gather, "groups_experts", False) else {}
        y = self._gather(rows, self["weight"], self["scales"], self.get("biases"), ids, self.group_size, self.bits,
                         **self._mode, **grouped)
        y = y.reshape(*lead, 1, -1)
        return y + mx.expand_dims(self["bias"][indices], -2) if "bias" in self else y


class KernelQuantizedEmbedding(nn.QuantizedEmbedding):
    """nn.QuantizedEmbedding: lookups MLX's (over rows unpacked where its codes are packed), `as_linear`
    (a tied head) through the kernel."""

    _pack, _bias_of_scale = 1, 0.0  # packing.layout_args
    _gpu = False  # a GPU kernel: prompt chunks take MLX's op (passes.py)

    @classmethod
    def wrap(cls, layer: nn.QuantizedEmbedding, qmm: Callable[..., mx.array], kernel: str) -> "KernelQuantizedEmbedding":
        new = _new_like(cls, layer, kernel)
        new.num_embeddings, new.dims, new._qmm = layer.num_embeddings, layer.dims, qmm
        object.__setattr__(new, "_params", _half_copies(new))  # not a parameter: a view for the kernel
        mx.eval(new._params)
        return new

    def __call__(self, x: mx.array) -> mx.array:
        if self._pack == 1:
            return super().__call__(x)
        biases = self.get("biases")
        return mx.dequantize(code_rows(self, x), scales=self["scales"][x], biases=None if biases is None else biases[x],
                             group_size=self.group_size, bits=self.bits, mode=self.mode)

    def as_linear(self, x: mx.array) -> mx.array:
        if self._gpu and prompt_chunk(x):
            return super().as_linear(x)
        scales, biases = self._params or (self["scales"], self["biases"])
        return self._qmm(x, self["weight"], scales, biases, self.group_size, self.bits, **self._mode, **layout_args(self))


def _half_copies(layer: nn.Module) -> tuple[mx.array, mx.array] | None:
    """float16 copies of float32 scales and biases when they hold exactly the same values (a GGUF
    Q8_0 token table: f16 scales, biases -128 x scale), else None. The tied head then reads 2 bytes
    per group value instead of 4 (SmolLM2: 7 -> 3.5 MB a step) with the same bits; lookups keep the
    float32 ones (their output dtype is the model's activations')."""
    s, b = layer["scales"], layer["biases"]
    if s.dtype != mx.float32:
        return None
    s16, b16 = s.astype(mx.float16), b.astype(mx.float16)
    exact = mx.array_equal(s16.astype(mx.float32), s).item() and mx.array_equal(b16.astype(mx.float32), b).item()
    return (s16, b16) if exact else None


def _copy_params(old: nn.Module, new: nn.Module) -> None:
    """weight, scales, biases (+ bias): the same arrays, made row-contiguous (the CPU kernel needs
    that; for arrays that already are, which is every loaded model, no copy is made)."""
    for name, value in old.items():
        new[name] = mx.contiguous(value) if name in ("weight", "scales", "biases") else value
    mx.eval(new.parameters())
    new.freeze()


WIDENED_BITS = (2, 3, 5, 6)  # on the CPU, codes of these widths are re-packed one per byte (8-bit)


def widen_to_8bit(layer: nn.Module) -> None:
    """Re-pack a 2/3/5/6-bit affine layer's codes one per byte: the same codes, scales and biases,
    so the same weights bit for bit, now in the 8-bit layout the CPU kernels (4 and 8 bits) and the
    fused block read. GGUF Q5_0/Q5_1/Q5_K and requantized Q3_K/Q2_K tensors load at those widths;
    MLX's own CPU matmul for them is ~10x slower than the kernel. Costs memory: 8 bits per weight."""
    w, bits, group = layer["weight"], layer.bits, layer.group_size
    k = w.shape[-1] * 32 // bits
    per = k * math.prod(w.shape[1:-1])  # weights per leading index: a row, or an expert's matrix
    step = max(1, (1 << 22) // per)  # ~16 MB of float32 codes at a time
    parts = []
    for a in range(0, w.shape[0], step):
        rows = w[a : a + step]
        ones = mx.ones((*rows.shape[:-1], k // group), mx.float32)
        codes = mx.dequantize(rows, ones, mx.zeros_like(ones), group_size=group, bits=bits)  # the codes, exactly
        parts.append(codes.astype(mx.uint8).view(mx.uint32))
        mx.eval(parts[-1])
    layer["weight"] = mx.concatenate(parts) if len(parts) > 1 else parts[0]
    layer.bits = 8
    mx.eval(layer["weight"])


def _why_not(layer, bits: int | None = None, backend: str = "cpu", activations: str = "f32") -> str | None:
    """None if the layer's layout (with `bits`-bit codes, default its own) is one the backend's kernels handle."""
    bits = bits or layer.bits
    mode = getattr(layer, "mode", "affine")
    if mode == "mxfp4" and (backend != "cpu" or activations == "q8") and not isinstance(layer, nn.QuantizedEmbedding):
        return None if (layer.group_size, bits) == (32, 4) else f"mxfp4 with group {layer.group_size}, {bits} bits"
    if mode != "affine" or layer.get("biases") is None:
        kinds = "affine (mxfp4 with int8 activations)" if backend == "cpu" else "affine and mxfp4"
        return f"quantization mode {mode!r} (the {backend} kernels do {kinds})"
    widths = (4, 8) if backend == "cpu" else AFFINE_BITS  # the GPU qmm reads every width MLX packs, in place
    if bits not in widths:
        return f"{bits}-bit weights (the {backend} kernels do {', '.join(map(str, widths))})"
    if layer.group_size % 32:
        return f"group size {layer.group_size} (kernels need a multiple of 32)"
    return None


def _candidates(model: nn.Module, head: bool):
    """(path, layer, wrapper class) for every layer that could be swapped."""
    heads = tied_heads(model) if head else set()
    for path, m in model.named_modules():
        if isinstance(m, (KernelQuantizedLinear, KernelQuantizedEmbedding, KernelQuantizedSwitchLinear)):
            continue  # already swapped
        if type(m) in SPLIT_OUTPUTS:
            yield path, m, SPLIT_OUTPUTS[type(m)]
        elif isinstance(m, nn.QuantizedLinear) and _own_call(m, nn.QuantizedLinear):
            yield path, m, KernelQuantizedLinear
        elif type(m) is QuantizedSwitchLinear:
            yield path, m, KernelQuantizedSwitchLinear
        elif (isinstance(m, nn.QuantizedEmbedding) and path in heads
              and _own_call(m, nn.QuantizedEmbedding, "as_linear")):
            yield path, m, KernelQuantizedEmbedding


def _own_call(m: nn.Module, base: type, method: str = "__call__") -> bool:
    """Does `m` compute `method` as `base` does? A subclass that wraps it would lose that in a swap: it keeps
    MLX's op (unless SPLIT_OUTPUTS has a kernel class for it)."""
    return getattr(type(m), method) is getattr(base, method)


def experts_per_token(model: nn.Module) -> int:
    """How many experts each token takes, as the model's (or its text model's) config says; 0 if none does."""
    for _, m in model.named_modules():
        for key in ("num_experts_per_tok", "top_k_experts"):  # Gemma 4 calls it top_k_experts
            if count := getattr(getattr(m, "args", None), key, None):
                return int(count)
    return 0


def tied_heads(model: nn.Module) -> set[str]:
    """Paths of the embedding tables that also serve as output heads, found as features.head finds the
    head: a module with no lm_head whose text model holds `embed_tokens` or `wte` (Gemma, Cohere, GPT-2:
    always tied, no flag), or one that says tie_word_embeddings (its own flag or its args'); a wrapper's text model
    counts (Gemma 4's and Qwen3.5's language_model), and so does a table that a module's own forward reads as its
    head (`self.<path>.as_linear(...)`: Gemma 3n's language model, OpenELM, Lille). Other tables (Gemma 4's
    per-layer inputs, 262144 x 8960 in E2B) are lookups only."""
    paths = set()
    for path, m in model.named_modules():
        if "lm_head" in m:
            continue
        if own := [p for p in _read_as_heads(type(m)) if _is_table(m, p)]:
            paths |= {f"{path}.{p}" if path else p for p in own}  # Gemma 3n's text model, OpenELM, Lille
            continue
        inner = m.get("model") if isinstance(m.get("model"), nn.Module) else None
        flag = getattr(m, "tie_word_embeddings", None)
        if flag is None:
            flag = getattr(getattr(m, "args", None), "tie_word_embeddings", None)
        table = next((name for name in ("embed_tokens", "wte") if inner is not None and name in inner), None)
        if table and flag is not False:  # wte: GPT-2's and StarCoder's tied table
            paths.add(f"{path}.model.{table}" if path else f"model.{table}")
        elif flag:
            tables = [p for p, e in m.named_modules() if isinstance(e, (nn.Embedding, nn.QuantizedEmbedding))]
            named = [p for p in tables if p.rpartition(".")[2] == "embed_tokens"]
            paths |= {f"{path}.{p}" if path else p for p in named or tables}
    return paths


@functools.lru_cache(maxsize=None)
def _read_as_heads(cls: type) -> tuple[str, ...]:
    """The tables `cls`'s forward reads as an output head: `self.<path>.as_linear(...)`."""
    try:
        return tuple(re.findall(r"self\.([\w.]+)\.as_linear\(", inspect.getsource(cls.__call__)))
    except (OSError, TypeError):
        return ()


def _is_table(module: nn.Module, path: str) -> bool:
    for name in path.split("."):
        module = module.get(name) if isinstance(module, nn.Module) else None
    return isinstance(module, (nn.Embedding, nn.QuantizedEmbedding))


def use_kernels(model: nn.Module, *, head: bool = True, gpu: bool = False, device: mx.Device | None = None,
                activations: str = "f32", pack: bool = True) -> dict:
    """Swap in kernel-backed layers where the device's kernel passed its self-check; report what happened.

    On a GPU the Metal/CUDA kernel is used only with gpu=True (the engine decides by timing it, see
    install.py). activations='q8' (CPU): the int8-activation kernel, llama.cpp's arithmetic.
    With q8 the swapped layers are laid out for the int8 tiles (packing.py: codes packed, biases
    implied by the scales where they are); pack=False keeps MLX's layout (benchmarks compare).
    Report: {"device": "cpu", "backend": "cpu", "swapped": {path: kernel}, "kept": {path: reason},
    "widened": {path: why}, "packed": count}. Safe to call twice (already swapped layers are left alone).
    """
    device = device or mx.default_device()
    device = mx.Device(device) if isinstance(device, mx.DeviceType) else device
    backend = device_backend_name(device)
    if backend != "cpu":
        activations = "f32"  # int8 activations are a CPU kernel; GPUs keep their own
    report = {"device": str(device), "backend": backend, "activations": activations, "swapped": {}, "kept": {},
              "widened": {}, "packed": 0}
    swaps, top_k = [], experts_per_token(model)
    for path, layer, wrapper in _candidates(model, head):
        if backend == "cpu" and _widen(layer, device):
            report["widened"][path] = f"{layer.bits}-bit codes re-packed as 8-bit (the same weights)"
            widen_to_8bit(layer)
        why = _why_not(layer, backend=backend, activations=activations)
        if why is None and backend != "cpu" and not gpu:
            why = f"the {backend} kernel is opt-in (use_kernels(..., gpu=True))"
        qmm = None
        if why is None:
            qmm, why = _kernel_for(layer, wrapper is KernelQuantizedSwitchLinear, device, backend, activations)
        if qmm is None:
            report["kept"][path] = why
            continue
        module = wrapper.wrap(layer, qmm, why)
        module._gpu = backend != "cpu"
        if wrapper is KernelQuantizedSwitchLinear:  # how many experts each token takes, where the model says
            module._top_k = top_k
        swaps.append((path, module))
        report["swapped"][path] = why
    for path, module in swaps:
        _set_module(model, path, module)
        if pack and backend == "cpu" and activations == "q8":
            report["packed"] += _int8_layout(module)
    return report


def _int8_layout(module: nn.Module) -> bool:
    """Lay out a swapped linear layer or tied head for the int8 tiles (the self-check compared both
    for its shape): codes packed where N allows, biases implied by the scales where they are
    (packing.py). Not MoE experts (3-D). Returns whether the codes were packed."""
    if type(module) not in (KernelQuantizedLinear, KernelSplitQuantizedLinear, KernelQuantizedEmbedding):
        return False
    module._bias_of_scale = implied_bias(module)
    if packable(module):
        pack_layer(module)
    return module._pack > 1


def _kernel_for(layer, experts: bool, device, backend: str, activations: str):
    """(kernel function, description) for this layer on this device, or (None, why not)."""
    n, k = layer["weight"].shape[-2], layer["weight"].shape[-1] * 32 // layer.bits
    args = (n, k, layer.group_size, layer.bits, layer["scales"].dtype, device)
    mode = getattr(layer, "mode", "affine")
    if experts and backend != "cpu":
        return gather_for_layer(*args, mode=mode)
    qmm, why = kernel_for_layer(*args, activations, mode=mode)
    if qmm is not None and experts:  # the CPU gathers rows through the same tiles it just checked
        from .cpu import cpu_gather_qmm_function

        qmm = cpu_gather_qmm_function(activations=activations)
    return qmm, why


def _widen(layer, device) -> bool:
    """Should this layer's codes be widened to bytes for the CPU kernel (which then passed its check)?"""
    if layer.bits not in WIDENED_BITS or _why_not(layer, bits=8):
        return False
    n, k = layer["weight"].shape[-2], layer["weight"].shape[-1] * 32 // layer.bits
    return kernel_for_layer(n, k, layer.group_size, 8, layer["scales"].dtype, device)[0] is not None


def restore_layers(model: nn.Module) -> int:
    """MLX's quantized_matmul again in every swapped layer (same parameters; widened layers stay
    8-bit, the same weights); returns how many."""
    count = 0
    for _, m in model.named_modules():
        if isinstance(m, (KernelQuantizedLinear, KernelQuantizedEmbedding, KernelQuantizedSwitchLinear)):
            unpack_layer(m)
            m.__class__ = {KernelQuantizedLinear: nn.QuantizedLinear, KernelQuantizedEmbedding: nn.QuantizedEmbedding,
                           KernelQuantizedSwitchLinear: QuantizedSwitchLinear,
                           **{kernel: own for own, kernel in SPLIT_OUTPUTS.items()}}[type(m)]
            count += 1
    return count


def _set_module(model: nn.Module, path: str, module: nn.Module) -> None:
    """model.<path> = module, where path parts that are digits index mlx-lm's lists of layers."""
    *parents, last = path.split(".")
    node = model
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else getattr(node, part)
    if isinstance(node, list):
        node[int(last)] = module
    else:
        setattr(node, last, module)
