"""Model files checked for whole structure before anything loads them: GGUF and safetensors.

A file cut short by a partial download or copy, or damaged since, otherwise fails deep inside
a loader (numpy's "cannot reshape", a safetensors deserialisation error in an actor's
traceback) naming no file. Here only headers are read, never the tensor data, so a check costs
milliseconds whatever the model's size: each file's header must parse, and the data its header
declares must end exactly where the file does. A broken file raises :class:`BrokenModelFile`,
one line naming the file and what is wrong.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from pathlib import Path

from pipeline.checks.preflight import PreflightError

INDEX = "model.safetensors.index.json"
# safetensors' own limit on its JSON header; a larger length is a damaged first 8 bytes.
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
SAFETENSORS_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
                     "U16": 2, "I16": 2, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4,
                     "U64": 8, "I64": 8, "F64": 8}

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)  # version 1 (32-bit counts) predates every file transformers reads
GGUF_DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4
# ggml type -> (elements per block, bytes per block), as gguf-py's GGML_QUANT_SIZES; a type
# missing here is looked up there (a newer format than this table).
GGML_BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
               8: (32, 34), 9: (32, 40), 10: (256, 84), 11: (256, 110), 12: (256, 144),
               13: (256, 176), 14: (256, 210), 15: (256, 292), 16: (256, 66), 17: (256, 74),
               18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82),
               23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
               29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17)}
# GGUF metadata value types: fixed-size scalars by struct code; 8 is a string, 9 an array.
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class BrokenModelFile(PreflightError):
    """A model file that cannot be loaded as it is; the message is one line naming it."""


def _truncated(path: Path, size: int, where: str, need: int | None = None) -> BrokenModelFile:
    """``need``: the whole file's size where the header tells it (else unknown: cut inside the
    header itself)."""
    of = "" if need is None else f" of {need:,}"
    return BrokenModelFile(f"{path}: truncated at {size:,}{of} bytes, {where}; a partial "
                           f"download or copy? fetch the file again")


def _damaged(path: Path, what: str) -> BrokenModelFile:
    return BrokenModelFile(f"{path}: damaged header ({what}); fetch the file again")


# --- safetensors ---------------------------------------------------------------------------

def safetensors_header(path: Path) -> dict:
    """The parsed JSON header of ``path``, checked against the file's size (BrokenModelFile)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _truncated(path, size, "inside the 8-byte header length")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_SAFETENSORS_HEADER:
            raise _damaged(path, f"declares a {length:,}-byte JSON header, over safetensors' "
                                 f"limit of {MAX_SAFETENSORS_HEADER:,}")
        if 8 + length > size:
            raise _truncated(path, size, f"inside its {length:,}-byte JSON header")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise _damaged(path, f"the JSON header does not parse: {e}") from None
    if not isinstance(header, dict):
        raise _damaged(path, f"the JSON header is a {type(header).__name__}, not an object")
    end = _safetensors_data_end(path, header)
    if 8 + length + end != size:
        if 8 + length + end > size:
            raise _truncated(path, size, "inside the tensor data", 8 + length + end)
        raise _damaged(path, f"{size - 8 - length - end:,} bytes after the last tensor's end "
                             f"at {8 + length + end:,}: not one whole safetensors file")
    return header


def _safetensors_data_end(path: Path, header: dict) -> int:
    """Where the tensors' data ends, after checking each entry's offsets against its shape and
    that together they cover the data section without gap or overlap, as safetensors does."""
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = (int(x) for x in entry["data_offsets"])
            shape = [int(d) for d in entry["shape"]]
            dtype = entry["dtype"]
        except (TypeError, KeyError, ValueError) as e:
            raise _damaged(path, f"tensor {name!r} has no readable dtype, shape and "
                                 f"data_offsets ({type(e).__name__}: {e})") from None
        width = SAFETENSORS_BYTES.get(dtype)
        if width is not None and end - begin != math.prod(shape) * width:
            raise _damaged(path, f"tensor {name!r} of {dtype} {shape} spans {end - begin:,} "
                                 f"bytes, its shape needs {math.prod(shape) * width:,}")
        spans.append((begin, end, name))
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at or end < begin:
            raise _damaged(path, f"tensor {name!r} at bytes {begin:,}..{end:,} of the data "
                                 f"leaves a gap or overlap at {at:,}")
        at = end
    return at


# --- GGUF ----------------------------------------------------------------------------------

class _Reader:
    """Fields read in order from a mapped file; reading past its end is truncation."""

    def __init__(self, path: Path, data: mmap.mmap, size: int) -> None:
        self.path, self.data, self.size, self.at = path, data, size, 0
        self.where = "the header"

    def take(self, code: str) -> int | float | bool:
        width = struct.calcsize("<" + code)
        self.need(width)
        (value,) = struct.unpack_from("<" + code, self.data, self.at)
        self.at += width
        return value

    def need(self, width: int) -> None:
        if width > self.size:  # no cut file does that: a damaged length field
            raise _damaged(self.path, f"{self.where} declares {width:,} bytes, more than the "
                                      f"whole file")
        if self.at + width > self.size:
            raise _truncated(self.path, self.size, f"inside {self.where}")

    def skip(self, width: int) -> None:
        self.need(width)
        self.at += width

    def string(self) -> bytes:
        length = self.take("Q")
        self.need(length)
        self.at += length
        return bytes(self.data[self.at - length:self.at])

    def skip_value(self, kind: int, key: str) -> None:
        if kind in _GGUF_SCALARS:
            self.skip(struct.calcsize(_GGUF_SCALARS[kind]))
        elif kind == _STRING:
            self.skip(self.take("Q"))
        elif kind == _ARRAY:
            item, count = self.take("I"), self.take("Q")
            if item in _GGUF_SCALARS:
                self.skip(count * struct.calcsize(_GGUF_SCALARS[item]))
            elif item in (_STRING, _ARRAY):  # each at least 8 bytes: a damaged count ends
                for _ in range(count):       # at the file's end, as a cut file does
                    self.skip_value(item, key)
            else:
                raise _damaged(self.path, f"metadata {key!r} is an array of unknown type "
                                          f"{item}")
        else:
            raise _damaged(self.path, f"metadata {key!r} has unknown value type {kind}")


def _ggml_block(kind: int) -> tuple[int, int] | None:
    if kind in GGML_BLOCKS:
        return GGML_BLOCKS[kind]
    try:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        return GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ImportError, ValueError, KeyError):
        return None


def check_gguf(path: Path) -> None:
    """Header, metadata and tensor table of a GGUF file, and its data section against its size
    (BrokenModelFile). Reads the header only, through a memory map."""
    path = Path(path)
    size = path.stat().st_size
    if size < 24:
        raise _truncated(path, size, "inside the fixed header")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != GGUF_MAGIC:
            raise BrokenModelFile(f"{path}: not a GGUF file (it starts with {data[:4]!r}, "
                                  f"a GGUF file with {GGUF_MAGIC!r})")
        r = _Reader(path, data, size)
        r.skip(4)
        version = r.take("I")
        if version not in GGUF_VERSIONS:
            raise _damaged(path, f"GGUF version {version}; readable: {list(GGUF_VERSIONS)}")
        tensors, kvs = r.take("Q"), r.take("Q")
        alignment = _gguf_metadata(r, kvs)
        infos = _gguf_tensor_infos(r, tensors, alignment)
        start = -(-r.at // alignment) * alignment  # the data section, aligned
    if not infos:
        return
    end, name = max(infos)
    if start + end > size:
        raise _truncated(path, size, f"inside the tensor data (the last tensor, {name!r}, "
                                     "ends there)", start + end)


def _gguf_metadata(r: _Reader, count: int) -> int:
    """Reads past ``count`` key/value pairs; returns ``general.alignment`` (or the default)."""
    alignment = GGUF_DEFAULT_ALIGNMENT
    for i in range(count):
        r.where = f"metadata entry {i + 1:,} of {count:,}"
        key = r.string().decode("utf-8", "replace")
        kind = r.take("I")
        if key == "general.alignment" and kind == 4:
            alignment = r.take("I")
            if alignment == 0 or alignment & (alignment - 1):
                raise _damaged(r.path, f"general.alignment={alignment}, not a power of two")
        else:
            r.skip_value(kind, key)
    return alignment


def _gguf_tensor_infos(r: _Reader, count: int, alignment: int) -> list[tuple[int, str]]:
    """(end offset in the data section, name) of each tensor, checked for sane fields."""
    ends = []
    for i in range(count):
        r.where = f"tensor info {i + 1:,} of {count:,}"
        name = r.string().decode("utf-8", "replace")
        dims = r.take("I")
        if dims > GGML_MAX_DIMS:
            raise _damaged(r.path, f"tensor {name!r} has {dims} dimensions, at most "
                                   f"{GGML_MAX_DIMS}")
        shape = [r.take("Q") for _ in range(dims)]
        kind, offset = r.take("I"), r.take("Q")
        block = _ggml_block(kind)
        if block is None:
            raise _damaged(r.path, f"tensor {name!r} has unknown ggml type {kind}")
        elements = math.prod(shape)
        if elements % block[0] or offset % alignment:
            raise _damaged(r.path, f"tensor {name!r} of shape {shape} type {kind} at offset "
                                   f"{offset} fits no {block[0]}-element block or "
                                   f"{alignment}-byte alignment")
        ends.append((offset + elements // block[0] * block[1], name))
    return ends


# --- a model folder ------------------------------------------------------------------------

def check_model_folder(folder: str) -> None:
    """Every ``*.safetensors`` of ``folder``, and its shard index against the shards' headers.

    Files that are missing are left to pipeline.checks.preflight, which names the config key."""
    path = Path(folder)
    if not path.is_dir():
        return
    headers = {p.name: safetensors_header(p) for p in sorted(path.glob("*.safetensors"))}
    index = path / INDEX
    if not index.is_file():
        return
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        items = sorted(weight_map.items())
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise BrokenModelFile(f"{index}: no readable weight_map ({type(e).__name__}: "
                              f"{e})") from None
    for tensor, shard in items:
        if shard in headers and tensor not in headers[shard]:
            raise BrokenModelFile(f"{index}: maps {tensor!r} to {shard}, whose header has no "
                                  f"such tensor; the index and its shards are of different "
                                  f"downloads?")


def check_model_file(path: str) -> None:
    """One weights file by its kind: ``.gguf`` or ``.safetensors``."""
    p = Path(path)
    if p.suffix.lower() == ".gguf":
        check_gguf(p)
    elif p.suffix == ".safetensors":
        safetensors_header(p)
    else:
        raise ValueError(f"{path}: not a .gguf or .safetensors file")

