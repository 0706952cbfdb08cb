"""The refs of a repository as one request sees them (DESIGN.md invariant 2).

``packed-refs`` is parsed once and kept across requests behind a validation of (device,
inode, size, mtime_ns). Loose refs are found with one directory walk; a loose ref file's
content is cached by inode, which changes on every update git makes (lock file + rename).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from protocol.refs import HeadInfo, Ref, ref_is_hidden

from .fsops import FsOps

__all__ = ["RefSnapshot", "RefCache", "read_ref_snapshot", "Peeler"]

Peeler = Callable[[bytes], bytes | None]
"""Given a hex object id, the hex id it peels to when it is a tag, else None."""

_MAX_SYMREF_DEPTH = 5


@dataclass(frozen=True, slots=True)
class _PackedRefs:
    values: dict[bytes, bytes]
    peeled: dict[bytes, bytes]
    fully_peeled: bool


@dataclass
class RefCache:
    """Cross-request ref state of one repository (process-wide, shared by threads)."""

    packed: tuple[tuple[int, ...], _PackedRefs] | None = None
    loose: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    enabled: bool = True


@dataclass(frozen=True)
class RefSnapshot:
    """HEAD plus every ref (sorted bytewise, symrefs resolved) at one moment."""

    head: HeadInfo
    refs: tuple[Ref, ...]
    hex_len: int

    def by_name(self) -> dict[bytes, Ref]:
        return {r.name: r for r in self.refs}

    def visible(self, hide: Iterable[bytes]) -> tuple[HeadInfo | None, list[Ref]]:
        """HEAD (None when hidden) and the refs hideRefs leaves visible."""
        patterns = list(hide)
        if not patterns:
            return self.head, list(self.refs)
        head = None if ref_is_hidden(b"HEAD", patterns) else self.head
        return head, [r for r in self.refs if not ref_is_hidden(r.name, patterns)]


def _parse_packed_refs(data: bytes, hex_len: int) -> _PackedRefs:
    values: dict[bytes, bytes] = {}
    peeled: dict[bytes, bytes] = {}
    fully = False
    last: bytes | None = None
    for line in data.splitlines():
        if not line:
            continue
        if line.startswith(b"#"):
            if line.startswith(b"# pack-refs with:"):
                fully = b" fully-peeled" in line.split(b":", 1)[1] + b" "
            continue
        if line.startswith(b"^"):
            if last is not None and len(line) == hex_len + 1:
                peeled[last] = line[1:]
            continue
        oid, _, name = line.partition(b" ")
        if len(oid) != hex_len or not name:
            last = None
            continue
        values[name] = oid
        last = name
    return _PackedRefs(values, peeled, fully)


def _stat_key(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _read_packed(gitdir: str, fs: FsOps, cache: RefCache, hex_len: int) -> _PackedRefs:
    path = os.path.join(gitdir, "packed-refs")
    st = fs.stat_or_none(path)
    if st is None:
        return _PackedRefs({}, {}, True)
    key = _stat_key(st)
    cached = cache.packed
    if cache.enabled and cached is not None and cached[0] == key:
        return cached[1]
    data = fs.read_file_or_none(path) or b""
    parsed = _parse_packed_refs(data, hex_len)
    if cache.enabled:
        cache.packed = (key, parsed)
    return parsed


def _valid_component(name: str) -> bool:
    return bool(name) and not name.startswith(".") and not name.endswith(".lock")


def _walk_loose(gitdir: str, fs: FsOps, cache: RefCache) -> dict[bytes, bytes]:
    """Raw contents of every loose ref file under ``refs/``, by ref name."""
    out: dict[bytes, bytes] = {}
    stack = [("refs", os.path.join(gitdir, "refs"))]
    seen: dict[str, tuple[int, bytes]] = {}
    while stack:
        prefix, path = stack.pop()
        for entry in fs.scandir_or_empty(path):
            if not _valid_component(entry.name):
                continue
            name = prefix + "/" + entry.name
            if entry.is_dir(follow_symlinks=False):
                stack.append((name, entry.path))
                continue
            ino = entry.inode()
            cached = cache.loose.get(name) if cache.enabled else None
            if cached is not None and cached[0] == ino:
                content = cached[1]
            else:
                data = fs.read_file_or_none(entry.path)
                if data is None:
                    continue
                content = data.strip()
            seen[name] = (ino, content)
            out[name.encode("utf-8", "surrogateescape")] = content
    if cache.enabled:
        cache.loose = seen
    return out


def _resolve(
    name: bytes, loose: dict[bytes, bytes], packed: _PackedRefs, hex_len: int
) -> tuple[bytes | None, bytes | None]:
    """Follow symrefs: (object id or None when unborn/broken, immediate symref target)."""
    target: bytes | None = None
    current = name
    for depth in range(_MAX_SYMREF_DEPTH):
        content = loose.get(current)
        if content is None:
            return packed.values.get(current), target
        if content.startswith(b"ref:"):
            current = content[4:].strip()
            if depth == 0:
                target = current
            continue
        return (content if len(content) == hex_len else None), target
    return None, target


def read_ref_snapshot(
    gitdir: str, fs: FsOps, cache: RefCache, hex_len: int, peel: Peeler
) -> RefSnapshot:
    """Read HEAD, packed-refs and loose refs once."""
    packed = _read_packed(gitdir, fs, cache, hex_len)
    loose = _walk_loose(gitdir, fs, cache)
    head_raw = (fs.read_file_or_none(os.path.join(gitdir, "HEAD")) or b"").strip()
    names = sorted(set(packed.values) | set(loose))
    refs: list[Ref] = []
    for name in names:
        oid, target = _resolve(name, loose, packed, hex_len)
        if oid is None:
            continue
        if name in loose:
            peeled = peel(oid)
        elif name in packed.peeled:
            peeled = packed.peeled[name]
        elif packed.fully_peeled:
            peeled = None
        else:
            peeled = peel(oid)
        refs.append(Ref(name, oid, peeled, target))
    head = _read_head(head_raw, loose, packed, hex_len)
    return RefSnapshot(head, tuple(refs), hex_len)


def _read_head(raw: bytes, loose: dict[bytes, bytes], packed: _PackedRefs, hex_len: int) -> HeadInfo:
    if raw.startswith(b"ref:"):
        target = raw[4:].strip()
        oid, _ = _resolve(target, loose, packed, hex_len)
        return HeadInfo(target, oid)
    if len(raw) == hex_len:
        return HeadInfo(None, raw)
    return HeadInfo(None, None)
