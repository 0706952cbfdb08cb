"""The storage readers refuse garbage with their own error types, quickly (docs/ARCHITECTURE.md
"The fuzz invariant", "Storage faults: what is checked"): an EWAH bitmap whose run lengths
are garbage once expanded to gigabytes; a packed-refs line git does not write was dropped.
"""

from __future__ import annotations

import time

import pytest
from gitspout.server.store import packedrefs as P
from gitspout.server.store import refs as R
from gitspout.server.store import repoformat as RF
from gitspout.server.store.bitmaps import BitmapFormatError, decode_ewah
from gitspout.server.store.errors import StorageError
from gitspout.server.store.gitconfig import ConfigFileError, parse_config
from hypothesis import given, settings
from hypothesis import strategies as st

OID = "a" * 40


def _refs(parsed: P.PackedRefs) -> list[R.Ref]:
    return [r for seg in parsed.segments for r in seg.refs()]


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=200), st.integers(min_value=0, max_value=5000))
def test_ewah_garbage_is_refused_or_bounded(data: bytes, nbits: int) -> None:
    start = time.monotonic()
    try:
        bits, _size, end = decode_ewah(data, 0, nbits)
    except BitmapFormatError:
        pass
    else:
        assert end <= len(data)
        assert bits.bit_length() <= 64 * (4 * ((nbits + 63) // 64) + 64)
    # A hang guard, not a timing: a decode of at most 200 bytes takes microseconds; the
    # bound catches a decoder that expands a huge run word by word (up to 2^32 words).
    assert time.monotonic() - start < 1


def test_ewah_huge_run_is_refused() -> None:
    # one word: a run of 2^32 - 1 words of ones, no literals (once ~32 GB of output)
    word = ((0xFFFFFFFF << 1) | 1).to_bytes(8, "big")
    data = (64).to_bytes(4, "big") + (1).to_bytes(4, "big") + word + b"\0\0\0\0"
    with pytest.raises(BitmapFormatError):
        decode_ewah(data, 0, 64)


@pytest.mark.parametrize("text", [
    b"garbage\n",
    f"{OID} refs/heads/a\nnot a ref\n".encode(),
    f"{OID} refs/heads/a\n\n".encode(),  # an empty line
    f"^{OID}\n{OID} refs/tags/t\n".encode(),  # a peeled line before any ref
    f"{OID} refs/tags/t\n^{OID}\n^{OID}\n".encode(),  # two peeled lines
    f"{OID} refs/heads/a\n{'z' * 40} refs/heads/b\n".encode(),  # not hex
    f"{OID} refs/heads/a\n{OID} refs/heads/b".encode(),  # unterminated (truncated)
    f"{OID} refs/heads/a\n{OID}\n".encode(),  # no name
    f"{OID}0 refs/heads/a\n".encode(),  # 41 digits
    f"{OID} refs/heads/a\n# a comment\n".encode(),
])
def test_packed_refs_lines_git_does_not_write_are_refused(text: bytes) -> None:
    for header in (b"", b"# pack-refs with: peeled fully-peeled sorted \n"):
        with pytest.raises(StorageError) as exc:
            # lines are checked when their segment is first used (store/refs.py)
            _refs(P.parse_packed_refs(header + text, 40, lambda _oid: None))
        assert exc.value.kind == "packed-refs" and exc.value.what == "corrupt packed-refs"


def test_packed_refs_as_git_writes_them_parse() -> None:
    text = (b"# pack-refs with: peeled fully-peeled sorted \n"
            + f"{OID} refs/heads/a\n{'b' * 40} refs/tags/t\n^{'c' * 40}\n".encode())
    parsed = P.parse_packed_refs(text, 40, lambda _oid: None)
    refs = _refs(parsed)
    assert [(r.name, r.oid, r.peeled) for r in refs] == [
        (b"refs/heads/a", OID.encode(), None), (b"refs/tags/t", b"b" * 40, b"c" * 40)]
    assert _refs(P.parse_packed_refs(b"", 40, lambda _oid: None)) == []


def _blocks_table() -> bytes:
    """The ``blocks`` table of tests/fixtures/reftable (git 2.55: 300 refs, 256-byte
    blocks, peeled tags and symrefs)."""
    import json
    from pathlib import Path

    answers = Path(__file__).resolve().parent / "fixtures" / "reftable" / "answers.json"
    tables = json.loads(answers.read_text())["cases"]["blocks"]["states"]["0"]["tables"]
    (name,) = bytes.fromhex(tables["tables.list"]).decode().split()
    return bytes.fromhex(tables[name])


@pytest.mark.parametrize("change", [0x80, 0x07, 0xFF])
def test_damaged_reftable_blocks_are_refused_or_read(change: int) -> None:
    """Bytes of a table's ref blocks damaged one at a time (blocks have no checksum; every
    fifth byte: each field of a record is hit somewhere), xored with *change* (0x80: a
    varint's continuation bit; 0x07: a value type): the parse raises a storage error or
    gives refs whose every line is an entry; nothing else escapes."""
    from gitspout.server.store.reftable import parse_table

    good = _blocks_table()
    outcomes = {"refused": 0, "read": 0}
    for pos in range(24, len(good) - 68, 5):  # between the header and the footer
        data = bytearray(good)
        data[pos] ^= change
        try:
            table = parse_table(bytes(data), 20)
            for seg in table.packed.segments:
                seg.refs()
        except StorageError:
            outcomes["refused"] += 1
        else:
            outcomes["read"] += 1
    assert outcomes["refused"] > 100 and outcomes["read"] > 100, outcomes


# -- repository format (store/repoformat.py; setup.c) ---------------------------------

def _format(text: str) -> RF.RepoFormat:
    return RF.repository_format(parse_config(text))


@pytest.mark.parametrize(("text", "fmt", "storage", "refusal"), [
    ("", "sha1", "files", None),
    ("[core]\n\trepositoryformatversion = 0\n", "sha1", "files", None),
    ("[core]\n\trepositoryformatversion = 01\n[extensions]\n\tobjectformat = sha256\n",
     "sha256", "files", None),  # strtoimax base 0: octal
    ("[core]\n\trepositoryformatversion = 0x2\n", "sha1", "files",
     "Expected git repo version <= 1, found 2"),
    ("[core]\n\trepositoryformatversion = 1\n[extensions]\n\trefStorage = reftable\n",
     "sha1", "reftable", None),
    ("[core]\n\trepositoryformatversion = 1\n[extensions]\n\tobjectFormat = SHA256\n",
     "sha1", "files", "unsupported object format SHA256"),  # values are case-sensitive
    ("[core]\n\trepositoryformatversion = 1\n[extensions]\n\trefstorage = files:///x\n",
     "sha1", "files", "unsupported ref storage format 'files:///x'"),
    ("[extensions]\n\trefstorage = nope\n", "sha1", "files",
     "unsupported ref storage format 'nope'"),  # no version: still read, still refused
    ("[extensions]\n\tobjectformat = sha256\n", "sha1", "files", None),  # no version
    ("[core]\n\trepositoryformatversion = -5\n[extensions]\n\tobjectformat = sha256\n"
     "\tfrob = 1\n", "sha256", "files", None),  # negative: C git checks nothing
    ("[core]\n\trepositoryformatversion = 1\n[extensions \"a\"]\n\tB = 1\n[extensions]\n"
     "\tc = 1\n", "sha1", "files", "unknown repository extensions found: a.b, c"),
    ("[core]\n\trepositoryformatversion = 0\n[extensions]\n\tcompatObjectFormat = sha256\n"
     "\trefStorage = files\n", "sha1", "files",
     "repo version is 0, but v1-only extensions found: compatobjectformat, refstorage"),
])
def test_repository_format(text: str, fmt: str, storage: str, refusal: str | None) -> None:
    got = _format(text)
    assert got.refusal == refusal
    if refusal is None:
        assert (got.object_format, got.ref_storage) == (fmt, storage)


@pytest.mark.parametrize("text", [
    "[core]\n\trepositoryformatversion = x\n",
    "[core]\n\trepositoryformatversion = 1_0\n",
    "[core]\n\trepositoryformatversion\n",
    "[core]\n\trepositoryformatversion = 99999999999\n",
    "[extensions]\n\tpartialclone\n",
    "[extensions]\n\tobjectformat\n",
    "[extensions]\n\tworktreeconfig = maybe\n",
])
def test_repository_format_bad_values_are_bad_config(text: str) -> None:
    """Values C git dies on while reading the config: a bad config (as a bad boolean)."""
    with pytest.raises(ConfigFileError):
        _format(text)


def test_worktree_config_flag() -> None:
    assert _format("[extensions]\n\tworktreeConfig\n[core]\n\trepositoryformatversion = 0\n"
                   ).worktree_config
    assert not _format("[extensions]\n\tworktreeConfig = true\n").worktree_config  # no version
