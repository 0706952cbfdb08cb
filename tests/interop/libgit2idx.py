"""libgit2's own pack indexer (``git_indexer_*``), called through ctypes.

pygit2 does not wrap the indexer, but its wheel bundles libgit2 as a shared library that
exports it: this is the code a libgit2 client (pygit2 ``clone_repository``, ``fetch``)
runs on every pack it receives, resolving deltas as the pack's order allows. A pack whose
delta comes before its base is where libgit2 and C git's ``index-pack`` part ways
(issue 23), so every pack the property test sees goes through both.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import pygit2

CHUNK = 64 << 10


class _Progress(ctypes.Structure):
    _fields_ = [("total_objects", ctypes.c_uint), ("indexed_objects", ctypes.c_uint),
                ("received_objects", ctypes.c_uint), ("local_objects", ctypes.c_uint),
                ("total_deltas", ctypes.c_uint), ("indexed_deltas", ctypes.c_uint),
                ("received_bytes", ctypes.c_size_t)]


class _Options(ctypes.Structure):
    # libgit2 1.x without GIT_EXPERIMENTAL_SHA256 (the pygit2 wheels): include/git2/indexer.h
    _fields_ = [("version", ctypes.c_uint), ("progress_cb", ctypes.c_void_p),
                ("progress_cb_payload", ctypes.c_void_p), ("verify", ctypes.c_ubyte)]


class _Error(ctypes.Structure):
    _fields_ = [("message", ctypes.c_char_p), ("klass", ctypes.c_int)]


def _find_library() -> Path:
    """The libgit2 that pygit2 itself loads (the wheel's bundled copy)."""
    libs = Path(pygit2.__file__).resolve().parent.parent / "pygit2.libs"
    found = sorted(libs.glob("libgit2*.so*"))
    if not found:
        raise RuntimeError(f"no bundled libgit2 next to pygit2 (looked in {libs})")
    return found[0]


_LIB: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _LIB
    if _LIB is None:
        lib = ctypes.CDLL(str(_find_library()))
        lib.git_libgit2_init()
        lib.git_error_last.restype = ctypes.POINTER(_Error)
        lib.git_indexer_new.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p,
                                        ctypes.c_uint, ctypes.c_void_p, ctypes.POINTER(_Options)]
        lib.git_indexer_append.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                           ctypes.POINTER(_Progress)]
        lib.git_indexer_commit.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Progress)]
        lib.git_indexer_name.argtypes = [ctypes.c_void_p]
        lib.git_indexer_name.restype = ctypes.c_char_p
        lib.git_indexer_free.argtypes = [ctypes.c_void_p]
        lib.git_odb_open.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        lib.git_odb_free.argtypes = [ctypes.c_void_p]
        lib.git_indexer_options_init.argtypes = [ctypes.POINTER(_Options), ctypes.c_uint]
        _LIB = lib
    return _LIB


class Libgit2IndexError(AssertionError):
    """libgit2's indexer refused the pack."""


@dataclass(frozen=True)
class Indexed:
    name: str  # the pack's checksum, as libgit2 names pack-<name>.pack/.idx
    pack: Path
    idx: Path
    total_objects: int
    indexed_objects: int
    local_objects: int  # thin-pack bases libgit2 appended from the object store
    total_deltas: int
    indexed_deltas: int


def _check(rc: int, what: str) -> None:
    if rc < 0:
        err = _lib().git_error_last()
        msg = err.contents.message.decode(errors="replace") if err and err.contents.message else "?"
        raise Libgit2IndexError(f"libgit2 {what} failed ({rc}): {msg}")


def index_pack(pack: bytes, out_dir: Path, objects_dir: Path | None = None,
               verify: bool = False) -> Indexed:
    """Index ``pack`` with libgit2 into ``out_dir``. ``objects_dir`` (a repository's
    ``objects``) supplies a thin pack's bases; ``verify`` adds libgit2's connectivity check."""
    lib = _lib()
    out_dir.mkdir(parents=True, exist_ok=True)
    opts = _Options()
    _check(lib.git_indexer_options_init(ctypes.byref(opts), 1), "git_indexer_options_init")
    opts.verify = 1 if verify else 0
    odb = ctypes.c_void_p()
    if objects_dir is not None:
        _check(lib.git_odb_open(ctypes.byref(odb), os.fsencode(objects_dir)), "git_odb_open")
    idx = ctypes.c_void_p()
    stats = _Progress()
    try:
        _check(lib.git_indexer_new(ctypes.byref(idx), os.fsencode(out_dir), 0, odb,
                                   ctypes.byref(opts)), "git_indexer_new")
        for at in range(0, len(pack), CHUNK):
            piece = pack[at : at + CHUNK]
            _check(lib.git_indexer_append(idx, piece, len(piece), ctypes.byref(stats)),
                   "git_indexer_append")
        _check(lib.git_indexer_commit(idx, ctypes.byref(stats)), "git_indexer_commit")
        name = lib.git_indexer_name(idx).decode()
    finally:
        if idx:
            lib.git_indexer_free(idx)
        if odb:
            lib.git_odb_free(odb)
    return Indexed(name, out_dir / f"pack-{name}.pack", out_dir / f"pack-{name}.idx",
                   stats.total_objects, stats.indexed_objects, stats.local_objects,
                   stats.total_deltas, stats.indexed_deltas)
