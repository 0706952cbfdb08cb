"""Reading the pack out of an upload-pack response, and the objects in it, with C git.

Used by tests that must say exactly which objects a response carried (hidden-object checks):
the pack is indexed by ``git index-pack`` and listed by ``git show-index``, so the verdict
does not depend on our own pack reader.
"""

from __future__ import annotations

import subprocess
import tempfile
import zlib
from pathlib import Path

from gitutil import Git


class InBandError(AssertionError):
    """The response carried an ``ERR`` line or a side-band 3 message instead of a pack."""


def _pkts(body: bytes) -> list[bytes | None]:
    out: list[bytes | None] = []
    pos = 0
    while pos + 4 <= len(body):
        n = int(body[pos : pos + 4], 16)
        if n < 4:
            out.append(None)
            pos += 4
            continue
        out.append(body[pos + 4 : pos + n])
        pos += n
    return out


def pack_bytes(body: bytes) -> bytes | None:
    """The pack data of a v0 (side-band-64k) or v2 fetch response; None when it has none.

    Raises :class:`InBandError` on an ``ERR`` pkt-line or a side-band 3 message.
    """
    data = bytearray()
    in_pack = False
    for payload in _pkts(body):
        if payload is None:
            continue
        if payload.startswith(b"ERR "):
            raise InBandError(payload.decode(errors="replace"))
        if not in_pack:
            in_pack = payload.startswith(b"\x01PACK")
        if not in_pack:
            continue
        band = payload[:1]
        if band == b"\x01":
            data += payload[1:]
        elif band == b"\x03":
            raise InBandError(payload[1:].decode(errors="replace"))
    return bytes(data) if in_pack else None


def pack_object_ids(git: Git, pack: bytes) -> set[str]:
    """Hex ids of every object in ``pack`` (which must not be thin)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.pack"
        path.write_bytes(pack)
        git.run("index-pack", "-o", str(path.with_suffix(".idx")), str(path), cwd=tmp)
        with open(path.with_suffix(".idx"), "rb") as idx:
            listing = subprocess.run(["git", "show-index"], stdin=idx, capture_output=True,
                                     check=True, timeout=60, cwd=tmp).stdout.decode()
    return {line.split()[1] for line in listing.splitlines()}


def objects_reachable(git: Git, gitdir: Path, *revs: str) -> set[str]:
    """``git rev-list --objects REVS``: every object reachable from ``revs``."""
    if not revs:
        return set()
    out = git.out("rev-list", "--objects", *revs, cwd=gitdir)
    return {line.split()[0] for line in out.splitlines() if line}


def hidden_only_objects(git: Git, gitdir: Path, visible: list[str], hidden: list[str]) -> set[str]:
    """Objects reachable from the ``hidden`` refs and from none of the ``visible`` ones."""
    if not hidden:
        return set()
    # Set difference of the full closures: ``rev-list --objects H --not V`` only marks the
    # trees of boundary commits uninteresting, so it can list an object V also reaches.
    return objects_reachable(git, gitdir, *hidden) - objects_reachable(git, gitdir, *visible)


def shallow_info_and_objects(git: Git, body: bytes) -> tuple[list[str], set[str]]:
    """The sorted shallow-info lines of a v2 fetch answer, and the ids in its pack."""
    lines: list[str] = []
    section = b""
    for payload in _pkts(body):
        if payload is None:
            continue
        if payload in (b"shallow-info\n", b"packfile\n", b"acknowledgments\n",
                       b"wanted-refs\n"):
            section = payload.strip()
        elif section == b"shallow-info":
            lines.append(payload.decode().strip())
    pack = pack_bytes(body)
    return sorted(lines), pack_object_ids(git, pack) if pack else set()


def c_git_v2_answer(git: Git, gitdir: Path, body: bytes) -> subprocess.CompletedProcess[bytes]:
    """C git's own upload-pack on a v2 request body (``--stateless-rpc``): the ground
    truth. Not checked: it exits 128 after some refusals."""
    return git.run("upload-pack", "--stateless-rpc", str(gitdir), input=body,
                   env={"GIT_PROTOCOL": "version=2"}, check=False)


OFS_DELTA, REF_DELTA = 6, 7


def pack_entries(pack: bytes) -> list[tuple[int, int, int | bytes | None]]:
    """Each entry of ``pack`` as (offset, type number, base): the base's offset for an
    OFS_DELTA, its binary id for a REF_DELTA, else None. Parsed here, with zlib alone, so
    that the verdict does not depend on the server's reader."""
    count = int.from_bytes(pack[8:12], "big")
    out: list[tuple[int, int, int | bytes | None]] = []
    pos = 12
    for _ in range(count):
        at = pos
        c = pack[pos]
        kind = (c >> 4) & 7
        pos += 1
        while c & 0x80:
            c = pack[pos]
            pos += 1
        base: int | bytes | None = None
        if kind == OFS_DELTA:
            c = pack[pos]
            pos += 1
            dist = c & 0x7F
            while c & 0x80:
                c = pack[pos]
                pos += 1
                dist = ((dist + 1) << 7) | (c & 0x7F)
            base = at - dist
        elif kind == REF_DELTA:
            base = pack[pos : pos + 20]
            pos += 20
        d = zlib.decompressobj()
        d.decompress(pack[pos:])
        assert d.eof, "an entry's zlib stream does not end"
        pos = len(pack) - len(d.unused_data)
        out.append((at, kind, base))
    assert pos == len(pack) - 20, "bytes between the last entry and the trailer"
    return out


def pack_offsets(git: Git, pack: bytes, objects: Path | None = None) -> dict[bytes, int]:
    """Binary id -> offset of every entry of ``pack``, as ``git index-pack`` and
    ``show-index`` see it. A thin pack needs ``objects`` (a repository's objects
    directory holding its bases): it is indexed with ``--fix-thin`` in a scratch
    repository borrowing them, and the bases index-pack appended are left out."""
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "scratch.git"
        git.run("init", "-q", "--bare", str(scratch))
        if objects is not None:
            (scratch / "objects" / "info" / "alternates").write_text(f"{objects}\n")
        out = git.run("index-pack", "--stdin", "--fix-thin", cwd=scratch,
                      input=pack).stdout.decode().split()[-1]
        idx = next((scratch / "objects" / "pack").glob(f"pack-{out}.idx"))
        with open(idx, "rb") as fh:
            listing = subprocess.run(["git", "show-index"], stdin=fh, capture_output=True,
                                     check=True, timeout=60, cwd=tmp).stdout.decode()
    found = {bytes.fromhex(line.split()[1]): int(line.split()[0])
             for line in listing.splitlines()}
    return {oid: at for oid, at in found.items() if at < len(pack) - 20}


def pack_order_faults(entries: list[tuple[int, int, int | bytes | None]],
                      offsets: dict[bytes, int], ofs_delta: bool,
                      client_has: set[bytes] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """What breaks DESIGN.md invariant 11 in a pack: a delta whose base comes later in the
    pack or is neither in it nor an object the client has (thin), a REF_DELTA to a base
    in the pack when the client asked for ofs-delta, an OFS_DELTA when it did not."""
    starts = {at for at, _, _ in entries}
    faults = []
    for at, kind, base in entries:
        if kind == OFS_DELTA:
            if not ofs_delta:
                faults.append(f"OFS_DELTA at {at} without ofs-delta")
            if base not in starts:
                faults.append(f"OFS_DELTA at {at}: base {base} is no entry")
        elif kind == REF_DELTA:
            assert isinstance(base, bytes)
            where = offsets.get(base)
            if where is None:
                if base not in client_has:
                    faults.append(f"REF_DELTA at {at}: base {base.hex()} not sent, not had")
            elif where > at:
                faults.append(f"REF_DELTA at {at}: base {base.hex()} comes later, at {where}")
            elif ofs_delta:
                faults.append(f"REF_DELTA at {at} to a base in the pack, with ofs-delta")
    return faults
