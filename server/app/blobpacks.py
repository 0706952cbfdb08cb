"""One-blob packs of gitspout's own, for large blobs sent as packfile URIs
(``--blob-uri-threshold``, ``--blob-uri-size``; core/bigblobs.py decides which blobs).

A blob's pack is written once, in the pool, the first time a fetch leaves the blob out:
the pack header, the blob's entry header and its compressed data copied as stored (never
inflated), and the SHA-1 trailer that the packfile-uris line names as ``<pack-hash>``. It
is kept in a directory of this process's own, or of the master's when ``--workers``
share it (the repository directory is never written), keyed by content:

- ``BLOB-SUM.pack``: the pack (``SUM`` its checksum), renamed whole into place;
- ``BLOB.id``: ``SUM``, written after the pack; its mtime is when the blob was last
  listed, so a pack listed within :data:`GRACE` is never evicted under a client that
  was told to download it;
- ``write.lock``: one writer at a time across processes (``flock``); writes are rare.

The data copied is inflated and hashed on the way (:class:`_BlobCheck`): a damaged copy
is refused (the fetch fails with the repository's storage fault, as C git's would), never
kept, since the pack would outlive the repository's repair and serve other repositories
holding the same blob.

Served at ``<repo>/gitspout-blobpack/BLOB-SUM.pack`` with ``Range`` and ``sendfile``
(filesend.py), only to a request whose visible refs reach the blob (I7, decided by
core/blobaccess.py): 404 otherwise, and for a name that is not one. A pack this process
does not hold (another replica listed it, or this one before a restart) is written on
request from the repository, and served if it is the one named: 404 if not.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import tempfile
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..core.bigblobs import BlobUriPolicy, LargeBlob, large_blobs
from ..core.blobaccess import may_have_blob
from ..core.context import RequestContext
from .bundles import OffloadMetrics
from .cachedir import make_directory, reclaim_orphans, remove_files, unlink_quietly
from .config import Config
from .filesend import send_file

__all__ = ["BlobPackStore", "BLOBPACK_ROUTE", "serve_blob_pack"]

log = logging.getLogger("gitspout")

BLOBPACK_ROUTE = "/gitspout-blobpack/"  # <repo>/gitspout-blobpack/<blob>-<sum>.pack
NAME = re.compile(r"([0-9a-f]{40})-([0-9a-f]{40})\.pack")
GRACE = 3600.0  # seconds a listed pack is kept whatever the cap (a client downloads it)
COPY = 1 << 20  # bytes copied from the repository's pack at a time
INFLATE_PIECE = 1 << 20  # bytes of a blob inflated at a time, to check it (_BlobCheck)
WRITE_WAIT = 30.0  # seconds a download of a pack not held waits for another's write


class BlobPackStore:
    """The one-blob packs of every repository (module doc). Blocking: in the pool."""

    def __init__(self, cfg: Config, metrics: OffloadMetrics, shared: str = "") -> None:
        self.cfg = cfg
        self.metrics = metrics
        self._dir_lock = -1
        if shared:  # the master's (workers.py)
            self.dir = shared
        else:
            base = blob_base(cfg)
            os.makedirs(base, exist_ok=True)
            reclaim_orphans(base)
            self.dir, self._dir_lock = make_directory(base)

    def policy(self, base_url: str, repo_path: str) -> BlobUriPolicy:
        """What a request reached at ``base_url`` may be offered (core/bigblobs.py)."""
        prefix = f"{base_url}/{repo_path.strip('/')}{BLOBPACK_ROUTE}"

        def line(blob: LargeBlob) -> bytes | None:
            checksum = self.keep(blob)
            if checksum is None:
                return None
            return f"{checksum} {prefix}{blob.oid.hex()}-{checksum}.pack".encode()

        return BlobUriPolicy(self.cfg.blob_uri_threshold, self.cfg.blob_uri_size,
                             base_url.split(":", 1)[0].encode(), line)

    # -- writing ---------------------------------------------------------------

    def keep(self, blob: LargeBlob, wait: float = 0.0) -> str | None:
        """The checksum of ``blob``'s pack, written now if need be; None when it does not
        fit under --blob-uri-size, or another blob pack is being written (its blob then
        goes in the fetch's pack: a fetch never waits for another's copy). A download of a
        pack not held waits for the other writer up to ``wait`` seconds."""
        hexid = blob.oid.hex()
        found = self._listed(hexid)
        if found is not None:
            return found
        fd = os.open(os.path.join(self.dir, "write.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if not _lock_within(fd, wait):  # one writer at a time (and its
                # --blob-uri-size accounting); a fetch deciding meanwhile keeps the blob
                # in its own pack
                log.debug("blob %s kept in the pack: another blob pack is being written", hexid)
                return None
            found = self._listed(hexid)
            if found is not None:
                return found
            if not self._room(blob.end - blob.offset + 64):
                log.info("blob %s not offloaded: --blob-uri-size is full", hexid)
                return None
            return self._write(blob, hexid)
        finally:
            os.close(fd)

    def _listed(self, hexid: str, renew: bool = True) -> str | None:
        """The checksum of a kept pack of the blob, its listing time renewed (``renew``:
        it is being listed to a client)."""
        idpath = os.path.join(self.dir, hexid + ".id")
        try:
            with open(idpath) as fh:
                checksum = fh.read().strip()
            if not NAME.fullmatch(f"{hexid}-{checksum}.pack") or not os.path.exists(
                    os.path.join(self.dir, f"{hexid}-{checksum}.pack")):
                return None
            if renew:
                os.utime(idpath)
        except FileNotFoundError:
            return None
        return checksum

    def _write(self, blob: LargeBlob, hexid: str) -> str:
        pack = blob.pack
        start = pack.read_header(blob.offset).data_offset
        head = b"PACK" + (2).to_bytes(4, "big") + (1).to_bytes(4, "big") + _entry_header(blob.size)
        digest = hashlib.sha1(head)
        check = _BlobCheck(blob)
        tmp = os.path.join(self.dir, f"{hexid}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as fh:
                fh.write(head)
                at = start
                while at < blob.end:
                    data = pack.read_raw(at, min(blob.end, at + COPY))
                    if not data:
                        raise pack.corrupt(f"truncated entry at {blob.offset}")
                    check.feed(data)
                    digest.update(data)
                    fh.write(data)
                    at += len(data)
                fault = check.fault()
                if fault is not None:
                    raise pack.corrupt(f"blob {hexid} at {blob.offset}: {fault}")
                checksum = digest.digest()
                fh.write(checksum)
            name = f"{hexid}-{checksum.hex()}.pack"
            os.replace(tmp, os.path.join(self.dir, name))
        except BaseException:
            unlink_quietly(tmp)
            raise
        idtmp = os.path.join(self.dir, f"{hexid}.id.{os.getpid()}")
        with open(idtmp, "w") as fh:
            fh.write(checksum.hex())
        os.replace(idtmp, os.path.join(self.dir, hexid + ".id"))
        size = len(head) + (blob.end - start) + len(checksum)
        self.metrics.blob_packs_written.inc()
        self.metrics.blob_pack_bytes_written.inc(size)
        return checksum.hex()

    def _room(self, need: int) -> bool:
        """Make room for ``need`` bytes under --blob-uri-size: packs least recently listed
        first, none listed within GRACE. False when there is not enough."""
        held = []
        total = 0
        now = time.time()
        for entry in os.scandir(self.dir):
            m = NAME.fullmatch(entry.name)
            if m is None:
                continue
            try:
                size = entry.stat().st_size
                listed = os.stat(os.path.join(self.dir, m.group(1) + ".id")).st_mtime
            except FileNotFoundError:
                listed = 0.0
            total += size
            held.append((listed, size, entry.path, m.group(1)))
        cap = self.cfg.blob_uri_size
        for listed, size, path, hexid in sorted(held):
            if total + need <= cap or listed > now - GRACE:
                break
            unlink_quietly(os.path.join(self.dir, hexid + ".id"))
            unlink_quietly(path)
            total -= size
        return total + need <= cap

    # -- serving -----------------------------------------------------------------

    def file_for(self, ctx: RequestContext, name: str) -> str | None:
        """The path of the pack called ``name``, if this server holds it and this request
        may have its blob (core/blobaccess.py; blocking)."""
        m = NAME.fullmatch(name)
        if m is None:
            return None
        path = os.path.join(self.dir, name)
        oid = bytes.fromhex(m.group(1))
        if os.path.exists(path):
            return path if may_have_blob(ctx, oid) else None
        if not may_have_blob(ctx, oid) or not self._write_named(ctx, oid, m.group(2)):
            return None
        return path

    def _write_named(self, ctx: RequestContext, oid: bytes, checksum: str) -> bool:
        """A pack this process does not hold: another replica listed it (a fleet without
        affinity for these URLs), or this one before a restart. It is written now from
        the repository, as the lister wrote it: True when that gives the named pack (the
        blob is stored as the lister saw it)."""
        if ctx.object_format != "sha1":
            return False
        held = self._listed(oid.hex(), renew=False)
        if held is not None:  # another pack of the blob (stored otherwise): not this one,
            return held == checksum  # and a wrong name renews nothing
        policy = BlobUriPolicy(self.cfg.blob_uri_threshold, self.cfg.blob_uri_size, b"",
                               lambda _blob: None)
        blob = large_blobs(ctx.objects().packs(), policy).get(oid)
        return blob is not None and self.keep(blob, wait=WRITE_WAIT) == checksum

    def close(self) -> None:
        """Remove every file of a directory of this process's own."""
        if self._dir_lock < 0:
            return
        remove_files(self.dir)
        os.close(self._dir_lock)


def _lock_within(fd: int, wait: float) -> bool:
    """Take ``flock(LOCK_EX)`` on ``fd`` within ``wait`` seconds (0: only if free now)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)  # in the pool: a write of at most --blob-uri-size


def blob_base(cfg: Config) -> str:
    """Where blob-pack directories are made: beside the bundles'."""
    return os.path.join(cfg.bundle_dir or tempfile.gettempdir(), "gitspout-blobpacks")


class _BlobCheck:
    """Inflates a blob's stored data as it is copied and hashes what comes out: the pack
    is kept, and shared by every repository holding the blob, under the blob's id, so a
    damaged copy would outlive the repository's repair (C git's pack-objects checks the
    CRC of what it reuses; this checks the object itself)."""

    def __init__(self, blob: LargeBlob) -> None:
        self.blob = blob
        self.inflater = zlib.decompressobj()
        self.hash = hashlib.new("sha1" if len(blob.oid) == 20 else "sha256",
                                b"blob %d\0" % blob.size)
        self.size = 0
        self.error: str | None = None

    def feed(self, data: bytes) -> None:
        if self.error is not None:
            return
        d = self.inflater
        try:  # in bounded pieces: 1 MiB of a file of zeros inflates to 1 GiB
            out = d.decompress(data, INFLATE_PIECE)
            while True:
                self.size += len(out)
                self.hash.update(out)
                if not d.unconsumed_tail or d.eof:
                    break
                out = d.decompress(d.unconsumed_tail, INFLATE_PIECE)
        except zlib.error as exc:
            self.error = f"does not inflate ({exc})"

    def fault(self) -> str | None:
        """What is wrong with the data fed, or None."""
        if self.error is not None:
            return self.error
        if not self.inflater.eof:
            return "compressed data ends early"
        if self.size != self.blob.size:
            return f"inflates to {self.size} bytes, not {self.blob.size}"
        if self.hash.digest() != self.blob.oid:
            return "its content does not hash to its id"
        return None


def _entry_header(size: int) -> bytes:
    """A blob entry's type and size varint (gitformat-pack "Object entries")."""
    out = bytearray([(3 << 4) | (size & 0x0F)])
    size >>= 4
    while size:
        out[-1] |= 0x80
        out.append(size & 0x7F)
        size >>= 7
    return bytes(out)


async def serve_blob_pack(store: BlobPackStore, ctx: RequestContext, name: str,
                          request: web.Request,
                          run: Callable[..., Awaitable[Any]]) -> web.StreamResponse:
    """``GET <repo>/gitspout-blobpack/<name>``: the pack, with Range and sendfile; 404 when
    it is no pack of ours or this request may not have its blob."""
    path = await run(store.file_for, ctx, name)
    try:
        if path is None:
            raise FileNotFoundError(name)
        resp = await send_file(request, path)
    except FileNotFoundError:
        store.metrics.blob_pack_requests.labels("missing").inc()
        return web.Response(status=404, text="no such pack\n")
    store.metrics.blob_pack_requests.labels("served").inc()
    if resp.content_length and request.method != "HEAD":
        store.metrics.packfile_uri_bytes.inc(resp.content_length)
    return resp
