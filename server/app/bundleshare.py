"""The files of gitspout's own bundles in one directory, which every worker of a master
shares (``--workers``; one process alone has a directory of its own, with the same files).

A repository's files, named by a digest ``TAG`` of its git directory:

- ``TAG-TOKEN.bundle``: a bundle, written as ``.tmp`` and renamed whole.
- ``TAG.json``: the current bundle (token, file name, refs, size, when written), replaced
  atomically (``rename``) once its bundle is complete: whoever reads it finds a whole
  bundle, or a 404 if it was replaced or evicted between the read and the open. It also
  names the bundle it replaced, and until when that one is still served to a client that
  was offered it just before (bundles.py ``GRACE``); that file is removed at the next
  replacement, or at an eviction once its time is over.
- ``TAG.lock``: the writer's exclusive ``flock``, taken without waiting: one writer per
  repository across processes; another that finds it held leaves the bundle to it. The
  lock file, one per repository, is never removed while the directory lives: one unlinked
  and made again could be locked on two inodes at once (cacheshare.py checks for that).
- ``TAG.clones``: the times (CLOCK_MONOTONIC, one clock for the whole machine) of the last
  ``--bundle-after`` full clones of the repository by any worker, rewritten under an
  ``flock`` of its own held for a read and a write.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from .cachedir import remove_files, unlink_quietly

__all__ = ["Bundle", "BundleFiles"]

STAMP = struct.Struct("<d")


@dataclass(frozen=True)
class Bundle:
    """One written bundle: its file, creation token and the refs it holds."""

    token: int
    path: str
    refs: tuple[tuple[bytes, bytes], ...]
    size: int
    written: float = field(default_factory=time.time)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


class BundleFiles:
    """One directory of bundles (module doc). Blocking: called in the pool."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        # TAG -> (stat, current, (previous, served until) or None)
        self._read: dict[str, tuple[tuple[int, int, int], Bundle,
                                    tuple[Bundle, float] | None]] = {}

    @staticmethod
    def tag(gitdir: str) -> str:
        return hashlib.sha256(gitdir.encode()).hexdigest()[:16]

    def _meta(self, tag: str) -> str:
        return os.path.join(self.dir, tag + ".json")

    def current(self, tag: str) -> Bundle | None:
        """The repository's published bundle, or None: one stat when it was read before."""
        read = self._load(tag)
        return read[0] if read is not None else None

    def previous(self, tag: str) -> tuple[Bundle, float] | None:
        """The bundle the current one replaced, and until when (``time.time()``) it is
        served; None when there is none."""
        read = self._load(tag)
        return read[1] if read is not None else None

    def _load(self, tag: str) -> tuple[Bundle, tuple[Bundle, float] | None] | None:
        path = self._meta(tag)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._read.pop(tag, None)
            return None
        sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        hit = self._read.get(tag)
        if hit is not None and hit[0] == sig:
            return hit[1], hit[2]
        try:
            with open(path, "rb") as fh:
                raw = json.loads(fh.read())
            bundle = self._bundle(raw)
            prev = raw.get("previous")
            previous = (self._bundle(prev), float(prev["until"])) if prev else None
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # half a file of a writer that died cannot be: it is renamed whole
        if len(self._read) >= 4096:
            self._read.clear()
        self._read[tag] = (sig, bundle, previous)
        return bundle, previous

    def _bundle(self, raw: Any) -> Bundle:
        return Bundle(int(raw["token"]), os.path.join(self.dir, str(raw["name"])),
                      tuple((n.encode(), o.encode()) for n, o in raw["refs"]),
                      int(raw["size"]), float(raw["written"]))

    def lock(self, tag: str) -> int | None:
        """The writer's lock of ``tag`` (a descriptor to :meth:`unlock`), or None when
        another process (or thread) writes."""
        fd = os.open(os.path.join(self.dir, tag + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    @staticmethod
    def unlock(fd: int) -> None:
        os.close(fd)

    def publish(self, tag: str, bundle: Bundle, previous: Bundle | None = None,
                until: float = 0.0) -> None:
        """The bundle's file is complete: make it the current one (under the lock), the
        one it replaces (``previous``) served until ``until``."""
        meta: dict[str, object] = _fields(bundle)
        if previous is not None:
            meta["previous"] = {**_fields(previous), "until": until}
        tmp = self._meta(tag) + f".{os.getpid()}"
        with open(tmp, "w") as fh:
            json.dump(meta, fh)
        os.replace(tmp, self._meta(tag))

    def reset_clones(self, tag: str) -> None:
        """A bundle was written: the clones counted before it count for no successor (each
        is due after ``--bundle-after`` more full clones, not at the next one)."""
        unlink_quietly(os.path.join(self.dir, tag + ".clones"))

    def count_clone(self, tag: str, keep: int, window: float) -> int:
        """Note a full clone now; how many of the last ``keep`` fall in ``window``."""
        now = time.monotonic()
        fd = os.open(os.path.join(self.dir, tag + ".clones"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held for one read and one write
            raw = os.pread(fd, STAMP.size * keep, 0)
            stamps = [s for (s,) in STAMP.iter_unpack(raw[:len(raw) - len(raw) % STAMP.size])]
            stamps = [s for s in stamps if s >= now - window][-(keep - 1):] if keep > 1 else []
            stamps.append(now)
            data = b"".join(STAMP.pack(s) for s in stamps)
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
            return len(stamps)
        finally:
            os.close(fd)

    def held(self) -> list[tuple[str, Bundle, float | None]]:
        """Every bundle file in the directory (for eviction): each repository's current
        one (``None``), and the one it replaced with the time it is served until."""
        out: list[tuple[str, Bundle, float | None]] = []
        for name in os.listdir(self.dir):
            if name.endswith(".json"):
                tag = name[:-len(".json")]
                read = self._load(tag)
                if read is not None:
                    out.append((tag, read[0], None))
                    if read[1] is not None:
                        out.append((tag, read[1][0], read[1][1]))
        return out

    def drop(self, tag: str, bundle: Bundle) -> None:
        """Unpublish ``bundle`` if it is still the current one (with the one it replaced),
        and remove its file."""
        read = self._load(tag)
        if read is not None and read[0] == bundle:
            unlink_quietly(self._meta(tag))
            if read[1] is not None:
                unlink_quietly(read[1][0].path)
        unlink_quietly(bundle.path)

    def close(self) -> None:
        """Remove every file (a directory of this process's own)."""
        remove_files(self.dir)


def _fields(bundle: Bundle) -> dict[str, object]:
    return {"token": bundle.token, "name": bundle.name, "size": bundle.size,
            "written": bundle.written,
            "refs": [[n.decode(), o.decode()] for n, o in bundle.refs]}
