"""Token files for `gpupool bench train --data`: JSONL text -> PREFIX.bin + PREFIX.idx (pure; no torch).

In the spirit of Megatron-LM's tools/preprocess_data.py (a .bin of token ids and an .idx of document
boundaries), with a tokenizer that needs no download: byte-level, one token per UTF-8 byte (ids 0..255)
and an end-of-document token (256) after every document.

PREFIX.bin: the token ids, little-endian uint16, documents back to back.
PREFIX.idx: a 40-byte header, struct `<8sIIIIQQ`: magic b"GPTOKIDX", format version (1), bytes per token
(2), vocabulary size (257), end-of-document id (256), document count, token count; then document count + 1
little-endian uint64 offsets (in tokens) where each document starts, the last one being the token count.
"""

from __future__ import annotations

import json
import struct
import sys
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gpupool.bench.errors import BenchError

MAGIC = b"GPTOKIDX"
VERSION = 1
_HEADER = struct.Struct("<8sIIIIQQ")
_BIG_ENDIAN = sys.byteorder == "big"  # the files are little-endian everywhere


class ByteTokenizer:
    """UTF-8 bytes as tokens; nothing to download, every text encodes, decoding is exact."""

    vocab_size = 257
    eod = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class TokenIndex:
    vocab_size: int
    eod: int
    token_bytes: int
    documents: int
    tokens: int
    offsets: tuple[int, ...]  # document starts, plus the token count at the end


def paths(prefix: Path) -> tuple[Path, Path]:
    """PREFIX.bin and PREFIX.idx; a prefix given with either suffix names the same pair."""
    if prefix.suffix in (".bin", ".idx"):
        prefix = prefix.with_suffix("")
    return prefix.with_name(prefix.name + ".bin"), prefix.with_name(prefix.name + ".idx")


def write_token_file(
    source: Path,
    prefix: Path,
    *,
    key: str = "text",
    on_progress: Callable[[int], None] | None = None,
) -> TokenIndex:
    """Tokenize every JSON line's `key` field of `source`; write PREFIX.bin and PREFIX.idx."""
    tokenizer = ByteTokenizer()
    bin_path, idx_path = paths(prefix)
    offsets = array("Q", [0])
    try:
        with source.open("rb") as lines, bin_path.open("wb") as out:
            for number, raw in enumerate(lines, 1):
                if on_progress:
                    on_progress(len(raw))
                if not raw.strip():
                    continue
                text = _text_of(raw, number, key, source)
                ids = array("H", tokenizer.encode(text))
                ids.append(tokenizer.eod)
                if _BIG_ENDIAN:
                    ids.byteswap()
                ids.tofile(out)
                offsets.append(offsets[-1] + len(ids))
    except OSError as exc:
        raise BenchError(f"{exc.filename}: {exc.strerror}") from exc
    index = TokenIndex(tokenizer.vocab_size, tokenizer.eod, 2, len(offsets) - 1, offsets[-1], tuple(offsets))
    if index.documents == 0:
        raise BenchError(f"{source}: no documents (every line was empty)")
    with idx_path.open("wb") as out:
        out.write(_HEADER.pack(MAGIC, VERSION, 2, index.vocab_size, index.eod, index.documents, index.tokens))
        if _BIG_ENDIAN:
            offsets.byteswap()
        offsets.tofile(out)
    return index


def _text_of(raw: bytes, number: int, key: str, source: Path) -> str:
    try:
        record = json.loads(raw)
    except ValueError as exc:
        raise BenchError(f"{source} line {number}: not JSON ({exc.args[0]})") from exc
    if not isinstance(record, dict) or key not in record:
        raise BenchError(f"{source} line {number}: no {key!r} field; name the text field with --json-key")
    value = record[key]
    if not isinstance(value, str):
        raise BenchError(f"{source} line {number}: {key!r} is {type(value).__name__}, not text")
    return value


def read_index(prefix: Path) -> TokenIndex:
    bin_path, idx_path = paths(prefix)
    try:
        data = idx_path.read_bytes()
    except OSError as exc:
        raise BenchError(
            f"--data {prefix}: cannot read {idx_path} ({exc.strerror}); "
            "make it with gpupool bench prepare-data"
        ) from exc
    if len(data) < _HEADER.size or data[:8] != MAGIC:
        raise BenchError(f"--data {prefix}: {idx_path} is not a gpupool token index (made by prepare-data)")
    _, version, token_bytes, vocab, eod, documents, tokens = _HEADER.unpack_from(data)
    if version != VERSION or token_bytes != 2:
        raise BenchError(f"--data {prefix}: index version {version} is not supported; run prepare-data again")
    offsets = array("Q")
    offsets.frombytes(data[_HEADER.size : _HEADER.size + 8 * (documents + 1)])
    if _BIG_ENDIAN:
        offsets.byteswap()
    if not bin_path.exists() or bin_path.stat().st_size != tokens * token_bytes:
        raise BenchError(
            f"--data {prefix}: {bin_path} is missing or does not match its index; run prepare-data again"
        )
    return TokenIndex(vocab, eod, token_bytes, documents, tokens, tuple(offsets))


def read_tokens(prefix: Path) -> list[int]:
    """Every token id of the file (for tests and small files; training maps the file instead)."""
    bin_path, _ = paths(prefix)
    ids = array("H")
    ids.frombytes(bin_path.read_bytes())
    if _BIG_ENDIAN:
        ids.byteswap()
    return list(ids)
