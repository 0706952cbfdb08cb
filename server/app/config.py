"""Configuration: every setting is a CLI flag ``--name``, an env var ``GITSPOUT_NAME`` and a
key ``name`` in an optional TOML file. Precedence: flag, then env, then file, then default.
"""

from __future__ import annotations

import ipaddress
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .namespaces import NamespaceMap, namespaces_setting

__all__ = ["Config", "ConfigError", "load_config", "load_settings", "parse_size",
           "format_size", "GROUPS", "group_of", "proxy_networks"]

# The topics of ``serve --help`` and of the README's settings table, in this order. A
# setting names its own in its metadata ("group"); one without lands in "other".
GROUPS = {
    "listening": "where and how clients connect",
    "repositories": "what is served",
    "limits": "threads, memory, queues and rates",
    "caches": "what is kept across requests",
    "offload": "bundle URIs and packfile URIs: clones served from files (bundles.py, "
               "blobpacks.py)",
    "timeouts": "seconds (0 turns most of them off)",
    "auth": "who may read what",
    "metrics": "Prometheus /metrics",
    "logging": "what the server writes",
    "other": "settings without a topic yet",
}


class ConfigError(Exception):
    """A setting has a value we cannot use."""


@dataclass(frozen=True)
class Config:
    """Settings of one gitspout process."""

    root: str = field(default=".", metadata={"help": "directory whose repositories are served",
                                             "group": "repositories"})
    allow_symlinks_outside_root: bool = field(
        default=False,
        metadata={"help": "follow symlinks (to a repository, or inside one: objects, refs, "
                          "packed-refs, alternates...) that lead outside the root", "group": "repositories"},
    )
    require_export_ok: bool = field(
        default=False,
        metadata={"help": "serve only repositories holding a git-daemon-export-ok file, as "
                          "git-http-backend does without GIT_HTTP_EXPORT_ALL (others: 404)",
                  "group": "repositories"},
    )
    namespaces: str = field(
        default="",
        metadata={"help": "URLs that serve a namespace of a repository (GIT_NAMESPACE): "
                          "URL=REPO#NAMESPACE entries joined by commas, or a [namespaces] "
                          "table in the TOML file (docs/operations.md \"Namespaces\")",
                  "group": "repositories"},
    )
    host: str = field(default="127.0.0.1", metadata={"help": "address to listen on", "group": "listening"})
    port: int = field(default=8080, metadata={"help": "TCP port to listen on", "group": "listening"})
    config: str | None = field(
        default=None,
        metadata={"help": "optional TOML file of settings: the keys are the flags' names, at "
                          "the top level or under [gitspout]"},
    )
    log_level: str = field(default="info", metadata={"help": "debug, info, warning or error",
                                                     "group": "logging", "metavar": "LEVEL"})
    log_format: str = field(
        default="text",
        metadata={"help": "'text': one line per record with a UTC timestamp and a level; "
                          "'json': one JSON object per line (startup, warnings and access "
                          "lines alike); both on stdout (docs/operations.md \"Logs\")",
                  "group": "logging", "metavar": "text|json"},
    )
    trusted_proxies: str = field(
        default="",
        metadata={"help": "comma-separated addresses or CIDR networks of reverse proxies "
                          "whose X-Forwarded-For and X-Request-Id are believed (the client "
                          "is the right-most address not in them); none: the peer is the "
                          "client", "group": "listening"},
    )
    threads: int = field(default=8, metadata={"help": "size of the blocking-work thread pool",
                                              "group": "limits"})
    threads_per_repo: int = field(
        default=1, metadata={"help": "pool threads one repository's work may use at once "
                                     "(0: all of --threads)", "group": "limits"}
    )
    max_body: int = field(
        default=32 << 20, metadata={"help": "cap on a request body as sent (bytes; KiB, MiB, "
                                            "GiB accepted)", "size": True, "group": "limits"}
    )
    max_inflated_body: int = field(
        default=64 << 20, metadata={"help": "cap on a request body after gunzip (bytes; KiB, "
                                            "MiB, GiB accepted)", "size": True, "group": "limits"}
    )
    keepalive: float = field(
        default=5.0, metadata={"help": "seconds of silence before a side-band keepalive", "group": "timeouts"}
    )
    cross_request_cache: bool = field(
        default=True,
        metadata={"help": "cache ref state across requests behind stat validation", "group": "caches"},
    )
    agent: str = field(default="gitspout/0.1.0", metadata={"help": "agent= capability value",
                                                           "group": "listening"})
    metrics_port: int = field(
        default=0, metadata={"help": "serve /metrics on this port too (0: the serving port)",
                             "group": "metrics"}
    )
    public_metrics: bool = field(
        default=True,
        metadata={"help": "also serve /metrics on the serving port (--no-public-metrics "
                          "with --metrics-port: only there)", "group": "metrics"},
    )
    auth_file: str | None = field(
        default=None,
        metadata={"help": "TOML file of users (bcrypt hashes) and the repository globs each "
                          "may read (docs/operations.md \"Access control\"); unset: anonymous read",
                  "group": "auth"},
    )
    auth_threads: int = field(
        default=1,
        metadata={"help": "threads that check passwords (bcrypt), apart from the pool that "
                          "serves repositories", "group": "auth"},
    )
    metrics_repos: str = field(
        default="", metadata={"help": "comma-separated repositories that get a repo label "
                                      "(x and x.git alike; the label is the repository's "
                                      "path under the root)",
                              "group": "metrics"}
    )
    # Connection limits (server/connections.py). The phases in which the server waits for
    # the client to *send* are timed; a client slowly receiving a pack is governed by
    # backpressure, and cut only when it stops or crawls (sendwatch.py: send_timeout,
    # send_min_rate). 0 turns a timeout (or the cap) off.
    header_timeout: float = field(
        default=20.0,
        metadata={"help": "seconds from a connection's opening, or from the first byte of a "
                          "later request, until the request head is complete", "group": "timeouts"},
    )
    body_timeout: float = field(
        default=30.0,
        metadata={"help": "seconds a request body may go without a byte while it is read",
                  "group": "timeouts"},
    )
    body_min_rate: int = field(
        default=1024,
        metadata={"help": "bytes/s a request body must bring over its last body-timeout "
                          "seconds, once it has been read that long", "group": "limits"},
    )
    send_timeout: float = field(
        default=60.0,
        metadata={"help": "seconds a response may wait with no byte taken by its client "
                          "before it is cut (its pack slot released); 0 turns this and "
                          "send-min-rate off", "group": "timeouts"},
    )
    send_min_rate: int = field(
        default=1024,
        metadata={"help": "bytes/s a client must take, over the last send-timeout seconds "
                          "in which data waited for it, once it has waited that long", "group": "limits"},
    )
    idle_timeout: float = field(
        default=75.0,
        metadata={"help": "seconds a kept-alive connection may wait for its next request",
                  "group": "timeouts"},
    )
    max_connections: int = field(
        default=512,
        metadata={"help": "open connections at most; beyond it the longest-waiting idle one "
                          "is closed, or the new one refused if none is idle", "group": "listening"},
    )

    # Open files and memory (docs/ARCHITECTURE.md I1; docs/operations.md "Open files" under
    # "Repositories on NFS").
    max_open_packs: int = field(
        default=256,
        metadata={"help": "descriptors and maps of pack, idx and commit-graph files kept "
                          "open across repositories (least recently used closed first; a "
                          "file a request is reading is never closed under it)", "group": "limits"},
    )
    cache_memory: int = field(
        default=256 << 20,
        metadata={"help": "bytes held by all cross-request caches together (pack indexes, "
                          "reverse indexes, bitmaps, objects, object sets...); suffixes "
                          "KiB, MiB, GiB (or K, M, G) accepted", "size": True, "group": "caches"},
    )
    cold_walk_pack_entries: int = field(
        default=16384,
        metadata={"help": "a fetch of a few new commits walks from its wants to the client's "
                          "haves instead of using bitmaps while a pack of at least this many "
                          "objects has no reverse index loaded yet (the sort and the haves' "
                          "bitmaps would cost more than the walk); 0 turns this off", "group": "caches"},
    )
    sweep_interval: float = field(
        default=10.0,
        metadata={"help": "seconds between checks that the open packs are still on disk "
                          "(packs replaced in a repository nobody asks for are closed at the "
                          "next check); 0 turns it off", "group": "caches"},
    )
    # The pack cache (server/app/packcache.py; docs/ARCHITECTURE.md "Pack cache").
    pack_cache_size: int = field(
        default=1 << 30,
        metadata={"help": "bytes of pack files the pack cache keeps on disk (least recently "
                          "used removed first); 0 turns the cache off", "size": True, "group": "caches"},
    )
    pack_cache_dir: str = field(
        default="",
        metadata={"help": "local directory (or emptyDir) for pack cache files, never the "
                          "served root; the server makes and removes its own subdirectory "
                          "in it (none: the system temporary directory)", "group": "caches"},
    )
    closure_store: bool = field(
        default=True,
        metadata={"help": "keep what a cold walk computes (closures of tips the bitmaps do "
                          "not cover, a clone's object walk without them) in "
                          "--pack-cache-dir, for the next process to read instead of walking; "
                          "they take a sixteenth of --pack-cache-size",
                  "group": "caches"},
    )
    pack_cache_ttl: float = field(
        default=600.0,
        metadata={"help": "seconds a complete pack cache entry is served; 0: until evicted",
                  "group": "caches"},
    )
    pack_cache_on: str = field(
        default="first",
        metadata={"help": "cache a pack on its 'first' request, or only on the 'second' "
                          "identical one (one-off fetches then never touch the disk)",
                  "group": "caches", "metavar": "first|second"},
    )
    # Bundles of gitspout's own (server/app/bundles.py; README "Bundle URIs").
    bundles: bool = field(
        default=False,
        metadata={"help": "write a bundle of a repository cloned often, serve it and "
                          "advertise it to v2 clients (bundle-uri)", "group": "offload"},
    )
    bundle_after: int = field(
        default=3,
        metadata={"help": "full clones of a repository within --bundle-window that make "
                          "gitspout write its bundle", "group": "offload"},
    )
    bundle_window: float = field(
        default=600.0, metadata={"help": "seconds over which full clones are counted", "group": "offload"},
    )
    bundle_size: int = field(
        default=4 << 30,
        metadata={"help": "bytes of bundle files kept on local disk (least recently "
                          "written removed first)", "size": True, "group": "offload"},
    )
    bundle_dir: str = field(
        default="",
        metadata={"help": "local directory for bundle and blob-pack files, never the "
                          "served root (none: the system temporary directory)", "group": "offload"},
    )
    bundle_refresh_refs: int = field(
        default=16,
        metadata={"help": "refs added, removed or moved since a bundle was written that "
                          "make it stale: no longer offered, written anew by the next "
                          "--bundle-after full clones (a bundle of fewer than four times "
                          "this many refs: a quarter of its refs, rounded up)",
                  "group": "offload"},
    )
    bundle_refresh_age: float = field(
        default=86400.0,
        metadata={"help": "seconds after which a bundle is stale if any ref moved since it "
                          "was written, however few (0: never by age alone)",
                  "group": "offload"},
    )
    bundle_base_url: str = field(
        default="",
        metadata={"help": "advertise bundles under this URL (a CDN or object store the "
                          "operator copies the bundle directory to) instead of gitspout's",
                  "group": "offload"},
    )
    # Large blobs as packfile URIs to packs of gitspout's own (server/app/blobpacks.py).
    blob_uri_threshold: int = field(
        default=0,
        metadata={"help": "blobs of this size or more (stored whole in a pack) are sent as "
                          "packfile URIs to one-blob packs gitspout writes and serves, to "
                          "v2 clients that accept http(s) URIs (0: never)", "size": True,
                  "group": "offload"},
    )
    blob_uri_size: int = field(
        default=4 << 30,
        metadata={"help": "bytes of one-blob packs kept on local disk (under --bundle-dir); "
                          "a blob that does not fit goes in the fetch's pack", "size": True,
                  "group": "offload"},
    )

    output_buffer: int = field(
        default=256 << 10,
        metadata={"help": "bytes queued for one connection's socket before the pack "
                          "producer waits for the client (per-connection output cap); "
                          "suffixes KiB, MiB accepted", "size": True, "group": "limits"},
    )
    body_memory: int = field(
        default=256 << 20,
        metadata={"help": "bytes of request bodies (as received, then inflated) held at "
                          "once over all requests, beyond the first 64 KiB of each (ref "
                          "listings and small fetches pass); a request past it gets 503 with "
                          "Retry-After; 0 turns the cap off; suffixes KiB, MiB, GiB "
                          "accepted", "size": True, "group": "limits"},
    )
    inflate_memory: int = field(
        default=128 << 20,
        metadata={"help": "bytes of large objects held whole at once over all requests "
                          "(a delta resolved to be sent whole); requests needing more wait; "
                          "suffixes KiB, MiB, GiB accepted", "size": True, "group": "limits"},
    )

    # Workers (server/app/workers.py; README "Scaling").
    workers: str = field(
        default="1",
        metadata={"help": "worker processes serving the port (SO_REUSEPORT), each using "
                          "about one core; 'auto': the CPUs this process may use (affinity "
                          "and cgroup CPU quota). Memory, disk, connection and pack-slot "
                          "budgets are split between them", "group": "listening"},
    )

    # Drain and health (server/app/health.py; docs/ARCHITECTURE.md "Drain and health").
    drain_timeout: float = field(
        default=30.0,
        metadata={"help": "seconds that requests in flight at SIGTERM may take to finish, "
                          "and what they wrote to leave the kernel's send buffers (new "
                          "connections are refused at once); then they are cut and the "
                          "process exits 0", "group": "timeouts"},
    )
    ready_check_interval: float = field(
        default=2.0,
        metadata={"help": "seconds a /readyz check of the repository root is reused", "group": "timeouts"},
    )
    ready_check_timeout: float = field(
        default=1.0,
        metadata={"help": "seconds a /readyz check of the repository root may take before "
                          "/readyz answers 503 (a hung mount)", "group": "timeouts"},
    )

    # Admission control (server/app/admission.py; docs/ARCHITECTURE.md "Admission control").
    max_packs: int = field(
        default=32,
        metadata={"help": "packs generated at once over all repositories; more wait in the "
                          "queue (0: no limit)", "group": "limits"},
    )
    max_packs_per_repo: int = field(
        default=16, metadata={"help": "packs generated at once for one repository (0: no limit)",
                              "group": "limits"},
    )
    pack_queue: int = field(
        default=256,
        metadata={"help": "pack requests that may wait for a slot; one more is answered 503 "
                          "(0: none waits)", "group": "limits"},
    )
    pack_queue_wait: float = field(
        default=60.0,
        metadata={"help": "seconds a pack request may wait for a slot before it is "
                          "answered 503", "group": "timeouts"},
    )
    retry_after: int = field(
        default=10, metadata={"help": "Retry-After seconds of a 503 for load", "group": "limits"},
    )

    def root_path(self) -> Path:
        return Path(self.root).resolve()


_FIELDS = {f.name: f for f in fields(Config)}


MAX_SECONDS = 1e9  # any setting in seconds: about 31 years
_SIZE_UNITS = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
               "g": 1 << 30, "gib": 1 << 30}


def parse_size(value: Any) -> int:
    """``8MiB``, ``256M``, ``1g``, ``4096``: a number of bytes."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int):
        return value
    text = str(value).strip().lower().replace("_", "")
    num = text.rstrip("kmgib")
    unit = text[len(num):]
    if unit not in _SIZE_UNITS or not num:
        raise ValueError(value)
    return int(float(num) * _SIZE_UNITS[unit])


def format_size(value: int) -> str:
    """``33554432`` as ``32 MiB``: the largest unit that divides it, else bytes."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if value and value % (1 << shift) == 0:
            return f"{value >> shift} {unit}"
    return f"{value} bytes" if value != 1 else "1 byte"


def group_of(f: Any) -> str:
    """The topic of setting ``f`` (a dataclass field of :class:`Config`)."""
    group = f.metadata.get("group", "other")
    return group if group in GROUPS else "other"


def proxy_networks(text: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """``--trusted-proxies``: addresses or CIDR networks joined by commas; ValueError names
    a bad entry."""
    out = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        try:
            out.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"bad address or network {entry!r}") from None
    return tuple(out)


def _coerce(name: str, value: Any, source: str) -> Any:
    kind = _FIELDS[name].type
    try:
        if _FIELDS[name].metadata.get("size"):
            return parse_size(value)
        if kind == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(value)  # TOML `port = 18305.9` is refused, not truncated
            return int(value)
        if kind == "float":  # seconds, every one of them
            number = float(value)
            if math.isfinite(number) and abs(number) > MAX_SECONDS:
                # past it, timers overflow (--send-timeout 1e19 failed every request)
                raise ValueError(f"more than {MAX_SECONDS:.0e} seconds")
            return number
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if name == "namespaces":
            text = namespaces_setting(value)
            NamespaceMap.parse(text)
            return text
        if name == "trusted_proxies":
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                value = ",".join(value)  # TOML: a list of strings, or one string
            if not isinstance(value, str):
                raise ValueError(value)
            proxy_networks(value)
            return value
        if name == "workers" and isinstance(value, int) and not isinstance(value, bool):
            return str(value)  # TOML `workers = 2`
        if value is not None and not isinstance(value, str):
            raise ValueError(value)  # TOML `host = 5`, `metrics_repos = ["a"]`
        return value
    except (ValueError, TypeError, OverflowError) as exc:
        why = f": {exc}" if name in ("namespaces", "trusted_proxies") or \
            (kind == "float" and "seconds" in str(exc)) else ""
        raise ConfigError(f"setting {name!r} ({source}): cannot use value {value!r}{why}") from None


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path}: not UTF-8 ({exc.reason} at byte "
                          f"{exc.start})") from None
    if "gitspout" in data and len(data) > 1:
        others = ", ".join(sorted(k for k in data if k != "gitspout"))
        raise ConfigError(f"config file {path}: keys both at the top level ({others}) and "
                          "under [gitspout]; put them all in one place")
    table = data.get("gitspout", data)
    if not isinstance(table, dict):
        raise ConfigError(f"config file {path}: [gitspout] must be a table")
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in _FIELDS or name == "config":
            raise ConfigError(f"config file {path}: unknown key {key!r}")
        if name in spelled:  # max-open-packs and max_open_packs: which one was meant?
            raise ConfigError(f"config file {path}: {spelled[name]!r} and {key!r} are one "
                              "setting; give it once")
        spelled[name] = key
        out[name] = value
    return out


def load_config(
    cli: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> Config:
    """Merge flags, environment and TOML file into a :class:`Config`."""
    return load_settings(cli, env)[0]


def load_settings(
    cli: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None
) -> tuple[Config, dict[str, str]]:
    """:func:`load_config`, with where each setting came from: ``default``, ``file PATH``,
    ``env GITSPOUT_NAME`` or ``flag --name``."""
    cli = {k: v for k, v in (cli or {}).items() if v is not None and k in _FIELDS}
    env = os.environ if env is None else env
    from_env = {
        name: env[f"GITSPOUT_{name.upper()}"]
        for name in _FIELDS
        if f"GITSPOUT_{name.upper()}" in env
    }
    config_path = cli.get("config") or from_env.get("config")
    from_file = _read_toml(config_path) if config_path else {}
    merged: dict[str, tuple[Any, str]] = {}
    for values_of, source in ((from_file, f"config file {config_path}"), (from_env, "env"),
                              (cli, "flag")):
        for name, value in values_of.items():
            merged[name] = (value, f"GITSPOUT_{name.upper()}" if source == "env" else
                            f"--{name.replace('_', '-')}" if source == "flag" else source)
    values = {name: _coerce(name, value, source) for name, (value, source) in merged.items()}
    cfg = Config(**values)
    _validate(cfg)
    sources = {name: "default" for name in _FIELDS}
    for name, (_value, source) in merged.items():
        sources[name] = (f"file {config_path}" if source.startswith("config file") else
                         f"env {source}" if source.startswith("GITSPOUT_") else f"flag {source}")
    return cfg, sources


def _validate(cfg: Config) -> None:
    if not 0 <= cfg.port <= 65535:
        raise ConfigError(f"port {cfg.port} is out of range")
    if not 0 <= cfg.metrics_port <= 65535:
        raise ConfigError(f"metrics_port {cfg.metrics_port} is out of range")
    if not math.isfinite(cfg.keepalive) or cfg.keepalive <= 0:
        raise ConfigError("keepalive must be a number of seconds above 0")
    if cfg.threads < 1 or cfg.auth_threads < 1:
        raise ConfigError("threads and auth_threads must be at least 1")
    if cfg.threads_per_repo < 0:
        raise ConfigError("threads_per_repo must be 0 or more")
    for name in ("header_timeout", "body_timeout", "idle_timeout", "send_timeout"):
        value = getattr(cfg, name)
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{name} must be a number of seconds, 0 or more (0 turns it off)")
    if cfg.body_min_rate < 0 or cfg.send_min_rate < 0:
        raise ConfigError("body_min_rate and send_min_rate must be 0 or more bytes per second "
                          "(0 turns it off)")
    if cfg.cold_walk_pack_entries < 0:
        raise ConfigError("cold_walk_pack_entries must be 0 or more")
    if cfg.max_open_packs < 2:
        raise ConfigError("max_open_packs must be at least 2 (one pack and its index)")
    if cfg.cache_memory < 0:
        raise ConfigError("cache_memory must be 0 or more bytes")
    if not math.isfinite(cfg.sweep_interval) or cfg.sweep_interval < 0:
        raise ConfigError("sweep_interval must be a number of seconds, 0 or more (0 turns it off)")
    for name in ("drain_timeout", "ready_check_interval", "ready_check_timeout"):
        value = getattr(cfg, name)
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{name} must be a number of seconds, 0 or more")
    for name in ("max_packs", "max_packs_per_repo", "pack_queue", "retry_after"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{name} must be 0 or more")
    if not math.isfinite(cfg.pack_queue_wait) or cfg.pack_queue_wait <= 0:
        raise ConfigError("pack_queue_wait must be a number of seconds above 0")
    for name in ("max_body", "max_inflated_body"):
        if getattr(cfg, name) < 4096:
            raise ConfigError(f"{name} must be at least 4096 bytes")
    if not cfg.agent or not all(33 <= ord(c) < 127 for c in cfg.agent):
        raise ConfigError("agent must be printable ASCII without spaces (it is one "
                          "capability token)")
    if cfg.output_buffer < 4096:
        raise ConfigError("output_buffer must be at least 4096 bytes")
    if cfg.body_memory and cfg.body_memory < cfg.max_inflated_body:
        raise ConfigError("body_memory must be 0 (no cap) or at least max_inflated_body: "
                          "one request's body must fit")
    if cfg.inflate_memory < 0:
        raise ConfigError("inflate_memory must be 0 or more bytes")
    if cfg.max_connections < 0:
        raise ConfigError("max_connections must be 0 or more (0 turns the cap off)")
    if cfg.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"unknown log level {cfg.log_level!r}")
    if cfg.log_format not in ("text", "json"):
        raise ConfigError(f"log_format must be 'text' or 'json', not {cfg.log_format!r}")
    _validate_pack_cache(cfg)
    _validate_bundles(cfg)
    text = cfg.workers.strip().lower()
    if text != "auto" and not (text.isdigit() and 1 <= int(text) <= 256):
        raise ConfigError(f"workers must be 'auto' or a number from 1 to 256, not {cfg.workers!r}")
    if not Path(cfg.root).is_dir():
        raise ConfigError(f"root {cfg.root!r} is not a directory")




def _validate_bundles(cfg: Config) -> None:
    if cfg.bundle_after < 1 or cfg.bundle_refresh_refs < 1:
        raise ConfigError("bundle_after and bundle_refresh_refs must be 1 or more")
    if not math.isfinite(cfg.bundle_refresh_age) or cfg.bundle_refresh_age < 0:
        raise ConfigError("bundle_refresh_age must be a number of seconds, 0 or more")
    if not math.isfinite(cfg.bundle_window) or cfg.bundle_window <= 0:
        raise ConfigError("bundle_window must be a number of seconds above 0")
    if cfg.blob_uri_threshold < 0 or cfg.blob_uri_size < 0 or cfg.bundle_size < 0:
        raise ConfigError("blob_uri_threshold, blob_uri_size and bundle_size must be 0 or "
                          "more bytes")
    if cfg.bundle_base_url and not cfg.bundle_base_url.startswith(("http://", "https://")):
        raise ConfigError("bundle_base_url must be an http:// or https:// URL")
    if (cfg.bundles or cfg.blob_uri_threshold) and cfg.bundle_dir:
        bundles, root = Path(cfg.bundle_dir).resolve(), Path(cfg.root).resolve()
        if bundles == root or root in bundles.parents:
            raise ConfigError("bundle_dir must not be inside the served root")
        _writable_directory("bundle_dir", cfg.bundle_dir, bundles)


def _validate_pack_cache(cfg: Config) -> None:
    if cfg.pack_cache_size < 0:
        raise ConfigError("pack_cache_size must be 0 or more bytes (0 turns the cache off)")
    if not math.isfinite(cfg.pack_cache_ttl) or cfg.pack_cache_ttl < 0:
        raise ConfigError("pack_cache_ttl must be a number of seconds, 0 or more")
    if cfg.pack_cache_on not in ("first", "second"):
        raise ConfigError("pack_cache_on must be 'first' or 'second'")
    if cfg.pack_cache_dir and cfg.pack_cache_size:
        cache, root = Path(cfg.pack_cache_dir).resolve(), Path(cfg.root).resolve()
        if cache == root or root in cache.parents:
            raise ConfigError("pack_cache_dir must not be inside the served root")
        _writable_directory("pack_cache_dir", cfg.pack_cache_dir, cache)


def _writable_directory(name: str, given: str, path: Path) -> None:
    """A directory the server writes in: made if missing; ConfigError when it cannot be
    (a file in the way, no permission) or is not writable."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{name} {given!r}: {exc.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{name} {given!r} is not writable")
