"""protocol: the two v2 ways to move a clone off the upload-pack path, as C git frames them.

* ``bundle-uri`` (gitprotocol-v2 "bundle-uri"; bundle-uri.c): a capability listed after
  object-info, a command with no argument, answered by ``key=value`` lines and a flush.
* ``packfile-uris`` (gitprotocol-v2 "fetch"; upload-pack.c): a fetch feature, an argument
  of comma-separated protocols that counts only with ``sideband-all``, and a section of
  ``<pack hash> <uri>`` lines between wanted-refs and packfile.
"""

from __future__ import annotations

import pytest
from gitspout.protocol.bundle_uri import check_bundle_uri_args, iter_bundle_list
from gitspout.protocol.capabilities import V2Features, fetch_features, iter_v2_capabilities
from gitspout.protocol.command import parse_command_request
from gitspout.protocol.errors import ClientError
from gitspout.protocol.fetch_request import parse_v2_fetch_args
from gitspout.protocol.fetch_response import Mark, iter_v2_fetch_response
from gitspout.protocol.negotiate import V2Answer
from gitspout.protocol.pktline import DELIM_PKT, FLUSH_PKT, encode_pkt

PLAIN = V2Features(agent=b"a")
OFFLOAD = V2Features(agent=b"a", allow_sideband_all=True, bundle_uri=True, packfile_uris=True)


def body(*items: bytes | str) -> bytes:
    return b"".join(i if isinstance(i, bytes) else encode_pkt(i.encode() + b"\n") for i in items)


def test_advertised_only_when_enabled() -> None:
    assert b"bundle-uri\n" not in list(iter_v2_capabilities(PLAIN))
    caps = list(iter_v2_capabilities(OFFLOAD))
    assert caps[-1] == b"bundle-uri\n" and caps[-2] == b"object-info\n"  # serve.c's order
    assert fetch_features(OFFLOAD)[-1] == b"packfile-uris"
    assert b"packfile-uris" not in fetch_features(PLAIN)


@pytest.mark.parametrize("request_body", [
    body("command=bundle-uri", "object-format=sha1", FLUSH_PKT),
    body("command=bundle-uri", "agent=git/2.55", DELIM_PKT, FLUSH_PKT),
])
def test_bundle_uri_command(request_body: bytes) -> None:
    cmd = parse_command_request(request_body, OFFLOAD)
    assert cmd is not None and cmd.command == b"bundle-uri" and cmd.args == ()
    check_bundle_uri_args(cmd.args)
    with pytest.raises(ClientError, match="invalid command 'bundle-uri'"):
        parse_command_request(request_body, PLAIN)


def test_bundle_uri_takes_no_argument() -> None:
    cmd = parse_command_request(body("command=bundle-uri", DELIM_PKT, "x", FLUSH_PKT), OFFLOAD)
    assert cmd is not None
    with pytest.raises(ClientError, match="bundle-uri: unexpected argument: 'x'"):
        check_bundle_uri_args(cmd.args)


def test_bundle_list_lines() -> None:
    pairs = [(b"bundle.version", b"1"), (b"bundle.mode", b"all"),
             (b"bundle.b1.uri", b"https://cdn.example/b1.bundle")]
    assert list(iter_bundle_list(pairs)) == [b"bundle.version=1", b"bundle.mode=all",
                                             b"bundle.b1.uri=https://cdn.example/b1.bundle"]
    with pytest.raises(ValueError):
        list(iter_bundle_list([(b"bundle.x.uri", b"a\nb")]))


def test_packfile_uris_argument() -> None:
    req = parse_v2_fetch_args([b"want " + b"1" * 40, b"sideband-all", b"packfile-uris https,http"],
                              OFFLOAD)
    assert req.uri_protocols == (b"https", b"http")
    # upload-pack.c drops them without sideband-all (the section is sideband-all framed)
    req = parse_v2_fetch_args([b"want " + b"1" * 40, b"packfile-uris https"], OFFLOAD)
    assert req.uri_protocols == ()
    with pytest.raises(ClientError, match="multiple packfile-uris lines forbidden"):
        parse_v2_fetch_args([b"sideband-all", b"packfile-uris https", b"packfile-uris http"],
                            OFFLOAD)
    with pytest.raises(ClientError, match="unexpected line"):
        parse_v2_fetch_args([b"packfile-uris https"], PLAIN)


def test_packfile_uris_section_before_packfile() -> None:
    answer = V2Answer(ack_lines=None, send_pack=True)
    items = list(iter_v2_fetch_response(answer, wanted_refs=[(b"refs/heads/x", b"2" * 40)],
                                        packfile_uris=[b"3" * 40 + b" https://cdn/p.pack"]))
    assert items == [b"wanted-refs\n", b"2" * 40 + b" refs/heads/x\n", Mark.DELIM,
                     b"packfile-uris\n", b"3" * 40 + b" https://cdn/p.pack\n", Mark.DELIM,
                     b"packfile\n", Mark.PACK, Mark.FLUSH]
