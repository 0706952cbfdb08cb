"""Optional access control: HTTP Basic credentials checked against bcrypt hashes, and
repository globs mapped to the users allowed to read them (docs/operations.md "Access control").

Without ``--auth-file`` every repository is served anonymously, as before. With it:

- a repository is matched by its real path under the root (symlinks resolved; ``x.git``
  and ``x`` and a link to it are one repository, so no spelling of a URL escapes a rule),
  against the ``[[access]]`` rules in order; the first whose ``repos`` globs match decides;
  no rule matching means nobody may read it;
- a rule with ``anonymous = true`` serves everyone; else it names ``users`` (``"*"``: any
  user with valid credentials);
- no (or wrong) credentials where some are needed: ``401`` with ``WWW-Authenticate: Basic``,
  which makes git ask its credential helper; valid credentials of a user not allowed:
  ``403``. A repository that does not exist is answered ``401`` too when the request has
  no valid credentials, so that anonymous requests learn nothing about what exists.

Passwords (or tokens: git sends either as the Basic password) are stored as bcrypt hashes
(``gitspout hash-password``). bcrypt is slow on purpose (about 0.2 s at cost 12), so a
verified pair is remembered for ``CREDENTIAL_TTL`` seconds in a bounded cache keyed by an
HMAC of the pair under a key drawn at start (no password is kept, even hashed with a known
key); wrong pairs are remembered too, in a cache of their own, so that repeating one costs
no bcrypt and random ones cannot push the right ones out. A right pair whose entry
expired is still known as one (``was_right``): its new check goes first (authgate.py,
where checks run and failed logins are limited). The cache lookups are counted as
``gitspout_cache_lookups_total{cache="credentials"|"credentials_failed"}``. Nothing here
logs a password, a hash or an Authorization header.

The auth file (TOML)::

    realm = "gitspout"                  # optional
    [users]
    alice = "$2b$12$..."                # gitspout hash-password
    ci = "$2b$12$..."
    [[access]]
    repos = ["public/*"]
    anonymous = true
    [[access]]
    repos = ["team/*", "tools.git"]
    users = ["alice", "ci"]
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hmac
import os
import secrets
import time
import tomllib
from dataclasses import dataclass
from hashlib import sha256
from typing import Any

from ..store.lru import ByteLRU, MemoryBudget
from .config import ConfigError

__all__ = ["Access", "AuthDenied", "load_access", "hash_password", "CREDENTIAL_TTL"]

CREDENTIAL_TTL = 60.0  # seconds a checked user and password pair is remembered
CREDENTIAL_ENTRIES = 4096


class AuthDenied(Exception):
    """401 (``challenge``: credentials needed or wrong), 403 (a user not allowed) or 429
    (too many failed logins: ``retry_after`` seconds)."""

    def __init__(self, status: int, text: str, retry_after: int = 0) -> None:
        super().__init__(text)
        self.status = status
        self.text = text
        self.retry_after = retry_after


@dataclass(frozen=True)
class Rule:
    repos: tuple[str, ...]
    users: frozenset[str]
    anonymous: bool

    def matches(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, glob) for glob in self.repos)

    def allows(self, user: str | None) -> bool:
        if self.anonymous:
            return True
        return user is not None and (user in self.users or "*" in self.users)


class Access:
    """The rules and users of one auth file, and the cache of checked credentials."""

    def __init__(self, realm: str, users: dict[str, bytes], rules: list[Rule],
                 memory: MemoryBudget | None = None) -> None:
        self.realm = realm
        self._users = users
        self.rules = rules
        self._key = secrets.token_bytes(32)
        # right pairs: (user, until); wrong ones: until. Apart, so that a flood of wrong
        # ones cannot evict the right ones.
        self._right = ByteLRU[tuple[str, float]](
            "credentials", CREDENTIAL_ENTRIES, unit="entries", entry_bytes=200, parent=memory)
        self._wrong = ByteLRU[float]("credentials_failed", CREDENTIAL_ENTRIES, unit="entries",
                                     entry_bytes=120, parent=memory)
        # The hash an unknown user is checked against: as slow as the users' own, so that
        # the time taken does not tell which user names exist.
        self._dummy = max(users.values(), default=b"")

    @property
    def challenge(self) -> str:
        return f'Basic realm="{self.realm}", charset="UTF-8"'

    def rule_for(self, name: str) -> Rule | None:
        return next((r for r in self.rules if r.matches(name)), None)

    def anonymous(self, name: str) -> bool:
        rule = self.rule_for(name)
        return rule is not None and rule.anonymous

    def user_for(self, authorization: str | None) -> str | None:
        """The user the ``Authorization`` header proves, None without one; raises a 401
        AuthDenied for credentials that are malformed or wrong. Blocking (bcrypt): run it
        in the pool, after :meth:`known_user` found no answer."""
        if not authorization:
            return None
        user, password = _credentials(authorization)
        if not self._verify(user, password):
            raise AuthDenied(401, "wrong user name or password")
        return user

    def known_user(self, authorization: str) -> tuple[bool, str | None]:
        """(True, the user) when the credentials were checked within CREDENTIAL_TTL (no
        bcrypt: answered on the event loop, so a flood of wrong passwords queued in the
        pool does not hold up users already known); (False, None) when they must be
        checked (:meth:`user_for`). Raises AuthDenied as :meth:`user_for` does."""
        user, password = _credentials(authorization)
        key = self._key_of(user, password)
        now = time.monotonic()
        right = self._right.get(key)
        if right is not None and right[1] > now:
            return True, user
        wrong = self._wrong.get(key)
        if wrong is not None and wrong > now:
            raise AuthDenied(401, "wrong user name or password")
        return False, None

    def was_right(self, authorization: str) -> bool:
        """True when these credentials were right when last checked (their cache entry
        may have expired: they are checked again, first)."""
        try:
            user, password = _credentials(authorization)
        except AuthDenied:
            return False
        return self._key_of(user, password) in self._right

    def _key_of(self, user: str, password: str) -> bytes:
        name = user.encode()
        return hmac.new(self._key, len(name).to_bytes(4, "big") + name + password.encode(),
                        sha256).digest()

    def _verify(self, user: str, password: str) -> bool:
        key = self._key_of(user, password)
        now = time.monotonic()
        right = self._right.get(key)
        if right is not None and right[1] > now:
            return True
        wrong = self._wrong.get(key)
        if wrong is not None and wrong > now:
            return False
        import bcrypt  # the auth extra: only needed once an auth file is in use

        stored = self._users.get(user)
        try:
            # bcrypt compares in constant time; an unknown user is checked all the same
            ok = bcrypt.checkpw(bcrypt_input(password), stored or self._dummy) \
                and stored is not None
        except ValueError:  # no users at all, or a hash bcrypt cannot read
            ok = False
        if ok:
            self._right.put(key, (user, now + CREDENTIAL_TTL))
        else:
            self._right.pop(key)
            self._wrong.put(key, now + CREDENTIAL_TTL)
        return ok

    def decide(self, name: str | None, user: str | None) -> None:
        """Raise AuthDenied unless ``user`` (None: anonymous) may read repository ``name``
        (its real path under the root; None: there is no such repository)."""
        rule = self.rule_for(name) if name is not None else None
        if rule is not None and rule.allows(user):
            return
        if user is None:
            raise AuthDenied(401, "authentication required")
        if name is not None:
            raise AuthDenied(403, f"user {user} may not read this repository")


def _credentials(authorization: str) -> tuple[str, str]:
    """(user, password) of a Basic ``Authorization`` header; AuthDenied (401) otherwise."""
    scheme, _, blob = authorization.partition(" ")
    if scheme.lower() != "basic":
        raise AuthDenied(401, "authentication required (Basic)")
    try:
        raw = base64.b64decode(blob.strip(), validate=True)
        user, sep, password = raw.decode("utf-8").partition(":")
    except (binascii.Error, ValueError):  # ValueError: a non-ASCII byte in the base64
        raise AuthDenied(401, "malformed credentials") from None
    if not sep or not user:
        raise AuthDenied(401, "malformed credentials")
    return user, password


def load_access(path: str, memory: MemoryBudget | None = None) -> Access:
    """Read an auth file; ConfigError for anything unusable. Its credentials cache counts
    against ``memory`` (--cache-memory)."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read auth file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"auth file {path}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"auth file {path}: not UTF-8 ({exc.reason} at byte "
                          f"{exc.start})") from None
    realm = str(data.get("realm", "gitspout"))
    if '"' in realm or "\\" in realm:
        raise ConfigError(f"auth file {path}: realm must not contain quotes or backslashes")
    for key, kind in (("users", dict), ("access", list)):
        if not isinstance(data.get(key, kind()), kind):
            raise ConfigError(f"auth file {path}: {key} must be a "
                              + ("table of name = hash" if kind is dict else "list of rules"))
    users: dict[str, bytes] = {}
    for name, hashed in dict(data.get("users", {})).items():
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")) \
                or len(hashed) != 60:
            raise ConfigError(f"auth file {path}: user {name!r} needs a bcrypt hash "
                              "(gitspout hash-password)")
        users[str(name)] = hashed.encode()
    rules = [_rule(path, i, entry) for i, entry in enumerate(data.get("access", []))]
    for rule in rules:
        unknown = rule.users - set(users) - {"*"}
        if unknown:
            raise ConfigError(f"auth file {path}: unknown users {sorted(unknown)}")
    if users:
        _bcrypt()  # fail at start, not at the first request, when the extra is missing
    return Access(realm, users, rules, memory)


def _bcrypt() -> Any:
    try:
        import bcrypt
    except ImportError:
        raise ConfigError("passwords need bcrypt: pip install 'gitspout[auth]'") from None
    return bcrypt


def _rule(path: str, i: int, entry: Any) -> Rule:
    if not isinstance(entry, dict) or not isinstance(entry.get("repos"), list) or \
            not entry["repos"] or not all(isinstance(g, str) for g in entry["repos"]):
        raise ConfigError(f"auth file {path}: access rule {i + 1} needs repos = [globs]")
    users = entry.get("users", [])
    if not isinstance(users, list) or not all(isinstance(u, str) for u in users):
        raise ConfigError(f"auth file {path}: access rule {i + 1}: users = [names]")
    repos = tuple(g.strip("/") for g in entry["repos"])
    return Rule(repos, frozenset(users), bool(entry.get("anonymous", False)))


def repo_name(gitdir: str, root: str) -> str:
    """What rules match: the repository's real path under the root, without a trailing
    ``/.git`` (a repository with a work tree is named by its work tree)."""
    rel = os.path.relpath(gitdir, root).replace(os.sep, "/")
    return rel[: -len("/.git")] if rel.endswith("/.git") else rel


# bcrypt reads at most 72 bytes of a password: bcrypt 5 refuses more, older ones ignore
# the rest (a long token would be checked by its first 72 bytes only).
BCRYPT_MAX = 72


def bcrypt_input(password: str) -> bytes:
    """What bcrypt hashes for ``password``: its UTF-8 bytes, or, past 72 bytes (a long
    token, a JWT), the base64 of their SHA-256, so that every byte of it counts."""
    raw = password.encode()
    if len(raw) <= BCRYPT_MAX:
        return raw
    return base64.b64encode(sha256(raw).digest())


def hash_password(password: str, rounds: int = 12) -> str:
    """A bcrypt hash for the auth file (ConfigError without bcrypt)."""
    bcrypt = _bcrypt()
    return bcrypt.hashpw(bcrypt_input(password), bcrypt.gensalt(rounds)).decode()
