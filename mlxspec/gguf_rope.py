"""The ropes a GGUF needs beyond what mlx-lm's modules build, put on every layer of the model: those a
file carries as tensors rather than metadata, and the interleaved rope some modules do not offer.

    tensors = {name: array for the names in ROPE_TENSORS}   # read with the weights, not weights themselves
    apply_file_rope(name, arch, model, config, tensors, metadata, path, context)   # name: the file's architecture

- `rope_freqs` (Llama 3.x): a divisor per frequency (FreqFactorRoPE); Gemma 4's (1e30: an unrotated pair)
  on its global layers only, as llama.cpp applies it (its "proportional" rope).
- interleave_rope: the interleaved rope mlx-lm's granite/ministral3 modules do not build.
- `rope_factors_long` / `rope_factors_short` (Phi-3/Phi-4 "LongRoPE", e.g. Phi-4-mini): a divisor per
  frequency for contexts past the original one and for those within it, and `rope.scaling.attn_factor`
  multiplying the rotated dims of q and k. llama.cpp picks the short factors when its context per
  sequence is at most `rope.scaling.original_context_length` (Ollama's default context is), the long
  ones past it, and keeps that choice for the whole context: switching factors mid-sequence would leave
  cached keys rotated the other way. mlxspec chooses the same way by the context a model is loaded for
  (`context`: Ollama's num_ctx, from a Modelfile; None: the default, within the original context). Within
  it, the original context is the model's window (a longer prompt is refused with the window's size);
  past it, the window is the trained one. mlx-lm's phi3 would use the long factors at every length,
  which neither llama.cpp nor Hugging Face does for short contexts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.rope_utils import Llama3RoPE, SuScaledRoPE

from .errors import ModelLoadError

if TYPE_CHECKING:
    from .gguf_archs import Arch

ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
LONGROPE = ("rope_factors_long.weight", "rope_factors_short.weight")


def apply_file_rope(name: str, arch: Arch, model: nn.Module, config: dict, tensors: dict[str, mx.array], metadata: dict,
                    path: Path, context: int | None = None) -> None:
    """Give every layer the rope the file's tensors describe (none: the rope mlx-lm built stays)."""
    scaling = metadata.get(f"{name}.rope.scaling.type")
    if scaling == "longrope" and not all(t in tensors for t in LONGROPE):
        raise ModelLoadError(f"{path.name}: longrope scaling without its rope_factors_long/short tensors")
    if "rope_freqs.weight" in tensors and arch.model_type == "gemma4_text":
        apply_global_rope_freqs(model, config, tensors["rope_freqs.weight"], path)
    elif "rope_freqs.weight" in tensors:
        apply_rope_freqs(arch, model, config, tensors["rope_freqs.weight"], path)
    if any(t in tensors for t in LONGROPE):
        _every_layer(model, _longrope(name, config, tensors, metadata, path, context))


def _every_layer(model: nn.Module, rope: nn.Module) -> None:
    """One rope module for every layer's attention (per model: this instance's modules)."""
    for layer in model.layers:
        layer.self_attn.rope = rope


def _longrope(name: str, config: dict, tensors: dict[str, mx.array], metadata: dict, path: Path,
              context: int | None) -> nn.Module:
    """Phi-3/4's rope for a `context`: within the original one the short factors, and the original
    context becomes the config's window (what `context_length` then reports); past it the long ones
    over the trained window. The attention factor either way."""
    get = lambda key, default=None: metadata.get(f"{name}.{key}", default)  # noqa: E731
    rope_dims = int(config["head_dim"] * config.get("partial_rotary_factor", 1.0))
    short, long = tensors.get("rope_factors_short.weight"), tensors.get("rope_factors_long.weight")
    original = get("rope.scaling.original_context_length")
    if name != "phi3" or short is None or long is None or original is None:
        raise ModelLoadError(f"{path.name}: rope_factors tensors are supported for phi3 files with both factor "
                             "tensors and rope.scaling.original_context_length")
    if short.size != rope_dims // 2 or long.size != rope_dims // 2:
        raise ModelLoadError(f"{path.name}: rope_factors of {short.size}/{long.size} values for {rope_dims} rotary dims")
    trained, original = config["max_position_embeddings"], int(original)
    attn_factor = float(get("rope.scaling.attn_factor", 1.0))
    long_context = context is not None and context > original  # llama.cpp: n_ctx_per_seq > n_ctx_orig_yarn
    factors = long if long_context else short
    if not long_context:
        config["max_position_embeddings"] = min(original, trained)
    config["longrope"] = {"factors": "long" if long_context else "short", "attn_factor": attn_factor,
                          "original_context_length": original, "trained_context_length": trained}
    # mlx-lm's LongRoPE module applies the factors it is given as `long_factor` at every position and
    # scales the rotated dims by `long_mscale`: llama.cpp's rope with either set of factors
    return SuScaledRoPE(rope_dims, base=config["rope_theta"], max_position_embeddings=trained,
                        original_max_position_embeddings=original, long_factor=factors.astype(mx.float32).tolist(),
                        long_mscale=attn_factor)


class FreqFactorRoPE(Llama3RoPE):
    """RoPE whose frequency i is divided by factors[i]: llama.cpp's `rope_freqs` tensor, which is
    how Llama 3.x's rope scaling reaches a GGUF (theta_i = pos * base^(-2i/d) / factors[i]).
    mlx-lm's Llama3RoPE with the periods read from the file instead of derived from the config:
    its call (mx.fast.rope over `_freqs`) is inherited, so the CPU kernels treat both alike."""

    def __init__(self, dims: int, base: float, traditional: bool, factors: mx.array):
        nn.Module.__init__(self)
        self.dims, self.traditional, self.max_position_embeddings = dims, traditional, None
        # mx.fast.rope's `freqs` are periods: theta_i = pos / freqs[i]
        self._freqs = (base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)) * factors.astype(mx.float32)


def interleave_rope(arch: Arch, model: nn.Module, config: dict) -> None:
    """Granite, mistral3: llama.cpp's converter permuted q/k for interleaved rope, which mlx-lm's
    modules do not offer: each layer gets the same rope, interleaved (per model: this instance's modules)."""
    if not arch.interleaved_rope:
        return
    from mlx_lm.models.rope_utils import initialize_rope

    scaling = config.get("rope_parameters") or config.get("rope_scaling")
    _every_layer(model, initialize_rope(config["head_dim"], config["rope_theta"], True, scaling,
                                        config["max_position_embeddings"]))


def apply_rope_freqs(arch: Arch, model: nn.Module, config: dict, factors: mx.array, path: Path) -> None:
    """Give every layer the rope the file's `rope_freqs` tensor describes."""
    dims = config["head_dim"]
    if not arch.rope_freqs or factors.size != dims // 2 or "rope_scaling" in config:
        raise ModelLoadError(f"{path.name}: a rope_freqs tensor of {factors.size} values is not supported here")
    _every_layer(model, FreqFactorRoPE(dims, config["rope_theta"], config["rope_traditional"], factors))


def apply_global_rope_freqs(model: nn.Module, config: dict, factors: mx.array, path: Path) -> None:
    """Gemma 4: the `rope_freqs` divisors over the global layers' whole head; sliding layers keep theirs."""
    dims = config["global_head_dim"]
    if factors.size != dims // 2:
        raise ModelLoadError(f"{path.name}: a rope_freqs tensor of {factors.size} values for global heads of {dims}")
    rope = FreqFactorRoPE(dims, config["rope_parameters"]["full_attention"]["rope_theta"], False, factors)
    for layer in model.layers:
        if layer.self_attn.layer_type == "full_attention":
            layer.self_attn.rope = rope
