"""Read a GGUF file's header: metadata values, tensor infos, where the tensor data starts.

    header = read_header(path)   # header.metadata["llama.block_count"], header.tensors[0].type

Layout (GGUF v2/v3, little-endian): "GGUF", u32 version, u64 tensor count, u64 kv count;
kv pairs (string key, u32 value type, value); tensor infos (string name, u32 n_dims,
u64 dims[n_dims], u32 type, u64 offset); padding to `general.alignment`; tensor data.
Read over a memory map with struct, because gguf-py's GGUFReader takes seconds on a
150k-token vocabulary (it builds a numpy view per string); the data itself is not read here.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ModelLoadError

# ggml type ids (ggml.h `enum ggml_type`) -> names, as llama.cpp prints them.
GGML_TYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
    24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0",
    35: "TQ2_0", 39: "MXFP4", 40: "NVFP4", 41: "Q1_0",
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (slowest first): ggml lists dims fastest first
    type: str  # "Q4_K", "F32", ... or "type N" when unknown
    offset: int  # absolute file offset of the data
    n_bytes: int | None  # None for types whose block size we do not know


@dataclass(frozen=True)
class Header:
    path: Path
    metadata: dict
    tensors: list[TensorInfo]


def read_header(path: str | Path) -> Header:
    """Parse the header; refuse non-GGUF, unsupported versions and truncated files."""
    path = Path(path)
    try:
        f = open(path, "rb")
    except OSError as e:  # missing, a directory, unreadable
        raise ModelLoadError(f"cannot read GGUF file {path}: {e.strerror or e}") from None
    with f:
        if os.fstat(f.fileno()).st_size == 0:
            raise ModelLoadError(f"{path} is not a GGUF file (it is empty)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(_Cursor(buf, path), len(buf))


class _Cursor:
    """Little-endian reads over the mapped file; running past its end means it is truncated."""

    def __init__(self, buf, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> int:
        """Advance by n bytes and return where they start."""
        start, self.pos = self.pos, self.pos + n
        if self.pos > len(self.buf):
            raise ModelLoadError(f"GGUF file {self.path} is truncated (header ends past the end of the file)")
        return start

    def unpack(self, fmt: str):
        return struct.unpack_from("<" + fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("Q")
        start = self.take(n)
        return bytes(self.buf[start : start + n]).decode("utf-8", errors="replace")


# GGUF metadata value types (gguf.h `enum gguf_type`) of fixed size -> struct format.
_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def _parse(cur: _Cursor, file_size: int) -> Header:
    if file_size < 4 or bytes(cur.buf[:4]) != b"GGUF":
        raise ModelLoadError(f"{cur.path} is not a GGUF file (no 'GGUF' magic at its start)")
    cur.take(4)
    version = cur.unpack("I")
    if version not in (2, 3):
        raise ModelLoadError(f"{cur.path}: GGUF version {version} is not supported (only 2 and 3)")
    n_tensors, n_kv = cur.unpack("Q"), cur.unpack("Q")
    metadata = {}
    for _ in range(n_kv):
        key, value_type = cur.string(), cur.unpack("I")
        metadata[key] = _value(cur, value_type)

    raw = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.unpack("I")
        if n_dims > 4:  # GGML_MAX_DIMS: more means we are reading garbage
            raise ModelLoadError(f"{cur.path}: tensor {name!r} claims {n_dims} dimensions; the header is corrupt")
        dims = tuple(cur.unpack("Q") for _ in range(n_dims))
        type_id, offset = cur.unpack("I"), cur.unpack("Q")
        raw.append((name, dims, GGML_TYPE_NAMES.get(type_id, f"type {type_id}"), offset))

    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0:
        raise ModelLoadError(f"{cur.path}: general.alignment {alignment!r} is not a positive integer; the header is corrupt")
    data_start = -(-cur.pos // alignment) * alignment
    tensors = [
        TensorInfo(name, tuple(reversed(dims)), type_name, data_start + offset, _n_bytes(type_name, dims))
        for name, dims, type_name, offset in raw
    ]
    for t in tensors:
        if t.n_bytes is not None and t.offset + t.n_bytes > file_size:
            raise ModelLoadError(f"GGUF file {cur.path} is truncated (tensor {t.name!r} runs past its end)")
    return Header(cur.path, metadata, tensors)


def _n_bytes(type_name: str, dims: tuple[int, ...]) -> int | None:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    except KeyError:
        return None
    return math.prod(dims) // block * block_bytes


_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
          7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}


def _value(cur: _Cursor, value_type: int):
    """One metadata value as plain Python (arrays as lists)."""
    if value_type in _SCALAR_FORMATS:
        return cur.unpack(_SCALAR_FORMATS[value_type])
    if value_type == _STRING:
        return cur.string()
    if value_type == _ARRAY:
        item_type, count = cur.unpack("I"), cur.unpack("Q")
        if item_type in _NUMPY:  # fixed size: the whole array at once
            dtype = np.dtype(_NUMPY[item_type]).newbyteorder("<")
            start = cur.take(count * dtype.itemsize)
            return np.frombuffer(cur.buf, dtype, count, start).tolist()
        if item_type == _STRING:
            return _strings(cur, count)
        return [_value(cur, item_type) for _ in range(count)]
    raise ModelLoadError(f"{cur.path}: unknown GGUF metadata value type {value_type}; the header is corrupt")


def _strings(cur: _Cursor, count: int) -> list[str]:
    """An array of strings (a vocabulary, its merges): the hot loop of the header, kept tight."""
    buf, pos, size, out = cur.buf, cur.pos, len(cur.buf), []
    length = struct.Struct("<Q").unpack_from
    for _ in range(count):
        if pos + 8 > size:
            break
        (n,) = length(buf, pos)
        out.append(buf[pos + 8 : pos + 8 + n].decode("utf-8", errors="replace"))
        pos += 8 + n
    if len(out) < count or pos > size:
        raise ModelLoadError(f"GGUF file {cur.path} is truncated (header ends past the end of the file)")
    cur.pos = pos
    return out
