"""Ollama's published GGUFs, read as llama.cpp lays the same models out.

The models in an Ollama store (`ollama:gemma3`, `ollama:gpt-oss`, `ollama:llama3`) were written by
Ollama's own converter, whose metadata and tensor names differ from llama.cpp's for some families.
Ollama itself now runs them through llama.cpp by translating the header at load time
(llama/compat/llama-ollama-compat.cpp in ollama/ollama, "the source of truth for exact KV and
tensor maps"); this module makes the same translations for the families mlxspec runs, so that
gguf_archs only ever sees llama.cpp's layout:

    gemma3   no rms epsilon, nested rope keys, no rope scaling on the 128k-context sizes, more
             tokens in the vocabulary than embedding rows (its image tokens), no chat template
    gemma4   the vocabulary named "llama" (sentencepiece) over BPE merges, the audio and vision towers in the
             file, the experts' per-expert scale as ffn_gate_inp.per_expert_scale
    gptoss   the architecture name and key prefix (llama.cpp: "gpt-oss"), three tensor names, no
             expert FFN length, no YaRN type, the wrong pre-tokenizer name
    llama    Llama 3 vocabularies without a pre-tokenizer name, or with no end of turn where chats
             end with <|eot_id|>
    mistral3 YaRN's betas and the attention temperature under other key names, no pre-tokenizer name
    olmo3    llama.cpp has no such name: its olmo2 reads the same layout

    header = translate(read_header(path))   # a llama.cpp-layout header, or the same one

A file is changed only where it shows the marker Ollama's code checks for; files from llama.cpp's
converter pass through as they are. Only the header changes: names and metadata, never tensor data.
"""

from __future__ import annotations

import dataclasses

from .errors import ModelLoadError
from .gguf_archs import IGNORED_PREFIXES
from .gguf_header import Header

# llama.cpp's gemma3 chat template, as Ollama's compat layer puts into files without one
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)
GEMMA3_MARKERS = ("gemma3.mm.tokens_per_image", "gemma3.rope.global.freq_base", "gemma3.rope.local.freq_base",
                  "tokenizer.ggml.add_padding_token", "tokenizer.ggml.add_unknown_token")
GPTOSS_TENSORS = {"attn_out": "attn_output", "ffn_norm": "post_attention_norm"}  # blk.N.<part>.weight
MISTRAL3_KEYS = {  # Ollama's name -> llama.cpp's, under mistral3.
    "rope.scaling.beta_fast": "rope.scaling.yarn_beta_fast", "rope.scaling.beta_slow": "rope.scaling.yarn_beta_slow",
    "rope.scaling.mscale_all_dim": "rope.scaling.yarn_log_multiplier", "rope.scaling_beta": "attention.temperature_scale"}
# Gemma 4 (llama/compat/llama-ollama-compat.cpp, handle_gemma4): the towers its text loader skips, and the
# experts' quantization sidecars with which it leaves split gate/up as they are (nothing here reads them)
GEMMA4_TOWERS = ("a.", "v.", "mm.", "model.vision_tower.")
GEMMA4_SIDECARS = ("ffn_gate_exps.scale", "ffn_gate_exps.input_scale", "ffn_up_exps.scale", "ffn_up_exps.input_scale")
# names only Ollama's own Go engine read (model/models/gemma4/model_text.go, its `alt:` tags and fallback keys):
# neither its converter (convert/convert_gemma4.go) nor llama.cpp writes them, its compat layer translates none
GEMMA4_ENGINE_ONLY = ("attn_post_norm", "ffn_pre_norm", "ffn_post_norm", "ffn_pre_norm_2", "ffn_post_norm_1",
                      "ffn_post_norm_2", "layer_scalar")
GEMMA4_ENGINE_ONLY_KEYS = ("rope.local.freq_base", "attention.global_head_count_kv", "rope.partial_rotary_factor")
LLAMA3_EOT = 128009  # <|eot_id|>
LLAMA3_END_OF_TEXT = 128001  # <|end_of_text|>


def translate(header: Header) -> Header:
    """The header as llama.cpp's converter would have written it (the same object if nothing changes)."""
    arch = header.metadata.get("general.architecture")
    fix = {"gemma3": _gemma3, "gemma4": _gemma4, "gptoss": _gptoss, "llama": _llama3, "mistral3": _mistral3,
           "olmo3": _olmo3}.get(arch)
    return fix(header) if fix is not None else header


def _replace(header: Header, metadata: dict, renames: dict[str, str] | None = None) -> Header:
    tensors = header.tensors
    if renames:
        tensors = [dataclasses.replace(t, name=renames.get(t.name, t.name)) for t in tensors]
    return dataclasses.replace(header, metadata=metadata, tensors=tensors)


def _renamed_architecture(metadata: dict, old: str, new: str) -> dict:
    """The architecture and its key prefix renamed (keys already under the new name win)."""
    meta = {key: value for key, value in metadata.items() if not key.startswith(f"{old}.")}
    for key, value in metadata.items():
        if key.startswith(f"{old}."):
            meta.setdefault(f"{new}.{key[len(old) + 1:]}", value)
    meta["general.architecture"] = new
    return meta


def _has_vision_tower(header: Header) -> bool:
    """Ollama's multimodal blobs keep the vision tower in the same file (llama.cpp's: a separate mmproj)."""
    return any(t.name.startswith(IGNORED_PREFIXES) for t in header.tensors)


def is_ollama_gemma3(header: Header) -> bool:
    meta = header.metadata
    return (any(key in meta for key in GEMMA3_MARKERS) or "gemma3.attention.layer_norm_rms_epsilon" not in meta
            or _has_vision_tower(header))


def _gemma3(header: Header) -> Header:
    if any(t.name == "dense.0.weight" for t in header.tensors):  # Ollama's marker for embeddinggemma
        raise ModelLoadError(f"{header.path.name}: embeddinggemma is an embedding-only model (bidirectional "
                             "attention, a dense projection head); mlxspec runs generative models")
    if not is_ollama_gemma3(header):
        return header
    meta = dict(header.metadata)
    for nested, flat in (("gemma3.rope.global.freq_base", "gemma3.rope.freq_base"),
                         ("gemma3.rope.local.freq_base", "gemma3.rope.freq_base_swa")):
        if nested in meta:
            meta.setdefault(flat, meta[nested])
    meta.setdefault("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
    meta.setdefault("gemma3.rope.freq_base", 1_000_000.0)
    meta.setdefault("gemma3.rope.freq_base_swa", 10_000.0)
    meta.setdefault("tokenizer.chat_template", GEMMA3_CHAT_TEMPLATE)
    if meta.get("gemma3.context_length", 0) >= 131072:  # 4B/12B/27B: a 16k-trained context stretched 8x
        meta.setdefault("gemma3.rope.scaling.type", "linear")
        meta.setdefault("gemma3.rope.scaling.factor", 8.0)
    embed = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
    if embed is not None:  # the image tokens Ollama leaves in the vocabulary have no embedding rows
        rows = embed.shape[0]
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            if isinstance(meta.get(key), list) and len(meta[key]) > rows:
                meta[key] = meta[key][:rows]
    return _replace(header, meta)  # the vision tower (v.*, mm.*) is skipped by gguf_archs.IGNORED_PREFIXES


def is_ollama_gemma4(header: Header) -> bool:
    """Ollama's marker (detect_ollama_gemma4): a tower in the file, or its vocabulary named "llama"."""
    return (any(t.name.startswith(GEMMA4_TOWERS) for t in header.tensors)
            or header.metadata.get("tokenizer.ggml.model") == "llama")


def _gemma4(header: Header) -> Header:
    _refuse_unread_gemma4(header)
    if not is_ollama_gemma4(header):
        return header
    meta = header.metadata
    # Ollama names its BPE vocabulary (merges, pre "gemma4") "llama"; a sentencepiece one has no merges to read
    if meta.get("tokenizer.ggml.model") == "llama" and meta.get("tokenizer.ggml.merges"):
        meta = meta | {"tokenizer.ggml.model": "gemma4"}
    tensors = [t for t in header.tensors if not t.name.startswith(GEMMA4_TOWERS)]  # as its text loader skips them
    names = {t.name for t in tensors}
    old, new = "ffn_gate_inp.per_expert_scale", "ffn_down_exps.scale"  # the router's per-expert scale, renamed
    renames = {n: n.replace(old, new) for n in names if n.endswith(f".{old}") and n.replace(old, new) not in names}
    if meta is header.metadata and len(tensors) == len(header.tensors) and not renames:
        return header
    return _replace(dataclasses.replace(header, tensors=tensors), meta, renames)


def _refuse_unread_gemma4(header: Header) -> None:
    """A gemma4 file with names llama.cpp does not read, which Ollama's compat layer leaves as they are."""
    meta = header.metadata
    parts = [t.name.split(".", 2)[2] for t in header.tensors if t.name.startswith("blk.") and t.name.count(".") > 1]
    sidecar = next((f"blk.N.{part}" for part in parts if part in GEMMA4_SIDECARS), None)
    if sidecar:
        raise ModelLoadError(f"{header.path.name}: gemma4 experts with quantization sidecars ({sidecar}) are not "
                             "supported")
    unread = next((f"blk.N.{part}" for part in parts if part.removesuffix(".weight") in GEMMA4_ENGINE_ONLY), None)
    unread = unread or next((f"gemma4.{key}" for key in GEMMA4_ENGINE_ONLY_KEYS if f"gemma4.{key}" in meta), None)
    if unread:
        raise ModelLoadError(f"{header.path.name}: a gemma4 layout only Ollama's retired Go engine read ({unread}) "
                             "is not supported; use a llama.cpp conversion or a current Ollama one")


def _gptoss(header: Header) -> Header:
    names = {t.name for t in header.tensors}
    fused = sorted(n for n in names if ".ffn_gate_up_exps" in n or ".attn_qkv" in n)
    if fused or any(t.type == "type 4" for t in header.tensors):
        # Ollama's first converter (Aug 2025) fused q/k/v and gate/up and kept MXFP4 in its own byte order (type 4);
        # its own engine read those, llama.cpp (and so Ollama's translation) does not
        what = f"fused {fused[0]}" if fused else "MXFP4 stored as type 4"
        raise ModelLoadError(f"{header.path.name}: an early Ollama gpt-oss layout ({what}) is not supported; "
                             "use llama.cpp's conversion (architecture 'gpt-oss', e.g. ggml-org/gpt-oss-20b-GGUF)")
    meta = _renamed_architecture(header.metadata, "gptoss", "gpt-oss")
    gate = next((t for t in header.tensors if t.name == "blk.0.ffn_gate_exps.weight"), None)
    if gate is not None:  # (experts, expert FFN, hidden)
        meta.setdefault("gpt-oss.expert_feed_forward_length", gate.shape[1])
    meta.setdefault("gpt-oss.rope.scaling.type", "yarn")
    meta["tokenizer.ggml.pre"] = "gpt-4o"  # the files say "default": prompts would split differently
    renames = {}
    for name in names:
        parts = name.split(".")
        if len(parts) == 3 and parts[0] == "blk" and parts[2] == "attn_sinks":
            renames[name] = name + ".weight"
        elif len(parts) == 4 and parts[0] == "blk" and parts[2] in GPTOSS_TENSORS:
            renames[name] = ".".join([*parts[:2], GPTOSS_TENSORS[parts[2]], parts[3]])
    return _replace(header, meta, renames)


def _llama3(header: Header) -> Header:
    meta = header.metadata
    tokens = meta.get("tokenizer.ggml.tokens") or []

    def token_is(i: int, text: str) -> bool:
        return len(tokens) > i and tokens[i] == text

    if not token_is(LLAMA3_EOT, "<|eot_id|>"):
        return header
    template = meta.get("tokenizer.chat_template") or ""
    chat = token_is(128006, "<|start_header_id|>") or "<|start_header_id|>" in template or "<|eot_id|>" in template
    no_pre = meta.get("tokenizer.ggml.pre") in (None, "", "default")
    if not chat or not (no_pre or meta.get("tokenizer.ggml.eos_token_id") == LLAMA3_END_OF_TEXT):
        return header
    meta = dict(meta)
    if no_pre:
        meta["tokenizer.ggml.pre"] = "llama-bpe"
    # Ollama makes <|eot_id|> the EOS; here it is the end of turn and an <|end_of_text|> EOS stays one too:
    # generation ends at either, as llama.cpp ends at both (its end-of-generation set)
    meta.setdefault("tokenizer.ggml.eos_token_id", LLAMA3_EOT)
    if meta.get("tokenizer.ggml.eot_token_id") in (None, LLAMA3_END_OF_TEXT):
        meta["tokenizer.ggml.eot_token_id"] = LLAMA3_EOT
    return _replace(header, meta)


def _mistral3(header: Header) -> Header:
    meta = header.metadata
    ollamas = any(f"mistral3.{key}" in meta for key in MISTRAL3_KEYS if key != "rope.scaling.beta_slow")
    if not ollamas and not _has_vision_tower(header):
        return header
    meta = dict(meta)
    for theirs, ours in MISTRAL3_KEYS.items():
        if f"mistral3.{theirs}" in meta:
            meta.setdefault(f"mistral3.{ours}", meta[f"mistral3.{theirs}"])
    if meta.get("tokenizer.ggml.pre") in (None, "", "default"):
        meta["tokenizer.ggml.pre"] = "tekken"
    return _replace(header, meta)  # the vision tower (v.*, mm.*) is skipped by gguf_archs.IGNORED_PREFIXES


def _olmo3(header: Header) -> Header:
    return _replace(header, _renamed_architecture(header.metadata, "olmo3", "olmo2"))
