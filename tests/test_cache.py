"""KV caches: mlxspec's HalfKVCache (float32 keys and values stored as float16) and how a model gets it."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache, trim_prompt_cache

from mlxspec.cache import HalfKVCache, kv_cache_type, new_cache, store_kv_in_half
from mlxspec.loading import load


def test_half_cache_stores_float32_as_float16_and_trims():
    cache = HalfKVCache()
    k = mx.random.normal((1, 2, 5, 8), key=mx.random.key(0))
    v = mx.random.normal((1, 2, 5, 8), key=mx.random.key(1))
    keys, values = cache.update_and_fetch(k, v)
    assert keys.dtype == values.dtype == mx.float16 and cache.offset == 5
    assert mx.array_equal(keys, k.astype(mx.float16)).item() and mx.array_equal(values, v.astype(mx.float16)).item()
    keys, _ = cache.update_and_fetch(k[:, :, :1] * 2, v[:, :, :1])
    assert keys.shape[2] == 6 and mx.array_equal(keys[:, :, 5], (k[:, :, 0] * 2).astype(mx.float16)).item()
    assert trim_prompt_cache([cache], 4) == 4 and cache.offset == 2
    bf = HalfKVCache()
    assert bf.update_and_fetch(k.astype(mx.bfloat16), v.astype(mx.bfloat16))[0].dtype == mx.bfloat16  # as it comes


def test_store_kv_in_half_is_per_model_and_keeps_other_cache_kinds(tiny_llama):
    model, other = load(str(tiny_llama)).model, load(str(tiny_llama)).model
    assert kv_cache_type(model) == "f32" and type(new_cache(model)[0]) is KVCache
    store_kv_in_half(model)
    assert kv_cache_type(model) == "f16" and all(type(c) is HalfKVCache for c in make_prompt_cache(model))
    assert type(new_cache(other)[0]) is KVCache  # another instance of the same class is untouched

    other.make_cache = lambda: [RotatingKVCache(max_size=8), KVCache()]  # a sliding-window layer, a global one
    store_kv_in_half(other)
    assert [type(c) for c in make_prompt_cache(other)] == [RotatingKVCache, HalfKVCache]


def test_a_forward_over_a_half_cache_reads_the_rounded_keys(tiny_llama):
    """Without mlxspec's kernels (mlx-lm's modules, MLX's attention): the model runs on the half cache and
    its logits stay near the float32 cache's (a cache rounded to float16, nothing else changed)."""
    model = load(str(tiny_llama)).model
    x = mx.array([[3, 1, 4, 1, 5, 9, 2, 6]])
    full = model(x, cache=make_prompt_cache(model))
    store_kv_in_half(model)
    cache = make_prompt_cache(model)
    half = model(x, cache=cache)
    assert cache[0].keys.dtype == mx.float16 and half.dtype == mx.float32
    assert mx.allclose(half, full, atol=2e-2, rtol=2e-2).item()
    assert not mx.array_equal(half, full).item()  # the keys really were rounded


# ---------------------------------------------------------------- sliding windows


def windowed_gguf(tmp_path, arch="gemma3", window=4):
    """A tiny sliding-window GGUF (gemma3: 5 of 6 layers slide; gpt-oss: every other one)."""
    from gguf_fixtures import Dims, write_tiny_llama_gguf

    metadata = {"attention.sliding_window": window}
    if arch == "gpt-oss":
        metadata |= {"rope.freq_base": 150000.0, "rope.scaling.type": "yarn", "rope.scaling.factor": 32.0,
                     "rope.scaling.original_context_length": 4096}
    dims = Dims(layers=6 if arch == "gemma3" else 2, head_dim=32, experts=8, experts_used=3)
    return write_tiny_llama_gguf(tmp_path / f"{arch}.gguf", "Q8_0", seed=3, arch=arch, dims=dims, metadata=metadata,
                                 output_qtype="Q8_0" if arch == "gpt-oss" else None)


def test_window_cache_masks_to_the_window_and_rewinds_exactly():
    """Queries see the keys at p - window < position <= p; 20 single steps, then a 6-row update
    rewound by 4 and replayed one row at a time, return what a plain history says they should."""
    from mlxspec.cache import WindowKVCache

    window, slack = 4, 5
    cache = WindowKVCache(window, slack)
    cache.step = 2  # compact often: the history kept falls to window - 1 + slack
    keys = mx.arange(40, dtype=mx.float32).reshape(1, 1, 40, 1)  # key i holds the value i: its position

    def step(at, n):
        mask = cache.make_mask(n)
        got, _ = cache.update_and_fetch(keys[:, :, at : at + n], keys[:, :, at : at + n])
        seen = got[0, 0, :, 0].tolist()
        rows = [[k for k, ok in zip(seen, m) if ok] for m in mask.tolist()] if isinstance(mask, mx.array) else \
            [[k for k in seen if k <= at + i] for i in range(n)]  # None / "causal": everything up to the row
        return [[int(k) for k in r] for r in rows]

    for p in range(20):
        assert step(p, 1) == [list(range(max(0, p - window + 1), p + 1))]
    assert step(20, 6) == [list(range(q - window + 1, q + 1)) for q in range(20, 26)]
    assert cache.trim(4) == 4 and cache.offset == 22
    for p in range(22, 30):
        assert step(p, 1) == [list(range(p - window + 1, p + 1))]
    assert cache.can_rewind(slack)
    too_far = next(n for n in range(slack, 31) if not cache.can_rewind(n))  # compaction dropped the rest
    with pytest.raises(RuntimeError, match="window"):
        cache.trim(too_far)
    assert cache.offset == 30  # a refused rewind changes nothing


@pytest.mark.parametrize("arch", ["gemma3", "gpt-oss"])
def test_speculation_over_sliding_windows_is_exact(tmp_path, arch):
    """mlx-lm's RotatingKVCache kept rejected drafts' keys once the window had filled (lookup at k=7
    diverged from plain decoding); the engine's window caches rewind exactly."""
    from mlxspec.cache import WindowKVCache
    from mlxspec.engine import Engine
    from mlxspec.options import GenerateOptions

    path = str(windowed_gguf(tmp_path, arch))
    plain, lookup = Engine.load(path), Engine.load(path, drafter="lookup")
    windows = [c for c in new_cache(plain.target.model) if isinstance(c, WindowKVCache)]
    assert windows and all(c.half for c in windows)  # a GGUF's f16 cache, as its other layers'
    assert windows[0].update_and_fetch(mx.zeros((1, 1, 2, 4)), mx.zeros((1, 1, 2, 4)))[0].dtype == mx.float16

    def run(engine, **kw):
        out = []
        for ev in engine.generate("the world and the world and the world and the",
                                  GenerateOptions(max_tokens=60, temperature=0, **kw)):
            out += ev.tokens
        return out, ev.stats

    want, rejected = run(plain)[0], 0
    for k in (4, 7):
        tokens, stats = run(lookup, draft_length=k)
        assert tokens == want and stats.accepted > 0
        assert stats.exact  # every verify row measured equal to its one-row step (one attention for both)
        rejected += stats.drafted - stats.accepted
    assert rejected > 0  # drafts were rejected and rewound


def test_window_cache_decoding_equals_the_windowed_full_forward(tmp_path):
    """One token at a time through the window caches gives the logits of one full forward with
    the sliding mask (the reference mlx-lm computes without any cache)."""
    from mlxspec.loading import load as load_model

    model = load_model(str(windowed_gguf(tmp_path, "gemma3", window=3)), kv_cache="f32").model
    tokens = [5, 77, 271, 12, 9, 150, 44, 260, 3, 88, 199, 31]
    full = model(mx.array([tokens]))[0]
    cache = new_cache(model)
    for i, t in enumerate(tokens):
        step = model(mx.array([[t]]), cache=cache)[0, 0]
        assert mx.allclose(step, full[i], atol=2e-4).item(), i


def test_a_prefix_past_the_window_is_rebuilt_not_rewound(tmp_path):
    """PrefixCache reuses a shared prefix only where going back to it keeps every window whole."""
    from mlxspec.prefix_cache import PrefixCache
    from mlxspec.loading import load as load_model

    model = load_model(str(windowed_gguf(tmp_path, "gemma3", window=3))).model
    prefix = PrefixCache(model)
    first = [5 + i % 250 for i in range(900)]  # two prefill chunks: the second compacts the windows
    assert prefix.prepare(first) == 0
    assert prefix.prepare(first[:-5] + [7, 8]) == 895  # 5 back: within the slack
    assert prefix.prepare(first[:880] + [9]) == 880  # 17 back: still kept
    assert prefix.prepare(first[:20] + [9]) == 0  # 860 back: past what the windows keep, so rebuilt


def test_a_prefix_before_llama_4_s_last_chunk_is_rebuilt_not_rewound(tmp_path):
    """Llama 4's chunked layers (mlx-lm's ChunkedKVCache) keep one chunk's worth of keys, and their `trim` stops
    short where that would go further back: a second request's prompt that shares only an older prefix got
    another request's keys (plain decoding's first token differed). Now such a prefix is prefilled again."""
    from mlx_lm.models.cache import ChunkedKVCache
    from mlx_lm_architectures import architecture_dir

    from mlxspec.cache import can_rewind
    from mlxspec.prefix_cache import PrefixCache
    from mlxspec.loading import load as load_model

    model = load_model(str(architecture_dir(tmp_path, "llama4"))).model  # attention chunks of 8 positions
    prefix = PrefixCache(model)
    first = [5 + i % 250 for i in range(30)]
    assert prefix.prepare(first[:20]) == 0
    assert prefix.prepare(first) == 20  # the second forward drops keys before the last 8 it had
    chunked = [c for c in prefix.cache if isinstance(c, ChunkedKVCache)]
    assert chunked and chunked[0].start_position == 12
    assert can_rewind(prefix.cache, 5) and not can_rewind(prefix.cache, 20)  # to 25 (chunk 24..) / 10 (chunk 8..)
    assert prefix.prepare(first[:26] + [9]) == 26  # back into the keys it holds: reused
    assert prefix.prepare(first[:12] + [9]) == 0  # before them: rebuilt
    fresh = make_prompt_cache(model)
    model(mx.array([first[:12] + [9]]), cache=fresh)
    want = model(mx.array([[4]]), cache=fresh)
    assert mx.array_equal(model(mx.array([[4]]), cache=prefix.cache), want).item()


@pytest.mark.parametrize("model_type", ["qwen3_next", "falcon_h1"])  # gated delta nets; a CacheList of Mamba-2 + KV
def test_recurrent_states_reuse_an_extended_prompt_and_go_back_to_their_checkpoints(tmp_path, model_type):
    """Recurrent layers cannot go back, so a hybrid model's prompt cache was rebuilt for every request (a chat
    re-read its whole history each turn). Now a prompt that extends what the cache holds reuses all of it, and one
    that leaves it at or after a checkpoint (where the last prompt ended, or CHECKPOINT_MARGIN before: a template's
    answer opening) goes back to the states saved there (KV rows trimmed); any other is rebuilt. Each next step's
    logits are those of a fresh cache fed the same pieces, bit for bit (a recurrence read in other pieces rounds
    otherwise)."""
    from mlx_lm_architectures import architecture_dir

    from mlxspec.loading import load as load_model
    from mlxspec.prefix_cache import CHECKPOINT_MARGIN, PrefixCache

    model = load_model(str(architecture_dir(tmp_path, model_type))).model
    prefix = PrefixCache(model)

    def step(token: int, *pieces: list[int]) -> bool:  # a decoding step here == on a fresh cache fed `pieces`
        fresh = make_prompt_cache(model)
        for piece in pieces:
            model(mx.array([piece]), cache=fresh)
        got = model(mx.array([[token]]), cache=prefix.cache)
        prefix.tokens = prefix.tokens + [token]  # what the cache holds, as decoding records it
        return mx.array_equal(got, model(mx.array([[token]]), cache=fresh)).item()

    prompt, answer, cut = [5 + i % 250 for i in range(40)], [7, 8, 9, 10], 40 - CHECKPOINT_MARGIN
    assert prefix.prepare(prompt) == 0 and [n for n, _ in prefix.checkpoints] == [cut, 40]
    assert all(step(t, prompt[:cut], prompt[cut:], *[[a] for a in answer[:i]]) for i, t in enumerate(answer))
    other = prompt[:-2] + [98]  # the answer's opening rendered otherwise: back to the margin's checkpoint
    assert prefix.prepare(other) == cut and step(6, prompt[:cut], prompt[cut:-2] + [98])
    second = other + [6, 11, 12]  # an extension: all of it reused (too short for a checkpoint before its end)
    assert prefix.prepare(second) == 40 and [n for n, _ in prefix.checkpoints] == [cut, 39, 42]
    assert step(4, prompt[:cut], prompt[cut:-2] + [98], [6], [11, 12])
    assert prefix.prepare(second + [99]) == 42  # the answer [4] dropped: back to where the prompt ended
    assert step(5, prompt[:cut], prompt[cut:-2] + [98], [6], [11, 12], [99])
    assert prefix.prepare(prompt[:20] + [98]) == 0  # before every checkpoint: rebuilt
