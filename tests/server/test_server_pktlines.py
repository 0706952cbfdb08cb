"""Malformed and hostile pkt-line bodies in v0 and v2, unknown commands and capabilities,
object-format mismatches, unknown and hidden wants, and large but legal negotiations."""

from __future__ import annotations

import gzip
import random

import pytest
from gitutil import LiveServer
from rawhttp import (
    DELIM,
    FLUSH,
    RESULT_CT,
    assert_not_5xx,
    parse_pkts,
    pkt,
    pkt_lines,
    post_upload_pack,
    v2_command,
)

GARBAGE = {
    "non-hex": b"zzzz",
    "non-hex-later": pkt_lines("want " + "a" * 40) + b"00g0",
    "len-0003": b"0003",
    "len-0003-after-data": pkt_lines("command=ls-refs") + b"0003",
    "len-over-65520": b"fff5" + b"a" * 0xFFF1,
    "len-ffff": b"ffff" + b"a" * 100,
    "truncated": b"0040command=ls",
    "truncated-head": b"00",
    "negative-ish": b"-001",
    "spaces": b" 00a",
    "plus": b"+0fa" + b"a" * 0xFA,
    "random-256": random.Random(7).randbytes(256),
    "random-4k": random.Random(8).randbytes(4096),
    "all-zero-bytes": b"\x00" * 64,
    "unicode-digits": "٠٠١٠".encode(),
}
EMPTY_DATA = b"0004"


@pytest.mark.parametrize("name", sorted(GARBAGE))
@pytest.mark.parametrize("version", [0, 2])
def test_garbage_pkt_lines_are_400(server: LiveServer, version: int, name: str) -> None:
    resp = post_upload_pack(server.port, GARBAGE[name], version=version)
    assert resp.status == 400, (name, version, resp.status, resp.body[:200])
    assert resp.header("content-type").startswith("text/plain")


def test_bytes_after_the_end_of_a_request(server: LiveServer) -> None:
    # v2: serve.c stops reading at the request's closing flush, so a lone flush followed by
    # junk is still the empty request. v0: either the probe (200) or a refusal (400).
    resp = post_upload_pack(server.port, FLUSH + b"00", version=2)
    assert resp.status == 200
    assert resp.body == b""
    body = v2_command("ls-refs", args=("ref-prefix refs/heads/",)) + b"zz"
    resp = post_upload_pack(server.port, body, version=2)
    assert resp.status == 200
    assert b"refs/heads/main" in resp.body
    resp = post_upload_pack(server.port, FLUSH + b"00")
    assert resp.status in (200, 400)


@pytest.mark.parametrize("name", ["non-hex", "len-0003", "truncated", "random-256"])
def test_garbage_pkt_lines_gzipped_are_400(server: LiveServer, name: str) -> None:
    for version in (0, 2):
        resp = post_upload_pack(server.port, gzip.compress(GARBAGE[name]), version=version,
                                headers={"Content-Encoding": "gzip"})
        assert resp.status == 400, (name, version, resp.status)


@pytest.mark.parametrize("body", [
    EMPTY_DATA,
    EMPTY_DATA + FLUSH,
    DELIM,
    b"0002",
    DELIM + FLUSH,
    b"0002" + FLUSH,
    pkt_lines("want " + "a" * 40) + DELIM + FLUSH,
    pkt_lines("want " + "a" * 40) + b"0002",
    pkt_lines("want " + "a" * 40),  # no flush
    pkt_lines("have " + "a" * 40) + FLUSH,
    pkt_lines("done"),
    pkt_lines("want xyz") + FLUSH,
    pkt_lines("want " + "g" * 40) + FLUSH,
    pkt_lines("want " + "a" * 39) + FLUSH,
    pkt_lines("want " + "a" * 41) + FLUSH,
    pkt_lines("want " + "a" * 64) + FLUSH,
    pkt_lines("want  " + "a" * 40) + FLUSH,
    pkt_lines("wantx " + "a" * 40) + FLUSH,
    pkt_lines("command=ls-refs") + FLUSH,
])
def test_malformed_v0_requests_are_400(server: LiveServer, body: bytes) -> None:
    resp = post_upload_pack(server.port, body)
    assert resp.status == 400, (body[:60], resp.status, resp.body[:200])


def test_empty_v0_body_is_400(server: LiveServer) -> None:
    resp = post_upload_pack(server.port, b"")
    assert resp.status == 400


@pytest.mark.parametrize("body", [
    b"",
    EMPTY_DATA + FLUSH,
    DELIM,
    b"0002",
    pkt_lines("command=ls-refs"),  # no delim/flush
    pkt_lines("command=ls-refs") + DELIM,  # arguments never end
    pkt_lines("command=ls-refs") + DELIM + DELIM + FLUSH,
    pkt_lines("command=ls-refs") + DELIM + b"0002",
    pkt_lines("command=ls-refs", "command=ls-refs") + FLUSH,
    pkt_lines("command=ls-refs", "command=fetch") + FLUSH,
    pkt_lines("command=") + FLUSH,
    pkt_lines("command") + FLUSH,
    pkt_lines("agent=x") + FLUSH,  # no command at all
    pkt_lines("object-format=sha1") + DELIM + FLUSH,
])
def test_malformed_v2_requests_are_400(server: LiveServer, body: bytes) -> None:
    resp = post_upload_pack(server.port, body, version=2)
    assert resp.status == 400, (body[:60], resp.status, resp.body[:200])


def test_v2_lone_flush_is_an_empty_200(server: LiveServer) -> None:
    resp = post_upload_pack(server.port, FLUSH, version=2)
    assert resp.status == 200
    assert resp.header("content-type") == RESULT_CT
    assert resp.body == b""


@pytest.mark.parametrize("command", ["frob", "receive-pack", "LS-REFS", "ls-refs ", "bundle-uri",
                                     "fetch\x00", "\xff"])
def test_unknown_v2_command_is_400(server: LiveServer, command: str) -> None:
    # serve.c dies with "invalid command"; over HTTP that is a 4xx before any pkt-line.
    body = pkt(b"command=" + command.encode("utf-8", "surrogateescape") + b"\n") + \
        pkt_lines("object-format=sha1") + DELIM + FLUSH
    resp = post_upload_pack(server.port, body, version=2)
    assert resp.status == 400, (command, resp.status, resp.body[:200])
    assert b"invalid command" in resp.body


@pytest.mark.parametrize("cap", ["frobnicate", "agent", "object-format", "session-id=abc",
                                 "server-option", "unborn", "thin-pack", "=x", ""])
def test_v2_unknown_capability_is_400(server: LiveServer, cap: str) -> None:
    body = pkt_lines("command=ls-refs", "object-format=sha1", cap) + DELIM + FLUSH
    resp = post_upload_pack(server.port, body, version=2)
    assert resp.status == 400, (cap, resp.status, resp.body[:200])


def test_v2_known_capabilities_are_accepted(server: LiveServer) -> None:
    body = pkt_lines("command=ls-refs", "agent=git/2.39.5", "object-format=sha1",
                     "server-option=foo", "server-option=bar") + DELIM + \
        pkt_lines("peel", "symrefs", "ref-prefix refs/heads/") + FLUSH
    resp = post_upload_pack(server.port, body, version=2)
    assert resp.status == 200
    assert b"refs/heads/main" in resp.body


@pytest.mark.parametrize("repo,fmt", [("basic.git", "sha256"), ("basic.git", "md5"),
                                      ("sha256.git", "sha1"), ("sha256.git", "sha512")])
def test_v2_object_format_mismatch_is_400(server: LiveServer, repo: str, fmt: str) -> None:
    for command in ("ls-refs", "fetch"):
        body = v2_command(command, caps=(f"object-format={fmt}",))
        resp = post_upload_pack(server.port, body, repo=repo, version=2)
        assert resp.status == 400, (repo, fmt, command, resp.status)
        assert b"object format" in resp.body


def test_v2_sha256_repo_without_object_format_is_400(server: LiveServer) -> None:
    body = pkt_lines("command=ls-refs") + DELIM + FLUSH
    resp = post_upload_pack(server.port, body, repo="sha256.git", version=2)
    assert resp.status == 400


def test_v2_sha256_repo_with_matching_format(server: LiveServer, oids: dict[str, str]) -> None:
    body = v2_command("ls-refs", caps=("object-format=sha256",))
    resp = post_upload_pack(server.port, body, repo="sha256.git", version=2)
    assert resp.status == 200
    assert f"{oids['sha256_main']} refs/heads/main\n".encode() in resp.body


def test_v0_object_format_mismatch_is_400(server: LiveServer, oids: dict[str, str]) -> None:
    main = oids["basic_main"]
    body = pkt_lines(f"want {main} side-band-64k object-format=sha256") + FLUSH + \
        pkt_lines("done")
    resp = post_upload_pack(server.port, body)
    assert resp.status == 400
    assert b"object format" in resp.body


def test_v0_sha1_oid_against_sha256_repo_is_400(server: LiveServer, oids: dict[str, str]) -> None:
    body = pkt_lines(f"want {oids['basic_main']} side-band-64k") + FLUSH + pkt_lines("done")
    resp = post_upload_pack(server.port, body, repo="sha256.git")
    assert resp.status == 400


@pytest.mark.parametrize("caps", ["frobcap", "side-band side-band-64k", "multi_ack_detailed=1x",
                                  "filter=blob:none" + "x" * 0, "push-options", "atomic",
                                  "report-status"])
def test_v0_unadvertised_or_conflicting_capabilities(server: LiveServer, oids: dict[str, str],
                                                     caps: str) -> None:
    body = pkt_lines(f"want {oids['basic_main']} {caps}") + FLUSH + pkt_lines("done")
    resp = post_upload_pack(server.port, body)
    assert_not_5xx(resp)
    if caps.startswith(("filter", "multi_ack_detailed")):
        return  # advertised names; values are the negotiation's business
    assert resp.status == 400, (caps, resp.status, resp.body[:200])


@pytest.mark.parametrize("line", ["deepen 0", "deepen -1", "deepen x",
                                  "deepen 99999999999999999999", "deepen-since x", "deepen-not ",
                                  "shallow xyz", "filter blob:frob", "filter ", "filter tree:-1",
                                  "have xyz", "want-ref refs/heads/main", "sideband-all",
                                  "done extra", "frob"])
def test_v2_bad_fetch_arguments_are_400(server: LiveServer, oids: dict[str, str],
                                        line: str) -> None:
    # want-ref and sideband-all are not advertised by basic.git, so they are unknown lines.
    body = v2_command("fetch", args=(f"want {oids['basic_main']}", line, "done"))
    resp = post_upload_pack(server.port, body, version=2)
    assert resp.status == 400, (line, resp.status, resp.body[:200])
    assert resp.header("content-type").startswith("text/plain")


@pytest.mark.parametrize("line,text", [
    ("deepen-not refs/heads/nope", b"deepen-not is not a ref"),
    ("filter sparse:oid=abc", b"sparse:oid"),
])
def test_v2_refused_fetch_arguments_are_err(server: LiveServer, oids: dict[str, str],
                                            line: str, text: bytes) -> None:
    body = v2_command("fetch", args=(f"want {oids['basic_main']}", line, "done"))
    resp = post_upload_pack(server.port, body, version=2)
    assert resp.status == 200
    assert resp.header("content-type") == RESULT_CT
    first = parse_pkts(resp.body)[0]
    assert first is not None and first.startswith(b"ERR ") and text in first, resp.body[:200]
    assert b"PACK" not in resp.body


@pytest.mark.parametrize("line", ["frob", "ref-prefix", "symrefs=1", "unborn x", "peel extra"])
def test_v2_bad_ls_refs_arguments_are_400(server: LiveServer, line: str) -> None:
    resp = post_upload_pack(server.port, v2_command("ls-refs", args=(line,)), version=2)
    assert resp.status == 400, (line, resp.status)


@pytest.mark.parametrize("line", ["oid xyz", "oid " + "a" * 39, "frob", "size extra"])
def test_v2_bad_object_info_arguments(server: LiveServer, line: str) -> None:
    resp = post_upload_pack(server.port, v2_command("object-info", args=("size", line)),
                            version=2)
    assert_not_5xx(resp)
    assert resp.status == 400, (line, resp.status, resp.body[:200])


def test_v2_object_info_for_unknown_oid(server: LiveServer) -> None:
    # protocol-caps.c: an unknown object gets an empty size, not an error.
    bogus = "1" * 40
    resp = post_upload_pack(server.port, v2_command("object-info", args=("size", f"oid {bogus}")),
                            version=2)
    assert resp.status == 200
    assert parse_pkts(resp.body) == [b"size", f"{bogus} ".encode(), None]


# ------------------------------------------------------------------ wants

def _err_line(body: bytes) -> bytes:
    first = parse_pkts(body)[0]
    assert first is not None, body[:200]
    return first


def test_v0_unknown_want_is_err(server: LiveServer) -> None:
    bogus = "1" * 40
    body = pkt_lines(f"want {bogus} side-band-64k ofs-delta") + FLUSH + pkt_lines("done")
    resp = post_upload_pack(server.port, body)
    assert resp.status == 200
    assert resp.header("content-type") == RESULT_CT
    assert _err_line(resp.body) == f"ERR upload-pack: not our ref {bogus}\n".encode()


def test_v0_unknown_want_among_good_ones_is_err(server: LiveServer, oids: dict[str, str]) -> None:
    bogus = "2" * 40
    body = pkt_lines(f"want {oids['basic_main']} side-band-64k", f"want {bogus}") + FLUSH + \
        pkt_lines("done")
    resp = post_upload_pack(server.port, body)
    assert resp.status == 200
    assert _err_line(resp.body) == f"ERR upload-pack: not our ref {bogus}\n".encode()
    assert b"PACK" not in resp.body


def test_v0_want_of_tree_or_blob_only_ref_is_handled(server: LiveServer,
                                                     oids: dict[str, str]) -> None:
    # A negotiation round without done (flush only) for an unknown want: still ERR, not 5xx.
    bogus = "3" * 40
    body = pkt_lines(f"want {bogus} multi_ack_detailed side-band-64k") + FLUSH + \
        pkt_lines(f"have {oids['basic_first']}") + FLUSH
    resp = post_upload_pack(server.port, body)
    assert resp.status == 200
    assert _err_line(resp.body).startswith(b"ERR ")


def test_v2_unknown_want_is_err(server: LiveServer) -> None:
    bogus = "4" * 40
    resp = post_upload_pack(server.port, v2_command("fetch", args=(f"want {bogus}", "done")),
                            version=2)
    assert resp.status == 200
    assert _err_line(resp.body) == f"ERR upload-pack: not our ref {bogus}\n".encode()


def test_v0_want_reachable_only_from_hidden_ref_is_err(server: LiveServer,
                                                      oids: dict[str, str]) -> None:
    secret = oids["hidden_secret"]
    adv = post_upload_pack(server.port, FLUSH, repo="hidden.git")  # sanity: the repo works
    assert adv.status == 200
    body = pkt_lines(f"want {secret} side-band-64k ofs-delta") + FLUSH + pkt_lines("done")
    resp = post_upload_pack(server.port, body, repo="hidden.git")
    assert resp.status == 200
    assert _err_line(resp.body) == f"ERR upload-pack: not our ref {secret}\n".encode()
    assert b"PACK" not in resp.body


def test_v2_want_reachable_only_from_hidden_ref_is_err(server: LiveServer,
                                                      oids: dict[str, str]) -> None:
    secret = oids["hidden_secret"]
    resp = post_upload_pack(server.port, v2_command("fetch", args=(f"want {secret}", "done")),
                            repo="hidden.git", version=2)
    assert resp.status == 200
    assert _err_line(resp.body) == f"ERR upload-pack: not our ref {secret}\n".encode()
    assert b"PACK" not in resp.body


def test_hidden_ref_is_not_advertised(server: LiveServer, oids: dict[str, str]) -> None:
    from rawhttp import get_info_refs

    for version in (0, 2):
        resp = get_info_refs(server.port, "hidden.git", version)
        assert resp.status == 200
        assert oids["hidden_secret"].encode() not in resp.body
    ls = post_upload_pack(server.port, v2_command("ls-refs"), repo="hidden.git", version=2)
    assert oids["hidden_secret"].encode() not in ls.body
    assert b"refs/hidden/" not in ls.body
    assert b"refs/other/thing" not in ls.body
    assert b"refs/other/visible" in ls.body


def test_visible_want_in_hidden_repo_works(server: LiveServer, oids: dict[str, str]) -> None:
    body = pkt_lines(f"want {oids['hidden_main']} side-band-64k ofs-delta") + FLUSH + \
        pkt_lines("done")
    resp = post_upload_pack(server.port, body, repo="hidden.git")
    assert resp.status == 200
    assert parse_pkts(resp.body)[0] == b"NAK\n"


# ------------------------------------------------------------------ big but legal

def _random_oids(n: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    return [rnd.randbytes(20).hex() for _ in range(n)]


def test_v2_many_haves_within_limits(server: LiveServer, oids: dict[str, str]) -> None:
    main, first = oids["basic_main"], oids["basic_first"]
    haves = [f"have {h}" for h in _random_oids(50_000, 1)] + [f"have {first}"]
    body = v2_command("fetch", args=(f"want {main}", "ofs-delta", *haves, "done"))
    resp = post_upload_pack(server.port, gzip.compress(body), version=2,
                            headers={"Content-Encoding": "gzip"}, timeout=60)
    assert resp.status == 200
    pkts = parse_pkts(resp.body)
    assert pkts[0] == b"packfile\n"
    assert b"\x01PACK" in resp.body


def test_v2_many_haves_negotiation_round(server: LiveServer, oids: dict[str, str]) -> None:
    main, first = oids["basic_main"], oids["basic_first"]
    haves = [f"have {h}" for h in _random_oids(20_000, 2)] + [f"have {first}"]
    body = v2_command("fetch", args=(f"want {main}", *haves))
    resp = post_upload_pack(server.port, gzip.compress(body), version=2,
                            headers={"Content-Encoding": "gzip"}, timeout=60)
    assert resp.status == 200
    pkts = parse_pkts(resp.body)
    assert pkts[0] == b"acknowledgments\n"
    assert f"ACK {first}\n".encode() in pkts


def test_v0_many_haves_within_limits(server: LiveServer, oids: dict[str, str]) -> None:
    main, first = oids["basic_main"], oids["basic_first"]
    haves = pkt_lines(*(f"have {h}" for h in _random_oids(50_000, 3)), f"have {first}")
    body = pkt_lines(f"want {main} multi_ack_detailed side-band-64k ofs-delta") + FLUSH + \
        haves + FLUSH
    resp = post_upload_pack(server.port, gzip.compress(body),
                            headers={"Content-Encoding": "gzip"}, timeout=60)
    assert resp.status == 200
    pkts = parse_pkts(resp.body)
    assert f"ACK {first} common\n".encode() in pkts
    assert pkts[-1] == b"NAK\n"


def test_v0_many_wants_of_same_commit(server: LiveServer, oids: dict[str, str]) -> None:
    main = oids["basic_main"]
    body = pkt_lines(f"want {main} side-band-64k ofs-delta", *[f"want {main}"] * 5000) + \
        FLUSH + pkt_lines("done")
    resp = post_upload_pack(server.port, body, timeout=60)
    assert resp.status == 200
    assert parse_pkts(resp.body)[0] == b"NAK\n"


def test_max_size_pkt_line_is_accepted_by_the_framing(server: LiveServer) -> None:
    # 65520 bytes including the length: legal framing, meaningless content -> 400 from the
    # parser above it, not from the framing.
    body = b"fff0" + b"a" * (0xFFF0 - 4) + FLUSH
    resp = post_upload_pack(server.port, body)
    assert resp.status == 400
    assert b"pkt-line length" not in resp.body


def test_v2_object_info_hides_objects_of_hidden_refs(server: LiveServer,
                                                     oids: dict[str, str]) -> None:
    secret, visible = oids["hidden_secret"], oids["hidden_main"]
    body = v2_command("object-info", args=("size", f"oid {secret}", f"oid {visible}"))
    resp = post_upload_pack(server.port, body, repo="hidden.git", version=2)
    assert resp.status == 200
    pkts = parse_pkts(resp.body)
    assert pkts[0] == b"size"
    assert pkts[1] == f"{secret} ".encode()  # answered like an unknown object
    assert pkts[2] is not None and pkts[2].startswith(f"{visible} ".encode())
    assert pkts[2].split(b" ")[1].isdigit()
    assert pkts[3] is None
