"""prepare-data's token files: byte-level tokens, document boundaries, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupool.bench.errors import BenchError
from gpupool.bench.tokens import ByteTokenizer, read_index, read_tokens, write_token_file


def test_round_trip_keeps_every_document_and_its_bytes(tmp_path: Path) -> None:
    texts = ["hello world", "", "héllo ✓ 漢字", "line\nbreak"]
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts)) + "\n")
    written = write_token_file(source, tmp_path / "corpus")
    index = read_index(tmp_path / "corpus")
    assert index == written
    assert index.documents == 4 and index.vocab_size == 257 and index.eod == 256
    tokens = read_tokens(tmp_path / "corpus.bin")
    assert len(tokens) == index.tokens == sum(len(t.encode()) + 1 for t in texts)
    tok = ByteTokenizer()
    for i, text in enumerate(texts):
        doc = tokens[index.offsets[i] : index.offsets[i + 1]]
        assert doc[-1] == tok.eod
        assert tok.decode(doc) == text


def test_missing_field_names_the_line_and_the_flag(tmp_path: Path) -> None:
    source = tmp_path / "docs.jsonl"
    source.write_text('{"text": "a"}\n{"body": "b"}\n')
    with pytest.raises(BenchError, match="line 2: no 'text' field; name the text field with --json-key"):
        write_token_file(source, tmp_path / "corpus")
    with pytest.raises(BenchError, match="line 1: no 'body' field"):
        write_token_file(source, tmp_path / "other", key="body")


def test_a_file_that_is_not_an_index_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.idx").write_bytes(b"nonsense")
    with pytest.raises(BenchError, match="not a gpupool token index"):
        read_index(tmp_path / "x")
    with pytest.raises(BenchError, match="make it with gpupool bench prepare-data"):
        read_index(tmp_path / "missing")
