"""Rewrite a GGUF with another header: the way Ollama's own converter lays out a model llama.cpp's
converter wrote (tests/gguf_fixtures.py writes the latter). Tensor data are copied byte for byte.

    rewrite(src, dst, arch="gptoss", renames={"blk.0.attn_output.weight": "blk.0.attn_out.weight"},
            drop=["gpt-oss.expert_feed_forward_length"], set={"tokenizer.ggml.pre": "default"})

Keys keep their GGUF value types; `set` values of new keys are typed from Python (int -> uint32,
float -> float32, str, list of str / int / float). Metadata under the old architecture's prefix
moves to the new one when `arch` changes. `extra_tensors`: more F32 tensors (a vision tower).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

T = gguf.GGUFValueType
_PY_TYPES = {bool: T.BOOL, int: T.UINT32, float: T.FLOAT32, str: T.STRING}


def _field_value(field):
    value = field.contents()
    if field.types[0] == T.ARRAY:
        return value, T.ARRAY, field.types[-1]
    return value, field.types[0], None


def _typed(value):
    if isinstance(value, list):
        return value, T.ARRAY, _PY_TYPES[type(value[0])]
    return value, _PY_TYPES[type(value)], None


def rewrite(src: str | Path, dst: str | Path, *, arch: str | None = None, renames: dict[str, str] | None = None,
            drop: tuple | list = (), set: dict | None = None, extra_tensors: dict[str, np.ndarray] | None = None) -> Path:
    reader = gguf.GGUFReader(str(src))
    old_arch = reader.fields["general.architecture"].contents()
    arch = arch or old_arch
    writer = gguf.GGUFWriter(str(dst), arch)
    values = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment") or key in drop:
            continue
        if key.startswith(f"{old_arch}."):
            key = f"{arch}." + key[len(old_arch) + 1:]
        values[key] = _field_value(field)
    for key, value in (set or {}).items():
        values[key] = _typed(value)
    for key, (value, vtype, sub_type) in values.items():
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    for t in reader.tensors:
        kind = gguf.GGMLQuantizationType(t.tensor_type)
        float_type = kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
        # the reader's data: floats in their shape, blocks as bytes (rows, bytes a row), which the writer takes
        writer.add_tensor((renames or {}).get(t.name, t.name), np.asarray(t.data), raw_dtype=None if float_type else kind)
    for name, array in (extra_tensors or {}).items():
        writer.add_tensor(name, np.asarray(array, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(dst)
