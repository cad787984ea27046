"""Packed codes for the int8 CPU tiles (packing.py, ColumnCodes in qmm_q8_kernel.h): the layout the
kernel reads, the same bits as MLX's row layout on every ISA path, and layers packed at install and
unpacked when MLX's ops take over again."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlxspec.kernels import registry
from mlxspec.kernels.cpu import cpu_qmm_function
from mlxspec.kernels.layers import KernelQuantizedEmbedding, KernelQuantizedLinear, restore_layers, use_kernels
from mlxspec.kernels.packing import PACK, code_rows, pack_codes, unpack_codes, unpack_layer
from mlxspec.kernels.reference import random_quantized
from model_factory import make_model_dir


def isas(ext):
    return [i for i in (1, 2, 3, 0) if ext.isa_compiled(i)]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k", [64, 256, 576])  # one short chunk, whole chunks, whole chunks + a short one
def test_the_layout_is_the_one_the_kernel_reads(bits, k):
    """Column j of group g, chunk c sits at g P row + c P chunk + j len(c): the bytes MLX keeps at
    row n, chunk c. Unpacking gives the original back."""
    n = 12
    w, _, _ = random_quantized(n, k, 32, bits, mx.float16, key=mx.random.key(k + bits))
    packed = pack_codes(w, bits)
    assert packed.shape == w.shape and packed.dtype == mx.uint32
    assert mx.array_equal(unpack_codes(packed, bits), w).item()
    rows, flat = np.array(w.view(mx.uint8)), np.array(packed.view(mx.uint8)).reshape(-1)
    row, chunk = k * bits // 8, 16 * bits
    for col in range(n):
        g, j = divmod(col, PACK)
        for c in range(-(-row // chunk)):
            size = min(chunk, row - c * chunk)
            at = g * PACK * row + c * PACK * chunk + j * size
            assert (flat[at : at + size] == rows[col, c * chunk : c * chunk + size]).all(), (col, c)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k,group_size", [(576, 32), (256, 64), (160, 32), (384, 128)])
def test_packed_codes_give_the_same_bits_on_every_isa(cpu_ext, bits, k, group_size):
    n = 24  # 6 groups: 4-column tiles at one or two rows, 2-column tiles above
    w, s, b = random_quantized(n, k, group_size, bits, mx.float16, key=mx.random.key(k * bits))
    packed = pack_codes(w, bits)
    x = mx.random.normal((9, k), key=mx.random.key(3)) * 2
    for isa in isas(cpu_ext):
        qmm = cpu_qmm_function(isa, activations="q8")
        for m in (1, 2, 3, 9):
            want = qmm(x[:m], w, s, b, group_size, bits)
            assert mx.array_equal(qmm(x[:m], packed, s, b, group_size, bits, pack=PACK), want).item(), (qmm.isa, m)
        wrong = qmm(x, packed, s, b, group_size, bits)  # packed codes read as rows: other results
        assert not mx.array_equal(wrong, qmm(x, w, s, b, group_size, bits)).item()


def test_mxfp4_codes_pack_too(cpu_ext):
    w, s, _ = random_quantized(8, 576, 32, 4, key=mx.random.key(5), mode="mxfp4")
    x = mx.random.normal((3, 576), key=mx.random.key(6))
    for isa in isas(cpu_ext):
        qmm = cpu_qmm_function(isa, activations="q8")
        want = qmm(x, w, s, None, 32, 4, mode="mxfp4")
        assert mx.array_equal(qmm(x, pack_codes(w, 4), s, None, 32, 4, mode="mxfp4", pack=PACK), want).item()


def test_packing_is_refused_where_it_does_not_apply(cpu_ext):
    w, s, b = random_quantized(10, 128, 32, 4, mx.float16, key=mx.random.key(7))
    x = mx.ones((1, 128))
    with pytest.raises(ValueError, match="multiple of 4"):
        pack_codes(w, 4)
    with pytest.raises(ValueError, match="pack"):  # N = 10 is no multiple of 4
        cpu_qmm_function(activations="q8")(x, w, s, b, 32, 4, pack=PACK)
    with pytest.raises(ValueError, match="pack"):  # the fp32 tiles read MLX's layout only
        cpu_qmm_function()(x, w[:8], s[:8], b[:8], 32, 4, pack=PACK)


def test_the_self_check_catches_a_kernel_that_ignores_the_packing(cpu_ext):
    qmm = cpu_qmm_function(activations="q8")

    def ignores_pack(*args, pack: int = 1, **kwargs):
        return qmm(*args, **kwargs)

    assert registry.self_check(qmm, 32, 256, 32, 4, mx.float16, "q8") is None
    assert "packed" in registry.self_check(ignores_pack, 32, 256, 32, 4, mx.float16, "q8")


def test_q8_layers_are_packed_with_the_same_logits_and_unpacked_on_restore(tmp_path, cpu_ext):
    from mlxspec.loading import load

    path = make_model_dir(tmp_path / "m", "llama", hidden=160, heads=4, kv_heads=2, intermediate=256)
    model = load(str(path), "q4g32").model
    rows = {p: m["weight"] for p, m in model.named_modules() if isinstance(m, nn.QuantizedLinear)}
    report = use_kernels(model, activations="q8")
    layers = {p: m for p, m in model.named_modules() if isinstance(m, KernelQuantizedLinear)}
    assert report["packed"] == len(layers) and set(layers) == set(rows)
    ids = mx.array([[5, 17, 42, 7, 3]])
    packed_logits = model(ids)
    assert all(not mx.array_equal(m["weight"], rows[p]).item() for p, m in layers.items() if m._pack > 1)
    for m in layers.values():
        unpack_layer(m)  # the same kernels over MLX's layout
    assert mx.array_equal(model(ids), packed_logits).item()
    again = load(str(path), "q4g32").model
    use_kernels(again, activations="q8")
    assert restore_layers(again) == len(layers)
    restored = {p: m for p, m in again.named_modules() if isinstance(m, nn.QuantizedLinear)}
    assert all(mx.array_equal(m["weight"], rows[p]).item() for p, m in restored.items())
    assert not any(isinstance(m, KernelQuantizedLinear) for m in restored.values())


def test_f32_activations_keep_the_row_layout(tiny_llama, cpu_ext):
    from mlxspec.loading import load

    model = load(str(tiny_llama), "q4g32").model
    assert use_kernels(model)["packed"] == 0
    assert all(m._pack == 1 for _, m in model.named_modules() if isinstance(m, KernelQuantizedLinear))


def test_a_packed_tied_table_looks_up_the_same_rows(tmp_path, cpu_ext):
    """A tied head's table is packed for as_linear; lookups (and a learned drafter's gather of head
    rows) gather their rows' words from the packed groups and get MLX's rows."""
    from mlxspec.heads.eagle import DraftHead
    from mlxspec.loading import load

    path = make_model_dir(tmp_path / "q", "qwen2", hidden=160, heads=4, kv_heads=2, intermediate=256, scale=1.0)
    model = load(str(path), "q4g32").model  # tied; rows of 160 codes: a whole chunk and a short one
    table = model.model.embed_tokens["weight"]
    ids = mx.array([[0, 3, 9, 27, 4, 318]])
    rows = model.model.embed_tokens(ids)
    vocab = mx.array([7, 1, 300, 42, 5])
    use_kernels(model, activations="q8")
    embed = model.model.embed_tokens
    assert isinstance(embed, KernelQuantizedEmbedding) and embed._pack == PACK
    assert not mx.array_equal(embed["weight"], table).item()
    assert mx.array_equal(code_rows(embed, ids), table[ids]).item()
    assert mx.array_equal(embed(ids), rows).item()
    assert mx.array_equal(DraftHead(model, vocab).proj["weight"], table[vocab]).item()
    packed_logits = model(ids)
    for _, m in model.named_modules():
        unpack_layer(m)  # the same kernels over MLX's layout: the same logits
    assert embed._pack == 1 and mx.array_equal(embed["weight"], table).item()
    assert mx.array_equal(model(ids), packed_logits).item()


def test_packing_keeps_a_targets_identity_for_its_learned_drafters(tmp_path, cpu_ext):
    """A head trained on a target is tied to it by a digest of its weights: packed codes (int8
    activations) and MLX's rows (f32) must give the same one, or a head would be refused."""
    from mlxspec.heads.files import identity
    from mlxspec.loading import load

    path = make_model_dir(tmp_path / "m", "llama", hidden=160, heads=4, kv_heads=2, intermediate=256)
    model = load(str(path), "q4g32").model
    before = identity(model)
    assert use_kernels(model, activations="q8")["packed"] > 0
    assert identity(model) == before
    other = load(str(path), "q4g64").model  # other weights: another digest (the check can fail)
    assert identity(other) != before


def test_an_implied_bias_is_found_only_where_every_bias_is_that_times_its_scale():
    from mlxspec.kernels.packing import implied_bias

    w, s, b = random_quantized(8, 128, 32, 4, mx.float16, key=mx.random.key(8))
    layer = nn.QuantizedLinear(128, 8, bias=False, group_size=32, bits=4)
    layer.weight, layer.scales = w, s
    for biases, want in ((s * -8, -8.0), (s * -128, -128.0), (b, 0.0), (mx.zeros_like(s), 0.0),
                         (mx.concatenate([s[:7] * -8, s[7:] * -4]), 0.0)):  # one row off: none
        layer.biases = biases
        assert implied_bias(layer) == want


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k,group_size", [(576, 32), (256, 64), (160, 32), (384, 128)])
def test_biases_implied_by_the_scales_give_the_same_bits_on_every_isa(cpu_ext, bits, k, group_size):
    """GGUF Q4_0 / Q8_0 layers: biases are -8 / -128 x scale. With bias_of_scale the tiles compute them
    from the scales (the biases passed are zeros here, so a kernel that read them would differ)."""
    c = -(2.0 ** (bits - 1))
    w, s, _ = random_quantized(24, k, group_size, bits, mx.float16, key=mx.random.key(k + 9 * bits))
    x = mx.random.normal((9, k), key=mx.random.key(4)) * 2
    for isa in isas(cpu_ext):
        qmm = cpu_qmm_function(isa, activations="q8")
        for m in (1, 3, 9):
            want = qmm(x[:m], w, s, s * c, group_size, bits)
            zeros = mx.zeros_like(s)
            assert mx.array_equal(qmm(x[:m], w, s, zeros, group_size, bits, bias_of_scale=c), want).item(), (qmm.isa, m)
            assert mx.array_equal(qmm(x[:m], pack_codes(w, bits), s, zeros, group_size, bits, pack=PACK,
                                      bias_of_scale=c), want).item(), (qmm.isa, m)
        assert not mx.array_equal(qmm(x, w, s, mx.zeros_like(s), group_size, bits), qmm(x, w, s, s * c, group_size, bits)).item()


def test_the_self_check_catches_a_kernel_that_reads_the_biases_anyway(cpu_ext):
    qmm = cpu_qmm_function(activations="q8")

    def reads_biases(*args, bias_of_scale: float = 0.0, **kwargs):
        return qmm(*args, **kwargs)

    assert "implied" in registry.self_check(reads_biases, 30, 256, 32, 4, mx.float16, "q8")


def test_a_q4_0_gguf_reads_no_biases_and_keeps_its_logits(tmp_path, cpu_ext):
    """A Q4_0 GGUF loads with biases -8 x scale: its layers run with bias_of_scale -8, the per-op path
    gives the logits of reading the stored biases, and the fused blocks those of the per-op path."""
    from gguf_fixtures import Dims, write_tiny_llama_gguf
    from mlxspec.kernels.install import install_kernels
    from mlxspec.loading import load

    gguf = tmp_path / "q4_0.gguf"
    write_tiny_llama_gguf(gguf, "Q4_0", dims=Dims(hidden=128, ffn=256, heads=4, kv_heads=2))
    ids = mx.array([[5, 17, 42, 7, 3]])
    model = load(str(gguf)).model
    install_kernels(model, fuse=False, activations="q8")
    layers = [m for _, m in model.named_modules() if isinstance(m, (KernelQuantizedLinear, KernelQuantizedEmbedding))]
    assert layers and all(m._bias_of_scale == -8.0 for m in layers if m.bits == 4)
    implied = model(ids)
    for m in layers:
        m._bias_of_scale = 0.0  # read the stored biases
    assert mx.array_equal(model(ids), implied).item()
    fused = load(str(gguf)).model
    assert install_kernels(fused, activations="q8")["fused"]["fused"]
    assert mx.array_equal(fused(ids), implied).item()


def test_only_short_rows_are_packed():
    """Packing pays where rows are a few cache lines (a hidden size of K); at 3456 bytes a row it did not."""
    from mlxspec.kernels.packing import MAX_PACKED_ROW_BYTES, packable

    for k, bits, n, want in ((576, 4, 8, True), (4096, 4, 8, True), (6912, 4, 8, False), (2048, 8, 8, True),
                             (4096, 8, 8, False), (576, 4, 10, False)):
        layer = nn.QuantizedLinear(k, n, bias=False, group_size=32, bits=bits)
        assert packable(layer) == want, (k, bits, n)
        assert (k * bits // 8 <= MAX_PACKED_ROW_BYTES and n % PACK == 0) == want
