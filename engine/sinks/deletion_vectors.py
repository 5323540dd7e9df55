"""Delta deletion vectors: which rows of a data file are deleted.

A MERGE with deletion vectors marks the old versions of the rows it changes as deleted in
their files (a bitmap of row positions) and writes only the new rows, so a batch costs the
rows it changes, not the files they fall in (copy on write rewrites every such file whole).
delta-rs reads these tables but cannot write deletion vectors yet (delta-io/delta-rs#4512),
so viewgate writes them itself, in the format of the Delta protocol ("Deletion Vector
Format"), the bytes delta-spark writes:

- a vector: the magic number 1681511377 (int32, little-endian), then a RoaringBitmapArray:
  the number of 32-bit bitmaps (int64, little-endian), each its high 32 bits (int32,
  little-endian) and the bitmap in Roaring's portable serialization (pyroaring writes it);
- a vector file (`storageType: "u"`), as delta-spark writes them: `deletion_vector_<uuid>.bin`
  in the table's folder, one version byte (1), then per vector its size (int32,
  big-endian), the vector and its CRC-32 (big-endian); a descriptor names the file (its
  uuid in Z85), the vector's offset (of its size field) and size. viewgate writes one such
  file per commit, holding the vectors of every file the commit marks. delta-rs's VACUUM
  never deletes vector files: the writer does (engine.sinks.dv_merge);
- tables written before 2026-11-26 hold their vectors inline in the log (`storageType:
  "i"`, the vector's bytes in Z85); they are still read. Inline vectors went because a
  commit carries each vector it changes twice (remove and add), and Z85 adds a quarter:
  the log grew faster than the data.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from pyroaring import BitMap

MAGIC = 1681511377
FORMAT_VERSION = 1

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}


def z85_encode(data: bytes) -> str:
    """ZeroMQ's Base85 (the Delta protocol's choice for ids in the log); len(data) % 4 == 0."""
    if len(data) % 4:
        raise ValueError("Z85 encodes whole 4-byte words")
    out = []
    for (word,) in struct.iter_unpack(">I", data):
        chars = []
        for _ in range(5):
            word, digit = divmod(word, 85)
            chars.append(_Z85[digit])
        out.extend(reversed(chars))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    if len(text) % 5:
        raise ValueError("Z85 decodes whole 5-character groups")
    words = []
    for i in range(0, len(text), 5):
        word = 0
        for c in text[i:i + 5]:
            word = word * 85 + _Z85_VALUE[c]
        words.append(struct.pack(">I", word))
    return b"".join(words)


def encode_vector(rows: BitMap) -> bytes:
    """One vector's bytes (magic number and RoaringBitmapArray). Row positions of a data
    file fit in 32 bits (viewgate's files hold far fewer than 4 billion rows)."""
    if rows and rows.max() >= 2**32:
        raise ValueError("row positions beyond 2**32 need more than one 32-bit bitmap")
    buckets = struct.pack("<qi", 1, 0) + rows.serialize() if rows else struct.pack("<q", 0)
    return struct.pack("<i", MAGIC) + buckets


def decode_vector(data: bytes) -> BitMap:
    magic, count = struct.unpack_from("<iq", data)
    if magic != MAGIC:
        raise ValueError(f"not a deletion vector (magic number {magic})")
    rows = BitMap()
    offset = 12
    for _ in range(count):
        (high,) = struct.unpack_from("<i", data, offset)
        bitmap = BitMap.deserialize(data[offset + 4:])
        if high:
            raise ValueError("row positions beyond 2**32 are not supported")
        rows |= bitmap
        offset += 4 + len(bitmap.serialize())
    return rows


def decode_at(file: bytes, offset: int, size: int) -> BitMap:
    """The vector stored at `offset` (its size field) of a deletion vector file."""
    (stored,) = struct.unpack_from(">i", file, offset)
    data = file[offset + 4:offset + 4 + stored]
    (checksum,) = struct.unpack_from(">I", file, offset + 4 + stored)
    if stored != size or zlib.crc32(data) != checksum:
        raise ValueError("deletion vector damaged (size or checksum does not match)")
    return decode_vector(data)


def vector_file(vectors: Sequence[BitMap]) -> tuple[bytes, list[tuple[int, int]]]:
    """The bytes of one vector file holding `vectors`, and each vector's (offset, size)."""
    out = bytearray([FORMAT_VERSION])
    places = []
    for rows in vectors:
        data = encode_vector(rows)
        places.append((len(out), len(data)))
        out += struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
    return bytes(out), places


def file_name(file_id: uuid.UUID) -> str:
    return f"deletion_vector_{file_id}.bin"


def in_file(file_id: uuid.UUID, offset: int, size: int, cardinality: int) -> dict[str, Any]:
    """The log's description of a vector in a vector file (no path prefix: the table's
    folder)."""
    return {"storageType": "u", "pathOrInlineDv": z85_encode(file_id.bytes),
            "offset": offset, "sizeInBytes": size, "cardinality": cardinality}


def read_inline(dv: Mapping[str, Any]) -> BitMap:
    """A vector stored in the log (Z85 of whole 4-byte words: zero padding past
    `sizeInBytes`)."""
    return decode_vector(z85_decode(dv["pathOrInlineDv"])[:dv["sizeInBytes"]])


def descriptor_file(dv: Mapping[str, Any]) -> str:
    """The file (relative to the table) a `u` descriptor points at."""
    if dv["storageType"] != "u":
        raise ValueError(f"deletion vectors stored as {dv['storageType']!r} are not read here")
    encoded = dv["pathOrInlineDv"]
    prefix, id_text = encoded[:-20], encoded[-20:]
    name = file_name(uuid.UUID(bytes=z85_decode(id_text)))
    return f"{prefix}/{name}" if prefix else name


def unique_id(dv: Mapping[str, Any] | None) -> str | None:
    """The protocol's id of a vector: a file in the log is (path, this id)."""
    if not dv:
        return None
    offset = dv.get("offset")
    return f"{dv['storageType']}{dv['pathOrInlineDv']}" + ("" if offset is None else f"@{offset}")
