"""Authentication that cannot be flooded (issue 24, item 5; app/authgate.py, app/auth.py).

30 clients sending wrong passwords held a valid user 20-25 s and an anonymous request for
a repository not resolved yet 15 s: bcrypt ran in the shared pool, one thread at a time,
in the queue of repository resolution. Checks now run in threads of their own, in lanes
(right before, clean addresses, suspect ones), failed logins are limited per address and
overall, and random passwords cannot evict the right ones from the cache.

The flood comes from 127.0.0.2-31 (all loopback on Linux), the users from 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import socket
import threading
from collections import Counter
from pathlib import Path

import bcrypt
import pytest
from gitspout.server.app import auth, authgate
from gitutil import Git, copy_repo, poll, start_server, wait_until
from rawhttp import build_request, metric, parse_response, read_until_close

COST = 11  # about 0.13 s a check
FLOODERS = 30
PASSWORD = "right-0ne"


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture(scope="module")
def flood_root(tmp_path_factory: pytest.TempPathFactory, fixture_root: Path) -> Path:
    root = tmp_path_factory.mktemp("floodroot")
    (root / "team").mkdir()
    (root / "public").mkdir()
    copy_repo(fixture_root / "basic.git", root / "team" / "app.git")
    copy_repo(fixture_root / "basic.git", root / "public" / "fresh.git")
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(COST)).decode()
    (root.parent / f"{root.name}-auth.toml").write_text(
        f'[users]\nalice = "{hashed}"\n'
        '[[access]]\nrepos = ["public/*"]\nanonymous = true\n'
        '[[access]]\nrepos = ["team/*"]\nusers = ["alice"]\n')
    return root


class Flood:
    """One thread per source address, each asking for a private repository with a new
    random password as soon as its last answer came."""

    def __init__(self, port: int, clients: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.statuses: list[Counter[int]] = [Counter() for _ in range(clients)]
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(clients)]
        for t in self.threads:
            t.start()

    def _run(self, i: int) -> None:
        path = "/team/app.git/info/refs?service=git-upload-pack"
        for _ in range(10_000):
            if self.stop.is_set():
                return
            req = build_request("GET", path, {"Authorization": _basic("alice",
                                                                      secrets.token_hex(8))})
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=60,
                                              source_address=(f"127.0.0.{2 + i}", 0)) as s:
                    s.sendall(req)
                    data, _ = read_until_close(s, 60)
                resp = parse_response(data)
            except (OSError, ValueError, AssertionError):  # no answer: the server stopped
                continue
            self.statuses[i][resp.status] += 1
            if resp.status == 429:
                self.stop.wait(0.2)  # the scenario: a flooder backs off a little when told

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=90)


def _checks(port: int, result: str) -> float:
    return metric(port, f'gitspout_auth_checks_total{{result="{result}"}}', 0.0)


def test_valid_and_anonymous_requests_are_not_queued_behind_a_password_flood(
        flood_root: Path, git: Git, tmp_path: Path) -> None:
    """Before: each waited behind the flood's queue, about one check per flooder (a few
    seconds at this cost; 20-25 s at cost 12 and the issue's load). Counted, not timed:
    the wrong passwords checked while each one was answered."""
    srv = start_server(flood_root, ["--auth-file", str(flood_root.parent /
                                                      f"{flood_root.name}-auth.toml")])
    flood = Flood(srv.port, FLOODERS)
    try:
        # Every flooder has been told no once: the flood is under way.
        assert wait_until(lambda: all(s[401] for s in flood.statuses), 120)
        failed_before = _checks(srv.port, "failed")
        helper = f"!f() {{ echo username=alice; echo password={PASSWORD}; }}; f"
        out = git.out("-c", "credential.helper=", "-c", f"credential.helper={helper}",
                      "ls-remote", f"{srv.url}/team/app.git", timeout=60)
        assert "refs/heads/main" in out
        # Not queued behind the flood: only the checks running when it came finished
        # before it (one thread), where it used to wait for one per flooder.
        failed_meanwhile = _checks(srv.port, "failed") - failed_before
        failed_before = _checks(srv.port, "failed")
        out = git.out("ls-remote", f"{srv.url}/public/fresh.git", timeout=60)
        assert "refs/heads/main" in out
        # A repository not resolved yet: its resolution never waits for a check.
        failed_anonymous = _checks(srv.port, "failed") - failed_before
        print(f"wrong passwords checked meanwhile: {failed_meanwhile:.0f} (valid user), "
              f"{failed_anonymous:.0f} (anonymous) of {FLOODERS} flooders")
        assert failed_meanwhile <= 4, failed_meanwhile
        assert failed_anonymous <= 4, failed_anonymous
        assert srv.alive()
    finally:
        srv.stop()  # first: the checks still waiting are answered at once
        flood.close()


def test_failed_logins_are_limited_per_address_and_overall(tmp_path: Path) -> None:
    """Past its burst an address gets 429 (Retry-After) without a check, until its bucket
    refills; past the overall burst, every address with a failure does; a clean address
    and right credentials are still checked. (A clock of the test's own: no waiting.)"""
    path = tmp_path / "auth.toml"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    path.write_text(f'[users]\nalice = "{hashed}"\n[[access]]\nrepos = ["*"]\n'
                    'users = ["alice"]\n')
    now = [1000.0]
    gate = authgate.PasswordGate(auth.load_access(str(path)), clock=lambda: now[0])

    async def attempt(address: str, password: str | None = None) -> int:
        try:
            await gate.user_for(_basic("alice", password or secrets.token_hex(8)), address)
        except auth.AuthDenied as exc:
            return exc.status
        return 200

    async def scenario() -> None:
        burst = authgate.ADDRESS_BURST
        assert [await attempt("10.0.0.1") for _ in range(burst)] == [401] * burst
        denied = None
        try:
            await gate.user_for(_basic("alice", "nope"), "10.0.0.1")
        except auth.AuthDenied as exc:
            denied = exc
        assert denied is not None and denied.status == 429 and denied.retry_after > 0
        assert gate.counts["failed"] == burst and gate.counts["refused"] == 1
        assert await attempt("10.0.0.2") == 401  # another address is checked
        now[0] += authgate.ADDRESS_REFILL
        assert await attempt("10.0.0.1") == 401  # refilled: one more check
        # Overall: once the process's burst is spent, addresses with a failure are
        # refused without a check, even with room of their own; a clean one is checked.
        for i in range(authgate.GLOBAL_BURST):
            assert await attempt(f"10.1.{i // 250}.{i % 250}") == 401
        assert await attempt("10.1.0.0") == 429  # one failure only, but the process's spent
        assert await attempt("10.9.9.9", PASSWORD) == 200
        gate.close()

    asyncio.run(scenario())


def test_random_passwords_cannot_evict_the_right_ones(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: one cache of checked pairs, least recently used out: 4,096 random
    passwords pushed a user out, and the user's next request paid a check behind them."""
    monkeypatch.setattr(auth, "CREDENTIAL_ENTRIES", 16)
    path = tmp_path / "auth.toml"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    path.write_text(f'[users]\nalice = "{hashed}"\n[[access]]\nrepos = ["*"]\n'
                    'users = ["alice"]\n')
    access = auth.load_access(str(path))
    right = _basic("alice", PASSWORD)
    assert access.user_for(right) == "alice"
    for _ in range(40):
        with pytest.raises(auth.AuthDenied):
            access.user_for(_basic("alice", secrets.token_hex(8)))
    assert access.known_user(right) == (True, "alice")  # still known: no check needed


def test_a_check_whose_client_went_away_takes_no_place_and_breaks_no_one(tmp_path: Path) -> None:
    """A queue full of suspect checks, the newest of them abandoned by its client (its
    future cancelled): a clean user's check takes the abandoned one's place and is
    answered. The gate used to answer the abandoned check 503 to make room, which raised
    InvalidStateError into the clean user's request (a 500)."""
    path = tmp_path / "auth.toml"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    path.write_text(f'[users]\nalice = "{hashed}"\n[[access]]\nrepos = ["*"]\n'
                    'users = ["alice"]\n')
    release = threading.Event()
    entered: list[str | None] = []

    class Held(auth.Access):  # the real checks, held until the test lets them run
        def user_for(self, authorization: str | None) -> str | None:
            entered.append(authorization)
            release.wait(timeout=60)
            return super().user_for(authorization)

    real = auth.load_access(str(path))
    held = Held.__new__(Held)
    held.__dict__.update(real.__dict__)
    gate = authgate.PasswordGate(held, threads=1)

    async def scenario() -> None:
        release.set()
        with pytest.raises(auth.AuthDenied):  # one failure: 2.2.2.2 is a suspect now
            await gate.user_for(_basic("alice", "wrong"), "2.2.2.2")
        release.clear()
        running = asyncio.create_task(gate.user_for(_basic("alice", "wrong1"), "2.2.2.2"))
        await asyncio.to_thread(poll, lambda: len(entered) == 2, 30, "the second check running")
        suspects = [asyncio.create_task(gate.user_for(_basic("alice", f"w{i}"), "2.2.2.2"))
                    for i in range(authgate.QUEUE)]
        for _ in range(10 * authgate.QUEUE):  # let each task reach the gate
            if gate.queued == authgate.QUEUE:
                break
            await asyncio.sleep(0)
        assert gate.queued == authgate.QUEUE
        suspects[-1].cancel()
        await asyncio.gather(suspects[-1], return_exceptions=True)
        clean = asyncio.create_task(gate.user_for(_basic("alice", PASSWORD), "3.3.3.3"))
        for _ in range(100):
            await asyncio.sleep(0)
            if clean.done() or gate.queued == authgate.QUEUE:
                break
        release.set()
        assert await clean == "alice"
        results = await asyncio.gather(running, *suspects[:-1], return_exceptions=True)
        assert all(isinstance(r, auth.AuthDenied) for r in results), \
            Counter(type(r).__name__ for r in results)
        gate.close()

    asyncio.run(scenario())
