"""A pack's entries as sent, read independently of the server's own pack code.

Headers and delta references are parsed here (gitformat-pack: type/size varint, OFS_DELTA
negative offset, REF_DELTA base id); each entry's zlib stream is inflated only to find
where it ends. Object ids come from C git (``git index-pack`` then ``git show-index``), so
the verdict on what a pack holds does not depend on a resolver of ours.
"""

from __future__ import annotations

import hashlib
import struct
import subprocess
import tempfile
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

OBJ_COMMIT, OBJ_TREE, OBJ_BLOB, OBJ_TAG, OFS_DELTA, REF_DELTA = 1, 2, 3, 4, 6, 7
TYPE_NAMES = {1: "commit", 2: "tree", 3: "blob", 4: "tag", 6: "ofs-delta", 7: "ref-delta"}


class PackParseError(AssertionError):
    """The bytes are not a well-formed pack."""


@dataclass(frozen=True)
class Entry:
    """One pack entry: where it starts and ends, its type, and its delta base reference."""

    offset: int
    end: int
    type: int
    size: int
    data_offset: int  # where the zlib stream starts
    base_offset: int | None = None  # OFS_DELTA: the base entry's offset
    base_oid: bytes | None = None  # REF_DELTA: the base object's id


@dataclass(frozen=True)
class Pack:
    data: bytes
    count: int
    entries: list[Entry]
    hash_len: int

    def types(self) -> Counter[str]:
        return Counter(TYPE_NAMES[e.type] for e in self.entries)


def _varint_header(data: bytes, pos: int) -> tuple[int, int, int]:
    c = data[pos]
    type_num = (c >> 4) & 7
    size = c & 15
    shift = 4
    pos += 1
    while c & 0x80:
        c = data[pos]
        size |= (c & 0x7F) << shift
        shift += 7
        pos += 1
    return type_num, size, pos


def _ofs_distance(data: bytes, pos: int) -> tuple[int, int]:
    c = data[pos]
    dist = c & 0x7F
    pos += 1
    while c & 0x80:
        c = data[pos]
        dist = ((dist + 1) << 7) | (c & 0x7F)
        pos += 1
    return dist, pos


def _inflate_end(view: memoryview, pos: int, size: int) -> int:
    """Where the zlib stream starting at ``pos`` ends (checking it inflates to ``size``)."""
    d = zlib.decompressobj()
    fed, got, step = pos, 0, size + 64
    while not d.eof:
        if fed >= len(view):
            raise PackParseError(f"truncated zlib stream at {pos}")
        chunk = view[fed : fed + step]
        fed += len(chunk)
        got += len(d.decompress(chunk))
        step = 1 << 16
    if got != size:
        raise PackParseError(f"entry at {pos}: inflated {got} bytes, header says {size}")
    return fed - len(d.unused_data)


def parse_pack(data: bytes, hash_len: int = 20) -> Pack:
    """Every entry of ``data`` (a whole pack, trailer included)."""
    if len(data) < 12 + hash_len or data[:4] != b"PACK":
        raise PackParseError(f"not a pack: {data[:12]!r}")
    version, count = struct.unpack(">II", data[4:12])
    if version not in (2, 3):
        raise PackParseError(f"pack version {version}")
    body_end = len(data) - hash_len
    entries: list[Entry] = []
    view = memoryview(data)[:body_end]
    pos = 12
    for _ in range(count):
        if pos >= body_end:
            raise PackParseError(f"{count} entries announced, {len(entries)} found")
        start = pos
        type_num, size, pos = _varint_header(data, pos)
        base_offset = base_oid = None
        if type_num == OFS_DELTA:
            dist, pos = _ofs_distance(data, pos)
            base_offset = start - dist
        elif type_num == REF_DELTA:
            base_oid = data[pos : pos + hash_len]
            pos += hash_len
        elif type_num not in (OBJ_COMMIT, OBJ_TREE, OBJ_BLOB, OBJ_TAG):
            raise PackParseError(f"entry at {start}: type {type_num}")
        data_at = pos
        pos = _inflate_end(view, pos, size)
        entries.append(Entry(start, pos, type_num, size, data_at, base_offset, base_oid))
    if pos != body_end:
        raise PackParseError(f"{body_end - pos} bytes between the last entry and the trailer")
    return Pack(data, count, entries, hash_len)


class CatFile:
    """``git cat-file --batch`` on a repository: the bases a thin pack leaves out."""

    def __init__(self, git_dir: Path) -> None:
        self.proc = subprocess.Popen(["git", "-C", str(git_dir), "cat-file", "--batch"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def read(self, oid: str) -> tuple[int, bytes]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(oid.encode() + b"\n")
        self.proc.stdin.flush()
        head = self.proc.stdout.readline().split()
        if len(head) != 3:
            raise KeyError(oid)
        data = self.proc.stdout.read(int(head[2]) + 1)[:-1]
        return NAME_TYPES[head[1].decode()], data

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


NAME_TYPES = {"commit": OBJ_COMMIT, "tree": OBJ_TREE, "blob": OBJ_BLOB, "tag": OBJ_TAG}


def object_ids(pack: Pack, external: CatFile | None = None) -> dict[int, str]:
    """The id of the entry at each offset, deltas resolved in whatever order their bases
    allow (a delta before its base too), a thin pack's outside bases read from
    ``external``. Independent of the pack order that the indexers trip over."""
    from dulwich.pack import apply_delta

    hasher = hashlib.sha256 if pack.hash_len == 32 else hashlib.sha1
    done: dict[int, tuple[int, bytes]] = {}
    ids: dict[int, str] = {}
    at_id: dict[str, int] = {}

    def finish(e: Entry, type_num: int, data: bytes) -> None:
        done[e.offset] = (type_num, data)
        oid = hasher(b"%s %d\0" % (TYPE_NAMES[type_num].encode(), len(data)) + data).hexdigest()
        ids[e.offset] = oid
        at_id.setdefault(oid, e.offset)

    def undelta(base: bytes, e: Entry) -> bytes:
        return b"".join(apply_delta(base, zlib.decompress(pack.data[e.data_offset : e.end])))

    pending = list(pack.entries)
    while pending:
        left = []
        for e in pending:
            if e.type not in (OFS_DELTA, REF_DELTA):
                finish(e, e.type, zlib.decompress(pack.data[e.data_offset : e.end]))
                continue
            if e.base_offset is not None:
                base = done.get(e.base_offset)
            else:
                assert e.base_oid is not None
                at = at_id.get(e.base_oid.hex())
                base = done[at] if at is not None else None
            if base is None:
                left.append(e)
            else:
                finish(e, base[0], undelta(base[1], e))
        if len(left) == len(pending):  # stuck: what is left hangs on bases outside the pack
            outside = [e for e in left if e.base_oid is not None]
            if not outside or external is None:
                raise PackParseError(f"{len(left)} deltas without a base")
            for e in outside:
                assert e.base_oid is not None
                type_num, data = external.read(e.base_oid.hex())
                finish(e, type_num, undelta(data, e))
            left = [e for e in left if e.offset not in done]
        pending = left
    return ids


def index_with_git(git_dir: Path | None, pack: bytes, *, thin: bool = False,
                   strict: bool = True, fsck_objects: bool = False,
                   object_format: str = "sha1") -> dict[int, str]:
    """``git index-pack`` (``--strict``: objects checked and every link present; else
    ``--fsck-objects``: objects checked only; ``--fix-thin`` with ``git_dir``'s objects as
    the thin pack's bases): the id of the entry at each offset of ``pack``."""
    with tempfile.TemporaryDirectory(prefix="interop-idx-") as tmp:
        repo = Path(tmp) / "r.git"
        subprocess.run(["git", "init", "-q", "--bare", f"--object-format={object_format}",
                        str(repo)], check=True, timeout=60, capture_output=True)
        if git_dir is not None:
            (repo / "objects/info/alternates").write_text(str(Path(git_dir) / "objects") + "\n")
        args = ["git", "-C", str(repo), "index-pack", "--stdin"]
        if strict:
            args.append("--strict")
        elif fsck_objects:
            args.append("--fsck-objects")
        if thin:
            args.append("--fix-thin")
        proc = subprocess.run(args, input=pack, capture_output=True, timeout=120)
        if proc.returncode != 0:
            raise AssertionError(f"git index-pack failed: {proc.stderr.decode(errors='replace')}")
        name = proc.stdout.decode().split()[-1]
        idx = repo / "objects/pack" / f"pack-{name}.idx"
        listing = subprocess.run(["git", "show-index", f"--object-format={object_format}"],
                                 stdin=idx.open("rb"), capture_output=True, check=True,
                                 timeout=60).stdout.decode()
    limit = len(pack) - (32 if object_format == "sha256" else 20)  # past it: bases --fix-thin added
    return {int(off): oid for off, oid, _crc in (line.split() for line in listing.splitlines())
            if int(off) < limit}


def order_violations(pack: Pack, ids: dict[int, str], client_has: set[str] | frozenset[str],
                     ofs_delta: bool) -> list[str]:
    """Where ``pack`` breaks the order rule of issue 23, as readable lines (none: it holds).

    Every delta's base comes earlier in the pack, or (thin pack) is an object the client has;
    with ``ofs_delta`` negotiated an in-pack base is referenced by OFS_DELTA, never REF_DELTA;
    without it, no OFS_DELTA at all.
    """
    at = {oid: off for off, oid in ids.items()}
    bad: list[str] = []
    for e in pack.entries:
        me = ids.get(e.offset, "?")
        if e.type == OFS_DELTA:
            if not ofs_delta:
                bad.append(f"{me} at {e.offset}: OFS_DELTA without ofs-delta negotiated")
            if e.base_offset is None or e.base_offset not in ids or e.base_offset >= e.offset:
                bad.append(f"{me} at {e.offset}: OFS_DELTA base offset {e.base_offset} is no earlier entry")
        elif e.type == REF_DELTA:
            assert e.base_oid is not None
            base = e.base_oid.hex()
            where = at.get(base)
            if where is None:
                if base not in client_has:
                    bad.append(f"{me} at {e.offset}: REF_DELTA base {base} neither in the pack "
                               "nor declared by the client")
            elif where > e.offset:
                bad.append(f"{me} at {e.offset}: REF_DELTA base {base} comes later, at {where}")
            elif ofs_delta:
                bad.append(f"{me} at {e.offset}: REF_DELTA to {base} inside the pack although "
                           "ofs-delta was negotiated")
    return bad
