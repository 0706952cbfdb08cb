"""One pack-cache directory shared by the workers of a master (``--workers``;
docs/operations.md "Workers"): one producer per key across the processes, readers in any.

A key's files in the shared directory:

- ``KEY.lock``: the producer holds an exclusive ``flock`` on it while it writes, and writes
  its pid in it. It goes with the key's pack (:func:`unpublish`), removed by whoever holds
  it exclusively; so a process that took a lock checks that the file it locked is still
  the one at the path, and takes it again if not (:func:`_open_locked`): else two could
  hold "the" lock on two inodes at once. Kept forever, one was left per key ever fetched
  (an incremental fetch of other haves is another key), beyond every size limit.
- ``KEY.part``: the pack being written, framed as side-band-64k packets (packcache.py; read
  by the producer's own readers, in its process).
- ``KEY.meta`` then ``KEY.pack``: written once complete, in this order and each atomically
  (``rename``), so a ``KEY.pack`` always has its ``KEY.meta``: the file's size, the pack's
  own, the object count and the progress lines with their file offsets, which every
  reader interleaves as its own.

A worker that misses in its own index *claims* the key: a complete pack is adopted (a hit);
an exclusive lock taken makes it the producer; a lock held elsewhere makes it wait (with
keepalives to its client) for a shared lock, and then adopt the pack, or, if the producer
died or gave up (no ``KEY.pack``), send the pack from its own stream. The producer's
worker counts the file in its ``--pack-cache-size`` share (size/N each: the directory
holds at most the setting in all) and evicts it (its TTL, its cap; the master removes a
dead worker's, published or not: :func:`forget_producer`);
an adopting worker keeps only an index entry, never removes the file, and a reader that
finds it gone goes on without the cache (packcache.py).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .cachedir import unlink_quietly

__all__ = ["Claim", "claim", "publish", "release", "wait_for_producer", "pack_path",
           "forget_producer"]

log = logging.getLogger("gitspout")

POLL = 0.02  # seconds between two tries of the shared lock while another worker produces


@dataclass
class Claim:
    """What a claim found: ``adopt`` (``meta`` of a complete pack), ``produce`` (``lock``
    is this process's exclusive lock: write ``part``) or ``wait``."""

    kind: str
    part: str = ""
    lock: int = -1
    meta: dict[str, Any] | None = None


def _base(directory: str, key: bytes) -> str:
    return os.path.join(directory, key.hex()[:40])


def pack_path(directory: str, key: bytes) -> str:
    return _base(directory, key) + ".pack"


def read_meta(directory: str, key: bytes) -> dict[str, Any] | None:
    """The metadata of the complete pack of ``key``, or None when there is none."""
    if not os.path.exists(pack_path(directory, key)):
        return None
    try:
        with open(_base(directory, key) + ".meta") as fh:
            meta: dict[str, Any] = json.load(fh)
        return meta
    except (OSError, ValueError):
        return None


def _open_locked(path: str, how: int, create: bool = True) -> int:
    """A descriptor of the lock file ``path`` holding ``flock(how)``, of the file that is at
    ``path`` now (module doc: a lock file is removed by whoever holds it exclusively, so a
    lock taken on one unlinked since is let go and taken on the new one). Raises
    BlockingIOError when held elsewhere (``LOCK_NB``), FileNotFoundError without
    ``create`` when there is none."""
    for _ in range(64):
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o600)
        try:
            fcntl.flock(fd, how)
            mine = os.fstat(fd)
            try:
                now = os.stat(path)
            except FileNotFoundError:
                now = None
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_ino, now.st_dev) == (mine.st_ino, mine.st_dev):
            return fd
        os.close(fd)
        if not create:
            raise FileNotFoundError(path)
    raise OSError(errno.EAGAIN, f"{path}: the lock file was replaced again and again")


def _remove_lock(path: str, held: int = -1) -> None:
    """Remove the lock file ``path``: under ``held`` (this process's exclusive lock on it),
    or under one taken now if nobody holds it (a producer or a waiter: it stays then,
    and goes with the key's next pack)."""
    if held >= 0:
        unlink_quietly(path)
        return
    try:
        fd = _open_locked(path, fcntl.LOCK_EX | fcntl.LOCK_NB, create=False)
    except OSError:
        return
    try:
        unlink_quietly(path)
    finally:
        os.close(fd)


def claim(directory: str, key: bytes) -> Claim:
    """Adopt, produce or wait (module doc). OSError when the directory is unusable."""
    meta = read_meta(directory, key)
    if meta is not None:
        return Claim("adopt", meta=meta)
    base = _base(directory, key)
    try:
        fd = _open_locked(base + ".lock", fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return Claim("wait")
        raise
    meta = read_meta(directory, key)  # completed between our look and our lock
    if meta is not None:
        os.close(fd)
        return Claim("adopt", meta=meta)
    part = base + ".part"
    try:
        os.ftruncate(fd, 0)  # whose .part it is, for forget_producer
        os.pwrite(fd, b"%d\n" % os.getpid(), 0)
        try:
            os.unlink(part)  # left by a producer that died: the lock is ours now
        except FileNotFoundError:
            pass
        os.close(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError:
        os.close(fd)
        raise
    return Claim("produce", part=part, lock=fd)


def publish(directory: str, key: bytes, part: str, meta: dict[str, Any]) -> str:
    """The producer is done: ``KEY.meta``, then ``KEY.pack``; the pack's new path."""
    base = _base(directory, key)
    tmp = f"{base}.meta.{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(meta, fh)
    os.replace(tmp, base + ".meta")
    os.replace(part, base + ".pack")
    return base + ".pack"


def release(lock: int) -> None:
    """The producer's lock goes (closing the descriptor releases the flock)."""
    if lock >= 0:
        os.close(lock)


def unpublish(path: str, held: int = -1) -> None:
    """An evicted pack: its ``.pack`` (or ``.part``), its ``.meta`` and its lock file go
    (``held``: this process's exclusive lock on it, if it has it still)."""
    root, _ext = os.path.splitext(path)
    for p in (root + ".pack", root + ".meta", root + ".part"):
        if p == path or p.endswith(".meta"):
            unlink_quietly(p)
    _remove_lock(root + ".lock", held)


def forget_producer(directory: str, pid: int) -> int:
    """A worker died: the packs it published go (nobody else would ever evict them), and
    so do the files it left unfinished, outside every worker's share: a ``KEY.part``
    whose lock names it and is free (no producer since), a ``KEY.meta.PID`` of its pid.
    Readers that have them open keep reading. How many packs and files."""
    removed = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        path = os.path.join(directory, name)
        if name.endswith(".part"):
            removed += _forget_part(path[:-len(".part")], pid)
        elif name.endswith(f".meta.{pid}"):
            try:
                os.unlink(path)
            except OSError:
                continue
            removed += 1
        elif name.endswith(".meta"):
            try:
                with open(path) as fh:
                    owner = json.load(fh).get("pid")
            except (OSError, ValueError, AttributeError):
                continue
            if owner == pid:
                unpublish(path[:-len(".meta")] + ".pack")
                removed += 1
    if removed:
        log.info("pack cache: removed %d files of worker pid %d", removed, pid)
    return removed


def _forget_part(base: str, pid: int) -> int:
    """Remove ``base.part`` if ``pid`` wrote it (its lock names it) and nobody holds the
    lock (a producer that claimed the key since wrote its own pid); 1 if removed."""
    try:  # released by the close
        fd = _open_locked(base + ".lock", fcntl.LOCK_EX | fcntl.LOCK_NB, create=False)
    except OSError:  # held (a producer, or a waiter for a moment), or gone already
        return 0
    try:
        if os.pread(fd, 32, 0).strip() != b"%d" % pid:
            return 0
        os.unlink(base + ".part")
        _remove_lock(base + ".lock", fd)
        return 1
    except OSError:
        return 0
    finally:
        os.close(fd)


async def wait_for_producer(directory: str, key: bytes, keepalive: float,
                            send_keepalive: Callable[[], Awaitable[None]]) -> dict[str, Any] | None:
    """Wait until the producer in another worker lets its lock go, sending a keepalive
    every ``keepalive`` seconds; the metadata of the pack it completed, or None (it died
    or gave up: the caller sends the pack itself)."""
    path = _base(directory, key) + ".lock"
    loop = asyncio.get_running_loop()
    quiet_since = loop.time()
    while True:
        try:  # no lock file: the producer's pack was evicted with it, or it failed
            os.close(_open_locked(path, fcntl.LOCK_SH | fcntl.LOCK_NB, create=False))
            break
        except BlockingIOError:
            pass
        except FileNotFoundError:
            break
        if keepalive > 0 and loop.time() - quiet_since >= keepalive:
            await send_keepalive()
            quiet_since = loop.time()
        await asyncio.sleep(POLL)
    return read_meta(directory, key)
