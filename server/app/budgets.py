"""Every limit of the process, built once from the config and handed to the layer that
enforces it; each of those layers reports its own in /metrics.

=========================  ======================================  ===========================
limit                      setting                                 enforced (and reported) by
=========================  ======================================  ===========================
``memory``                 ``--cache-memory``                      every cache (store/lru.py)
``inflate``                ``--inflate-memory``                    large objects held whole
                                                                   (packgen/writer.py)
``open_files``             ``--max-open-packs``                    store/registry.py
``bodies``                 ``--max-body``, ``--max-inflated-body``,  app/httpreq.py
                           ``--body-timeout``, ``--body-min-rate``
``admission``              ``--max-packs``, ``--max-packs-per-repo``,  app/admission.py
                           ``--pack-queue``, ``--pack-queue-wait``,
                           ``--retry-after``, ``--body-memory``
``connections``            ``--max-connections``, ``--header-timeout``,  app/connections.py,
                           ``--idle-timeout``, ``--send-timeout``,     app/sendwatch.py
                           ``--send-min-rate``
``pack_cache``             ``--pack-cache-size``, ``-dir``, ``-ttl``,  app/cachestore.py
                           ``-on``
``closure_store``          ``--closure-store``: a sixteenth of     store/closurestore.py
                           ``--pack-cache-size``, taken from the
                           pack cache's (``--workers``: the
                           pod's, shared by the workers)
``output_buffer``          ``--output-buffer``                     app/stream.py cap_output
``threads``                ``--threads``, ``--threads-per-repo``   app/pool.py
``auth_threads``           ``--auth-threads``                      app/authgate.py
=========================  ======================================  ===========================
"""

from __future__ import annotations

from dataclasses import dataclass

from ..store.bigobjects import ByteBudget
from ..store.lru import MemoryBudget
from .admission import AdmissionLimits
from .cachestore import PackCacheLimits
from .config import Config
from .connections import ConnectionLimits
from .httpreq import BodyLimits
from .sendwatch import SendLimits

__all__ = ["Budgets", "CLOSURE_SHARE"]

CLOSURE_SHARE = 16  # the closure store's part of --pack-cache-size: one sixteenth


@dataclass(frozen=True)
class Budgets:
    """The limits of one server process (see the module doc for who enforces each)."""

    memory: MemoryBudget
    inflate: ByteBudget
    open_files: int
    bodies: BodyLimits
    admission: AdmissionLimits
    connections: ConnectionLimits
    pack_cache: PackCacheLimits
    closure_store: int  # bytes of closure files (0: none), out of --pack-cache-size
    output_buffer: int
    threads: int
    threads_per_repo: int
    auth_threads: int

    @classmethod
    def from_config(cls, cfg: Config, workers: int = 1) -> Budgets:
        """``workers``: how many processes share the pod's budgets (``cfg`` holds this
        one's share, workers.py); the closure store, whose one directory every worker
        counts whole, gets the pod's sixteenth, the pack cache the rest of the share."""
        closures = cfg.pack_cache_size // CLOSURE_SHARE if cfg.closure_store else 0
        return cls(
            memory=MemoryBudget(cfg.cache_memory),
            inflate=ByteBudget(cfg.inflate_memory),
            open_files=cfg.max_open_packs,
            bodies=BodyLimits(cfg.max_body, cfg.max_inflated_body, cfg.body_timeout,
                              cfg.body_min_rate),
            admission=AdmissionLimits(cfg.max_packs, cfg.max_packs_per_repo, cfg.pack_queue,
                                      cfg.pack_queue_wait, cfg.retry_after, cfg.body_memory),
            connections=ConnectionLimits(cfg.header_timeout, cfg.idle_timeout,
                                         cfg.max_connections,
                                         SendLimits(cfg.send_timeout, cfg.send_min_rate)),
            pack_cache=PackCacheLimits(cfg.pack_cache_size - closures, cfg.pack_cache_dir,
                                       cfg.pack_cache_ttl, cfg.pack_cache_on),
            closure_store=closures * max(1, workers),
            output_buffer=cfg.output_buffer,
            threads=cfg.threads,
            threads_per_repo=cfg.threads_per_repo,
            auth_threads=cfg.auth_threads,
        )

    def describe(self) -> str:
        """One line for the log at start: the limits in force."""
        a, b, c = self.admission, self.bodies, self.connections
        return (f"cache-memory {self.memory.limit}, inflate-memory {self.inflate.limit}, "
                f"max-open-packs {self.open_files}, max-body {b.max_body}/"
                f"{b.max_inflated}, body-memory {a.body_memory}, max-packs {a.max_packs} "
                f"({a.per_repo} per repository, queue {a.queue}), max-connections "
                f"{c.max_connections}, pack-cache-size {self.pack_cache.size}, "
                f"output-buffer {self.output_buffer}, threads {self.threads}")
