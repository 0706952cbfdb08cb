"""The core of one upload-pack request, independent of HTTP.

Everything here is blocking and runs in the server's thread pool: it reads the repository
through one :class:`RefSnapshot` and one :class:`ObjectSnapshot` per request and returns
plain values (payload lists, a :class:`FetchPlan`) for the async writer in ``http.py``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from gitspout.protocol.advertise import format_v0_capabilities, iter_v0_advertisement
from gitspout.protocol.capabilities import V2Features, iter_v2_capabilities
from gitspout.protocol.errors import ClientError, Refusal
from gitspout.protocol.fetch_request import FetchRequest
from gitspout.protocol.filters import (
    FilterSpec,
    SparseOid,
    TreeDepth,
    filter_config_name,
    iter_filter_leaves,
)
from gitspout.protocol.ls_refs import LsRefsRequest, iter_ls_refs
from gitspout.protocol.negotiate import V0Answer, V2Answer, negotiate_v0, negotiate_v2
from gitspout.protocol.object_info import ObjectInfoRequest, iter_object_info
from gitspout.protocol.oid import zero_oid
from gitspout.protocol.pktline import PktBuffer
from gitspout.protocol.refs import HeadInfo, Ref, ref_matches_prefixes

from ..graph.commits import CommitSource
from ..graph.negotiation import HaveTracker
from ..graph.reachability import check_wants, reachable_subset
from ..graph.shallow import ShallowPlan, plan_shallow
from ..store.errors import StorageError
from ..store.fscache import DirCache
from ..store.fsops import FsOps
from ..store.objformat import HASH_LEN, OBJ_COMMIT
from ..store.odb import ObjectSnapshot, ObjectStoreError, PackRegistry
from ..store.refs import RefSnapshot, read_ref_snapshot
from ..store.registry import PEELED_COST
from ..store.repos import Repo, RepoConfig
from .stats import PackStats

__all__ = ["RequestContext", "FetchPlan", "plan_fetch"]

log = logging.getLogger("gitspout")
# transfer.advertiseSID: one id for this server process, like C git's trace2 session id.
SESSION_ID = f"gitspout-{os.getpid()}-{uuid.uuid4().hex[:12]}".encode()


@dataclass
class RequestContext:
    """One request's view of one repository: config, refs and objects, each read once."""

    repo: Repo
    registry: PackRegistry
    agent: bytes
    dirs: DirCache = field(default_factory=lambda: DirCache(enabled=False))
    fs: FsOps = field(default_factory=FsOps)
    phases: dict[str, float] = field(default_factory=dict)
    _config: RepoConfig | None = None
    _refs: RefSnapshot | None = None
    _odb: ObjectSnapshot | None = None
    _src: CommitSource | None = None
    pack_stats: PackStats | None = None
    _prefixed: dict[tuple[bytes, ...], RefSnapshot] = field(default_factory=dict)

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

    # -- lazily read state ---------------------------------------------------

    @property
    def config(self) -> RepoConfig:
        if self._config is None:
            self._config = self.repo.config(self.fs, self.dirs)
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
            self._src = CommitSource(self.odb, self.odb.commit_graph())
        return self._src

    @property
    def refs(self) -> RefSnapshot:
        if self._refs is None:
            self._refs = read_ref_snapshot(self.repo.gitdir, self.fs, self.dirs,
                                           self.repo.ref_cache, self.hash_len * 2, self._peel)
        return self._refs

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
        return self.refs.visible(self.config.hide_refs)

    def timed(self, phase: str, start: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + time.monotonic() - start

    # -- advertisement ---------------------------------------------------------

    def v0_capabilities(self, head: HeadInfo | None) -> bytes:
        cfg = self.config
        return format_v0_capabilities(
            object_format=self.object_format.encode(),
            agent=self.agent,
            head_target=head.target if head is not None and head.oid is not None else None,
            allow_tip_sha1=cfg.allow_tip_sha1 or cfg.allow_any_sha1,
            # Every want is checked for reachability from visible refs whatever the
            # protocol version, so v0 clients may ask for any reachable object: that is
            # what partial-clone lazy fetches (blobs by id) need.
            allow_reachable_sha1=True,
            allow_filter=cfg.allow_filter,
            session_id=SESSION_ID if cfg.advertise_sid else None,
        )

    def v0_advertisement(self, version: int) -> Iterator[bytes]:
        head, refs = self.visible()
        caps = self.v0_capabilities(head)
        return iter_v0_advertisement(head, refs, caps, zero_oid(self.object_format), version)

    def v2_features(self) -> V2Features:
        cfg = self.config
        return V2Features(
            agent=self.agent,
            object_format=self.object_format.encode(),
            allow_filter=cfg.allow_filter,
            allow_ref_in_want=cfg.allow_ref_in_want,
            allow_sideband_all=cfg.allow_sideband_all,
            advertise_unborn=cfg.unborn == "advertise",
            session_id=SESSION_ID if cfg.advertise_sid else None,
        )

    def v2_capabilities(self) -> Iterator[bytes]:
        return iter_v2_capabilities(self.v2_features())

    def ls_refs(self, req: LsRefsRequest) -> Iterator[bytes]:
        unborn = req.unborn and self.config.unborn != "ignore"
        snap = self.refs_with_prefixes(req.prefixes)
        head, refs = snap.visible(self.config.hide_refs)
        if req.prefixes and not ref_matches_prefixes(b"HEAD", req.prefixes):
            head = None
        if req.prefixes and snap.complete:
            refs = [r for r in refs if ref_matches_prefixes(r.name, req.prefixes)]
        # The snapshot holds only refs under the prefixes: no need to test them again.
        return iter_ls_refs(LsRefsRequest(req.peel, req.symrefs, unborn), head, refs)

    def refs_with_prefixes(self, prefixes: Sequence[bytes]) -> RefSnapshot:
        """A snapshot of just the refs under ``prefixes`` (and HEAD): ref-prefix answered
        without reading every ref directory. Read once per request."""
        if not prefixes or self._refs is not None:
            return self.refs
        key = tuple(prefixes)
        snap = self._prefixed.get(key)
        if snap is None:
            snap = self._prefixed[key] = read_ref_snapshot(
                self.repo.gitdir, self.fs, self.dirs, self.repo.ref_cache, self.hash_len * 2,
                self._peel, prefixes)
        return snap

    def encoded(self, kind: tuple[object, ...], payloads: Callable[[], Iterable[bytes]],
                preamble: Sequence[bytes] = ()) -> list[bytes]:
        """The response body as 32 KiB chunks, kept per ref state and config: a repeated
        advertisement of an unchanged repository costs its validation and its writes."""
        _ = self.config  # read first: the key names the config this answer depends on
        key = (kind, self.refs_state(kind), self.repo.config_key())
        # Nothing is put while the cross-request cache is off: the lookup is then a miss.
        hit = self.repo.ref_cache.encoded.get(key)
        if hit is not None:
            return hit
        buf = PktBuffer()
        chunks: list[bytes] = []
        for payload in preamble:
            _keep(chunks, buf.add(payload))
        if preamble:
            _keep(chunks, buf.add_flush())
        for payload in payloads():
            _keep(chunks, buf.add(payload))
        _keep(chunks, buf.add_flush())
        _keep(chunks, buf.take())
        if self.dirs.enabled and self.refs_cacheable(kind):
            self.repo.ref_cache.encoded.put(key, chunks,
                                            nbytes=sum(len(c) + 40 for c in chunks))
        return chunks

    def refs_state(self, kind: tuple[object, ...]) -> tuple[object, ...]:
        prefixes = kind[-1] if kind and isinstance(kind[-1], tuple) else ()
        snap = self.refs_with_prefixes(prefixes)  # type: ignore[arg-type]
        return snap.state

    def refs_cacheable(self, kind: tuple[object, ...]) -> bool:
        prefixes = kind[-1] if kind and isinstance(kind[-1], tuple) else ()
        return self.refs_with_prefixes(prefixes).cacheable  # type: ignore[arg-type]

    def object_info(self, req: ObjectInfoRequest) -> list[bytes]:
        oids = [bytes.fromhex(o.decode()) for o in req.oids]
        allowed = self._reachable_subset(oids)
        sizes = []
        for hex_oid, oid in zip(req.oids, oids, strict=True):
            found = self.odb.object_size(oid) if oid in allowed else None
            sizes.append((hex_oid, found[1] if found else None))
        return list(iter_object_info(req, sizes))

    def _reachable_subset(self, oids: Sequence[bytes]) -> set[bytes]:
        if self.config.allow_any_sha1:
            return set(oids)
        return reachable_subset(self.src, oids, self.tips(), self.registry.reach_cache)

    def tips(self) -> set[bytes]:
        """Binary ids of visible refs (and HEAD), the roots of what we may serve."""
        head, refs = self.visible()
        tips = {bytes.fromhex(r.oid.decode()) for r in refs}
        if head is not None and head.oid is not None:
            tips.add(bytes.fromhex(head.oid.decode()))
        return tips


def _keep(chunks: list[bytes], chunk: bytes | None) -> None:
    if chunk:
        chunks.append(chunk)


@dataclass
class FetchPlan:
    """Everything decided before the response starts."""

    req: FetchRequest
    wants: list[bytes]
    shallow: ShallowPlan
    v0: V0Answer | None = None
    v2: V2Answer | None = None
    wanted_refs: list[tuple[bytes, bytes]] = field(default_factory=list)
    common: list[bytes] = field(default_factory=list)

    @property
    def send_pack(self) -> bool:
        if self.v0 is not None:
            return self.v0.send_pack
        return self.v2 is not None and self.v2.send_pack


def _check_filter(cfg: RepoConfig, spec: FilterSpec | None) -> None:
    if spec is None:
        return
    for leaf in [spec, *iter_filter_leaves(spec)]:
        name = filter_config_name(leaf)
        if isinstance(leaf, SparseOid):
            raise Refusal("filter 'sparse:oid' not supported by this server")
        allowed = cfg.filter_allow.get(name, cfg.filter_allow_default)
        if not allowed:
            raise Refusal(f"filter '{name}' not supported")
        if isinstance(leaf, TreeDepth) and cfg.tree_filter_max_depth is not None:
            if leaf.depth > cfg.tree_filter_max_depth:
                raise Refusal(
                    f"tree filter allows max depth {cfg.tree_filter_max_depth}, "
                    f"but got {leaf.depth}")


def _expand_ref(name: bytes, refs: dict[bytes, Ref]) -> Ref:
    """refs.c expand_ref's rules (the dwim a client may lean on for deepen-not)."""
    rules = [b"%s", b"refs/%s", b"refs/tags/%s", b"refs/heads/%s", b"refs/remotes/%s",
             b"refs/remotes/%s/HEAD"]
    found = [refs[r % name] for r in rules if (r % name) in refs]
    if len(found) > 1 and len({f.oid for f in found}) > 1:
        raise Refusal(f"git upload-pack: ambiguous deepen-not: {name.decode('utf-8', 'replace')}")
    if not found:
        raise Refusal(f"git upload-pack: deepen-not is not a ref: {name.decode('utf-8', 'replace')}")
    return found[0]


def plan_fetch(ctx: RequestContext, req: FetchRequest) -> FetchPlan:
    """Validate and decide (blocking). Raises :class:`Refusal` to refuse in-band."""
    start = time.monotonic()
    cfg = ctx.config
    if req.filter is not None:
        if not cfg.allow_filter:
            raise Refusal("git upload-pack: filtering capability not negotiated")
        _check_filter(cfg, req.filter)
    head, refs = ctx.visible()
    by_name = {r.name: r for r in refs}
    wants = [bytes.fromhex(w.decode()) for w in req.wants]
    wanted_refs: list[tuple[bytes, bytes]] = []
    if head is not None and head.oid is not None:
        by_name.setdefault(b"HEAD", Ref(b"HEAD", head.oid))
    for name in req.want_refs:
        ref = by_name.get(name)
        if ref is None:
            raise Refusal(f"unknown ref {name.decode('utf-8', 'replace')}")
        wanted_refs.append((name, ref.oid))
        wants.append(bytes.fromhex(ref.oid.decode()))
    _check_want_policy(ctx, wants)
    src = ctx.src
    client_shallows = _known_commits(ctx, req.shallows)
    deepen_not = [bytes.fromhex(_expand_ref(n, by_name).oid.decode()) for n in req.deepen_not]
    try:
        shallow = plan_shallow(src, req, wants, client_shallows, deepen_not)
    except ObjectStoreError as exc:
        raise Refusal(f"git upload-pack: {exc}") from None
    tracker = HaveTracker(src, wants + list(shallow.extra_wants))
    plan = FetchPlan(req, wants, shallow, wanted_refs=wanted_refs)
    if req.version == 2:
        plan.v2 = negotiate_v2(req, tracker)
    else:
        plan.v0 = negotiate_v0(req, tracker)
    plan.common = list(tracker.common)
    ctx.timed("negotiate", start)
    return plan


def _known_commits(ctx: RequestContext, shallows: Sequence[bytes]) -> list[bytes]:
    """The client's shallow lines that we may act on: commits we have that are reachable
    from a visible ref. The others are ignored, as upload-pack ignores unknown ones.

    A shallow commit is unshallowed by deepening, and its parents (with their trees and
    blobs) are then sent: a shallow line naming a commit reachable only from a hidden ref
    would be a way round the want check (ARCHITECTURE.md, "one reachability rule"). So the
    rule applied to wants applies here too, before anything else looks at the commit; an id
    that fails it gets no error either, which would tell the client that it exists.
    """
    known: list[bytes] = []
    for hex_oid in dict.fromkeys(shallows):
        oid = bytes.fromhex(hex_oid.decode())
        if ctx.odb.contains(oid):
            known.append(oid)
    if known and not ctx.config.allow_any_sha1:
        allowed = reachable_subset(ctx.src, known, ctx.tips(), ctx.registry.reach_cache)
        dropped = [o for o in known if o not in allowed]
        if dropped:
            log.info("ignoring %d shallow line(s) of %s not reachable from visible refs: %s",
                     len(dropped), ctx.repo.url_path, dropped[0].hex())
        known = [o for o in known if o in allowed]
    for oid in known:
        if ctx.src.object_type(oid) != OBJ_COMMIT:
            raise Refusal(f"invalid shallow object {oid.hex()}")
    return known


def _check_want_policy(ctx: RequestContext, wants: Sequence[bytes]) -> None:
    """Every want must exist and, unless allowAnySHA1InWant, be reachable from a visible
    ref (ARCHITECTURE.md P7). The refusal names the first offending id, as C git does."""
    # A want is a true miss: the object list may be older than a concurrent repack, so
    # look again (one rescan per request at most) before calling it unknown.
    missing = [w for w in wants if ctx.odb.locate(w, needed=True) is None]
    if not missing and ctx.config.allow_any_sha1:
        return
    bad = missing[0] if missing else check_wants(ctx.src, wants, ctx.tips())
    if bad is not None:
        log.info("refusing want %s of %s: %s (rescans %d, packs %d)", bad.hex(),
                 ctx.repo.url_path, "missing" if missing else "not reachable from visible refs",
                 ctx.odb.rescans, len(ctx.odb.packs))
        raise Refusal(f"upload-pack: not our ref {bad.hex()}")
