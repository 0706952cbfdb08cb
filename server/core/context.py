"""One request's view of one repository: config, refs and objects, each read once, and
the leases on the packs it froze.

Everything here is blocking and runs in the server's thread pool. The answers built from it
live beside it: :mod:`.answers` (advertisements, ls-refs, object-info and their cache),
:mod:`.commands` (a v2 command), :mod:`.fetch` (the fetch plan and the want policy) and
:mod:`.framing` (a fetch response up to its pack).
"""

from __future__ import annotations

import binascii
import hashlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gitspout.protocol.errors import ClientError
from gitspout.protocol.refs import HeadInfo, Ref, ref_is_hidden

from ..graph.commits import CommitSource
from ..packgen import ObjectAccess, PackCaches
from ..packgen.access import DEFAULT_COLD_WALK_ENTRIES, objects_where
from ..store.bigobjects import ByteBudget
from ..store.errors import StorageError
from ..store.fscache import DirCache, Listing
from ..store.fsops import FsOps
from ..store.namespaces import namespaced
from ..store.objformat import HASH_LEN
from ..store.odb import ObjectSnapshot, PackRegistry
from ..store.refcache import TIP_BYTES
from ..store.refs import read_ref_snapshot
from ..store.refsnapshot import RefSnapshot
from ..store.registry import PEELED_COST
from ..store.repos import Repo, RepoConfig
from .bigblobs import BlobUriPolicy

__all__ = ["RequestContext", "small_prefixes", "KEY_PREFIX_BYTES"]


def _read_refs(gitdir: str, *args: Any) -> RefSnapshot:
    """read_ref_snapshot; a damaged packed-refs is logged with its path (app/errors.py)."""
    try:
        return read_ref_snapshot(gitdir, *args)
    except StorageError as exc:
        if exc.kind == "packed-refs" and exc.path is None:
            exc.path = os.path.join(gitdir, "packed-refs")
        raise


def parse_shallow_file(raw: bytes, hash_len: int) -> frozenset[bytes]:
    """The ids of a ``shallow`` file; a line that is no id is a storage fault (C git
    dies on it: "bad shallow line")."""
    out = set()
    for line in raw.split():
        if len(line) != 2 * hash_len:
            raise StorageError(f"bad shallow line {line[:80]!r}", kind="shallow",
                               what="corrupt shallow file")
        try:
            out.add(binascii.unhexlify(line))
        except binascii.Error:
            raise StorageError(f"bad shallow line {line[:80]!r}", kind="shallow",
                               what="corrupt shallow file") from None
    return frozenset(out)


KEY_PREFIX_BYTES = 4096


def small_prefixes(prefixes: Sequence[bytes]) -> bool:
    """Can ``prefixes`` be part of a key kept across requests? A client's ls-refs sends a
    few short ones; 950 of 65 KB each (a 73 KB gzip body) were kept in the keys of the
    answer caches, whose budgets count values: 62 MB each, held after the request."""
    return sum(map(len, prefixes)) <= KEY_PREFIX_BYTES


@dataclass
class RequestContext:
    """One request's view of one repository: config, refs and objects, each read once.

    ``caches`` and ``inflate`` are the process's (the server builds them once); without
    them the request has caches of its own and no budget of large objects beyond one."""

    repo: Repo
    registry: PackRegistry
    agent: bytes
    dirs: DirCache = field(default_factory=lambda: DirCache(enabled=False))
    fs: FsOps = field(default_factory=FsOps)
    # --cold-walk-pack-entries (packgen/choose.py): 0 never walks to spare a reverse index
    cold_walk_entries: int = DEFAULT_COLD_WALK_ENTRIES
    namespace: bytes = b""  # GIT_NAMESPACE the URL serves (app/namespaces.py); b"": none
    caches: PackCaches | None = None
    inflate: ByteBudget | None = None
    # gitspout's own bundles (app/bundles.py): the bundle list this client may be given
    # (None: none), asked only by a bundle-uri command. Set: the capability is advertised.
    bundle_offer: Callable[[RequestContext], list[tuple[bytes, bytes]] | None] | None = None
    # --blob-uri-threshold (core/bigblobs.py): large blobs as packfile URIs; None: never
    blob_uris: BlobUriPolicy | None = None
    _config: RepoConfig | None = None
    _refs: RefSnapshot | None = None
    _odb: ObjectSnapshot | None = None
    _src: CommitSource | None = None
    _grafts: frozenset[bytes] | None = None
    _top: Listing | None = None  # the git directory's listing, taken with the config
    _prefixed: dict[tuple[bytes, ...], RefSnapshot] = field(default_factory=dict)
    _tips: frozenset[bytes] | None = None
    _tips_key: tuple[object, ...] = ()
    _visible: tuple[HeadInfo | None, list[Ref]] | None = None
    # When the request started (time.monotonic_ns): a ref read begun later is fresh enough
    arrived: int = field(default_factory=time.monotonic_ns)

    # Who still uses this context: the handler, and each pool job running for it. The
    # packs the request froze are leased until the last of them lets go (store/registry.py).
    _holds: int = 1
    _closed: bool = False
    _holds_lock: threading.Lock = field(default_factory=threading.Lock)

    def hold(self) -> None:
        """Pool work for this request starts (queued or running)."""
        with self._holds_lock:
            self._holds += 1

    def unhold(self) -> None:
        """A holder is done; the last one gives the object snapshot's leases back."""
        with self._holds_lock:
            self._holds -= 1
            last = self._holds == 0
        if last and self._odb is not None:
            self._odb.close()

    def close(self) -> None:
        """The handler is done (the pool may still be finishing work for it)."""
        with self._holds_lock:
            if self._closed:
                return
            self._closed = True
        self.unhold()

    @property
    def bundles_offered(self) -> bool:
        """gitspout's own bundles may be offered here (the capability is advertised)."""
        return self.bundle_offer is not None

    def own_bundle_list(self) -> list[tuple[bytes, bytes]]:
        """The list of gitspout's own bundles for this client (blocking; [] for none)."""
        return (self.bundle_offer(self) or []) if self.bundle_offer is not None else []

    # -- lazily read state ---------------------------------------------------

    @property
    def config(self) -> RepoConfig:
        if self._config is None:
            self._config, self._top = self.repo.config_and_listing(self.fs, self.dirs)
        return self._config

    @property
    def object_format(self) -> str:
        fmt = self.config.object_format
        if fmt not in HASH_LEN:
            raise ClientError(f"unsupported object format {fmt}", http_status=403)
        return fmt

    @property
    def hash_len(self) -> int:
        return HASH_LEN[self.object_format]

    @property
    def odb(self) -> ObjectSnapshot:
        if self._odb is None:
            self._odb = ObjectSnapshot(self.repo.objects_dir, self.hash_len, self.registry,
                                       self.fs, dirs=self.dirs)
        return self._odb

    @property
    def src(self) -> CommitSource:
        if self._src is None:
            grafts = self.grafts
            # C git reads no commit-graph in a shallow repository: its parents would
            # lead past the shallow commits.
            graph = None if grafts else self.odb.commit_graph()
            self._src = CommitSource(self.odb, graph, grafts)
        return self._src

    @property
    def pack_caches(self) -> PackCaches:
        """The caches of object sets (the process's, or this request's own)."""
        if self.caches is None:
            self.caches = PackCaches.create(self.registry)
        return self.caches

    def objects(self) -> ObjectAccess:
        """What a pack of this request is produced from (packgen)."""
        if self.inflate is None:
            self.inflate = ByteBudget()
        return ObjectAccess(self.odb, self.src, self.pack_caches, self.inflate,
                            self.cold_walk_entries)

    def fetch_state(self) -> tuple[object, ...] | None:
        """What the answer to a fetch depends on besides the request itself, as one value
        to compare (app/samefetch.py): the refs this request sees (their state, HEAD; a
        namespace's view), the config (hideRefs, uploadpack.*: by value), the shallow
        file's commits and the frozen pack set with the alternates'. Each is read once per
        request, so after a fetch is planned this costs no more reads. None when the refs
        came from a listing too recent to be trusted (a second change within its mtime
        tick would go unseen: store/fscache.py), or without cross-request caches."""
        snap = self.refs
        if not snap.cacheable:
            return None
        # Digests of the pack set and the shallow commits: an answer kept for later holds
        # a few bytes of each, not ~100 B per pack (what the keeper charges, samefetch.py).
        grafts = self.grafts
        return (snap.state, snap.head, self.config,
                hashlib.sha256(b"".join(sorted(grafts))).digest() if grafts else b"",
                hashlib.sha256(objects_where(self.odb)).digest(),
                self.blob_uris is None)  # capabilities depend on it (sideband-all, URIs)

    def exported(self) -> bool:
        """The repository holds ``git-daemon-export-ok`` (git-http-backend serves only such
        repositories unless GIT_HTTP_EXPORT_ALL): one look at the git directory's listing."""
        top = self.dirs.listing(self.fs, self.repo.gitdir)
        return top is not None and "git-daemon-export-ok" in top.names()

    @property
    def grafts(self) -> frozenset[bytes]:
        """The repository's own shallow commits (``$GIT_DIR/shallow``, one hex id a line),
        read once per request and once per version of the file (through the git
        directory's listing: git renames a new file into place)."""
        if self._grafts is None:
            _ = self.config  # the git directory's listing comes with it, taken first
            top = self._top
            raw = self.dirs.file(self.fs, os.path.join(self.repo.gitdir, "shallow"), top) \
                if top is not None and "shallow" in top.names() else None
            self._grafts = parse_shallow_file(raw or b"", self.hash_len)
        return self._grafts

    @property
    def refs(self) -> RefSnapshot:
        if self._refs is None:
            snap = self._snapshot(())
            if self.namespace:
                snap = namespaced(snap, self.namespace, self.config.hide_refs,
                                  self.repo.ref_cache if self.dirs.enabled else None)
            self._refs = snap
        return self._refs

    @property
    def all_refs(self) -> RefSnapshot:
        """Every ref of the repository, a namespace's view or not (:attr:`refs` in a
        namespace holds only that namespace's visible refs). For questions about what any
        ref holds, such as whether a tag object is an orphan."""
        return self._snapshot(()) if self.namespace else self.refs

    @property
    def hide_refs(self) -> tuple[bytes, ...]:
        """The hideRefs to apply to :attr:`refs`: none in a namespace, whose view holds
        only visible refs already (a ``^`` pattern needs the full name)."""
        return () if self.namespace else self.config.hide_refs

    def _snapshot(self, prefixes: tuple[bytes, ...]) -> RefSnapshot:
        """A snapshot of the refs under ``prefixes`` (all when empty), read for this
        request or shared with concurrent ones (RefCache.shared_read)."""
        cache = self.repo.ref_cache

        def read() -> RefSnapshot:
            return _read_refs(self.repo.gitdir, self.fs, self.dirs, cache, self.hash_len * 2,
                              self._peel, prefixes, self.config.ref_storage)

        return cache.shared_read(prefixes, self.arrived, read) if self.dirs.enabled else read()

    def _peel(self, oid_hex: bytes) -> bytes | None:
        """Peel a loose ref's value when it names a tag (cached process-wide by id)."""
        cache = self.registry.peeled
        hit = cache.get(oid_hex)
        if hit is not None:
            return hit or None  # b"": not a tag
        try:
            target, _, tags = self.src.peel(bytes.fromhex(oid_hex.decode("ascii")))
        except (StorageError, ValueError):  # a damaged object: advertised without peeling
            return None
        result = target.hex().encode() if tags else b""
        cache.put(oid_hex, result, PEELED_COST)
        return result or None

    def visible(self) -> tuple[HeadInfo | None, list[Ref]]:
        """HEAD and the visible refs as Ref objects, made once per request (at 100k refs
        that is 0.1 s: the hot paths use :meth:`tips`, :meth:`visible_ref` instead)."""
        if self._visible is None:
            self._visible = self.refs.visible(self.hide_refs)
        return self._visible

    def visible_ref(self, name: bytes) -> Ref | None:
        """The visible ref called ``name`` (``HEAD`` included), or None."""
        hide = list(self.hide_refs)
        if name == b"HEAD":
            head = self.refs.head
            if head.oid is None or (hide and ref_is_hidden(b"HEAD", hide)):
                return None
            return Ref(b"HEAD", head.oid)
        if hide and ref_is_hidden(name, hide):
            return None
        return self.refs.get(name)

    def visible_under(self, prefix: bytes) -> list[Ref]:
        """The visible refs whose names start with ``prefix``."""
        hide = list(self.hide_refs)
        refs = self.refs.select((prefix,))
        return [r for r in refs if not ref_is_hidden(r.name, hide)] if hide else refs

    def refs_with_prefixes(self, prefixes: Sequence[bytes]) -> RefSnapshot:
        """A snapshot of just the refs under ``prefixes`` (and HEAD): ref-prefix answered
        without reading every ref directory. Read once per request. Prefixes that take in
        all of ``refs/`` (a mirror clone's) read every ref: that read is the one a fetch
        makes, and so may be shared with one (RefCache.shared_read). So do prefixes too
        large to be part of a cache key (:func:`small_prefixes`)."""
        if not prefixes or self._refs is not None or self.namespace \
                or any(b"refs/".startswith(p) for p in prefixes) \
                or not small_prefixes(prefixes):
            return self.refs
        key = tuple(prefixes)
        snap = self._prefixed.get(key)
        if snap is None:
            snap = self._prefixed[key] = self._snapshot(key)
        return snap

    def tips(self) -> frozenset[bytes]:
        """Binary ids of visible refs (and HEAD), the roots of what we may serve.

        Ref values are hex (as read and advertised); this is where they become binary, once
        per request: the want check, the shallow check and object-info all ask."""
        if self._tips is None:
            hide = self.hide_refs
            snap = self.refs
            # Keyed by content: the segments (immutable, compared by identity) and HEAD,
            # so a racy listing that read the same refs again finds it too.
            key = self._tips_key = (snap.segments, snap.head.oid, tuple(hide))
            cached = self.repo.ref_cache.tips.get(key)
            if cached is not None:
                self._tips = cached
                return cached
            oids = snap.visible_oids(hide)  # distinct, hex
            head = self.refs.head
            if head.oid is not None and not (hide and ref_is_hidden(b"HEAD", list(hide))):
                oids.add(head.oid)
            try:
                self._tips = frozenset(map(binascii.unhexlify, oids))
            except binascii.Error as exc:  # a loose ref's content that is not an id
                raise StorageError(f"a ref holds no object id: {exc}") from None
            self.repo.ref_cache.tips.put(key, self._tips, nbytes=TIP_BYTES * len(self._tips)
                                         + 8 * len(snap.segments) + 200)
        return self._tips

    def present_tips(self) -> set[bytes]:
        """The tips (:meth:`tips`) already found in the object store under this ref state,
        shared by the requests that see it; the want check adds to it. A ref keeps its
        object from being pruned, so a tip found once is there for as long as the ref
        state lasts (a repack may move it: reading it looks again)."""
        tips = self.tips()
        cache = self.repo.ref_cache.present
        found = cache.get(self._tips_key)
        if found is None:
            found = set()
            cache.put(self._tips_key, found, nbytes=TIP_BYTES * len(tips) + 200)
        return found
