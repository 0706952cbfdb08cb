"""Reading the pack out of an upload-pack response, and the objects in it, with C git.

Used by tests that must say exactly which objects a response carried (hidden-object checks):
the pack is indexed by ``git index-pack`` and listed by ``git show-index``, so the verdict
does not depend on our own pack reader.
"""

from __future__ import annotations

import subprocess
import tempfile
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
