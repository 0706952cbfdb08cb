"""protocol.advertise, protocol.capabilities, protocol.fetch_response, protocol.refs."""

from __future__ import annotations

import pytest
from gitspout.protocol.advertise import (
    V0_BASE_CAPABILITIES,
    V0_REQUEST_CAPABILITIES,
    format_service_header,
    format_v0_capabilities,
    iter_v0_advertisement,
    sorted_refs,
    v0_request_capabilities,
)
from gitspout.protocol.capabilities import V2Features, fetch_features, iter_v2_capabilities
from gitspout.protocol.fetch_response import (
    PACKFILE_HEADER,
    Mark,
    iter_shallow_info,
    iter_shallow_lines,
    iter_v0_fetch_response,
    iter_v2_fetch_response,
    iter_wanted_refs,
)
from gitspout.protocol.negotiate import V0Answer, V2Answer
from gitspout.protocol.refs import (
    HeadInfo,
    Ref,
    parse_hide_pattern,
    ref_is_hidden,
    ref_matches_prefixes,
)

A = b"a" * 40
B = b"b" * 40
T = b"7" * 40
Z = b"0" * 40
# Shallow/unshallow lines are written from binary ids (ref values stay hex).
A_ID = b"\xaa" * 20
B_ID = b"\xbb" * 20
T_ID = b"\x77" * 20
BASE = (
    b"multi_ack thin-pack side-band side-band-64k ofs-delta shallow deepen-since deepen-not "
    b"deepen-relative no-progress include-tag multi_ack_detailed"
)

# ------------------------------------------------------------------ v0 capabilities


def test_base_capabilities_in_c_git_order() -> None:
    assert b" ".join(V0_BASE_CAPABILITIES) == BASE


def test_format_v0_capabilities_everything_in_order() -> None:
    caps = format_v0_capabilities(
        object_format=b"sha1", agent=b"gitspout/1", head_target=b"refs/heads/main",
        allow_tip_sha1=True, allow_reachable_sha1=True, no_done=True, allow_filter=True,
        session_id=b"sid",
    )
    assert caps == BASE + (
        b" allow-tip-sha1-in-want allow-reachable-sha1-in-want no-done"
        b" symref=HEAD:refs/heads/main filter session-id=sid object-format=sha1"
        b" agent=gitspout/1"
    )


def test_format_v0_capabilities_minimal() -> None:
    caps = format_v0_capabilities(
        object_format=b"sha256", agent=b"x", head_target=None, no_done=False, allow_filter=False
    )
    assert caps == BASE + b" object-format=sha256 agent=x"


def test_format_v0_capabilities_defaults() -> None:
    caps = format_v0_capabilities(object_format=b"sha1", agent=b"x", head_target=None)
    assert caps == BASE + b" no-done filter object-format=sha1 agent=x"


@pytest.mark.parametrize("allow_filter", [True, False])
def test_v0_request_capabilities_are_what_is_offered(allow_filter: bool) -> None:
    """ARCHITECTURE.md P12: a client may name what the advertisement offers, by name, but
    the facts it only reports (allow-*-sha1-in-want, symref)."""
    caps = format_v0_capabilities(
        object_format=b"sha1", agent=b"x", head_target=b"refs/heads/main",
        allow_tip_sha1=True, allow_reachable_sha1=True, allow_filter=allow_filter,
        session_id=b"sid",
    )
    offered = {c.partition(b"=")[0] for c in caps.split(b" ")}
    facts = {b"allow-tip-sha1-in-want", b"allow-reachable-sha1-in-want", b"symref"}
    assert v0_request_capabilities(allow_filter) == offered - facts
    assert V0_REQUEST_CAPABILITIES == set(BASE.split()) | {
        b"no-done", b"agent", b"object-format", b"session-id"}


def test_service_header() -> None:
    assert format_service_header(b"git-upload-pack") == b"# service=git-upload-pack\n"


# ------------------------------------------------------------------ v0 advertisement

HEAD = HeadInfo(b"refs/heads/main", A)
REFS = [Ref(b"refs/heads/main", A), Ref(b"refs/tags/v1", T, peeled=B), Ref(b"refs/x", B)]


def test_head_first_with_capabilities() -> None:
    assert list(iter_v0_advertisement(HEAD, REFS, b"CAPS", Z)) == [
        A + b" HEAD\0CAPS\n",
        A + b" refs/heads/main\n",
        T + b" refs/tags/v1\n",
        B + b" refs/tags/v1^{}\n",
        B + b" refs/x\n",
    ]


def test_version_1_line_first() -> None:
    out = list(iter_v0_advertisement(HEAD, REFS, b"CAPS", Z, version=1))
    assert out[0] == b"version 1\n" and out[1] == A + b" HEAD\0CAPS\n"


@pytest.mark.parametrize("head", [None, HeadInfo(b"refs/heads/gone", None)])
def test_without_head_the_first_ref_carries_capabilities(head: HeadInfo | None) -> None:
    out = list(iter_v0_advertisement(head, REFS, b"CAPS", Z))
    assert out[0] == A + b" refs/heads/main\0CAPS\n" and len(out) == 4


def test_first_ref_a_tag_peeled_line_has_no_capabilities() -> None:
    out = list(iter_v0_advertisement(None, REFS[1:], b"CAPS", Z))
    assert out[:2] == [T + b" refs/tags/v1\0CAPS\n", B + b" refs/tags/v1^{}\n"]


def test_empty_repository() -> None:
    for head in (None, HeadInfo(b"refs/heads/main", None)):
        assert list(iter_v0_advertisement(head, [], b"CAPS", Z)) == [
            Z + b" capabilities^{}\0CAPS\n"
        ]
    assert list(iter_v0_advertisement(None, [], b"C", Z, version=1)) == [
        b"version 1\n", Z + b" capabilities^{}\0C\n"
    ]


def test_detached_head_only() -> None:
    assert list(iter_v0_advertisement(HeadInfo(None, B), [], b"C", Z)) == [B + b" HEAD\0C\n"]


def test_sorted_refs_bytewise() -> None:
    names = [b"refs/heads/main", b"refs/heads/Zeta", b"refs/heads/a-b", b"refs/heads/a/b",
             b"refs/heads/\xc3\xa9", b"refs/heads/a"]
    out = [r.name for r in sorted_refs([Ref(n, A) for n in names])]
    assert out == [b"refs/heads/Zeta", b"refs/heads/a", b"refs/heads/a-b", b"refs/heads/a/b",
                   b"refs/heads/main", b"refs/heads/\xc3\xa9"]


# ------------------------------------------------------------------ v2 capabilities


def test_v2_defaults() -> None:
    assert list(iter_v2_capabilities(V2Features(agent=b"gitspout/1"))) == [
        b"version 2\n",
        b"agent=gitspout/1\n",
        b"ls-refs=unborn\n",
        b"fetch=shallow wait-for-done filter\n",
        b"server-option\n",
        b"object-format=sha1\n",
        b"object-info\n",
    ]


def test_v2_everything() -> None:
    f = V2Features(agent=b"a", object_format=b"sha256", allow_filter=True,
                   allow_ref_in_want=True, allow_sideband_all=True, advertise_unborn=False,
                   session_id=b"s")
    assert list(iter_v2_capabilities(f)) == [
        b"version 2\n",
        b"agent=a\n",
        b"ls-refs\n",
        b"fetch=shallow wait-for-done filter ref-in-want sideband-all\n",
        b"server-option\n",
        b"object-format=sha256\n",
        b"session-id=s\n",
        b"object-info\n",
    ]


def test_fetch_features() -> None:
    assert fetch_features(V2Features(agent=b"a", allow_filter=False)) == [
        b"shallow", b"wait-for-done"
    ]
    assert fetch_features(V2Features(agent=b"a", allow_sideband_all=True)) == [
        b"shallow", b"wait-for-done", b"filter", b"sideband-all"
    ]


# ------------------------------------------------------------------ fetch response sections


def test_shallow_info_section() -> None:
    assert list(iter_shallow_info([A_ID], [B_ID])) == [
        b"shallow-info\n", b"shallow " + A, b"unshallow " + B
    ]
    assert list(iter_shallow_info([], [])) == [b"shallow-info\n"]


def test_shallow_lines_shallow_before_unshallow() -> None:
    assert list(iter_shallow_lines([A_ID, B_ID], [T_ID])) == [
        b"shallow " + A, b"shallow " + B, b"unshallow " + T
    ]


def test_wanted_refs_section() -> None:
    assert list(iter_wanted_refs([(b"refs/heads/main", A)])) == [
        b"wanted-refs\n", A + b" refs/heads/main\n"
    ]


def test_packfile_header() -> None:
    assert PACKFILE_HEADER == b"packfile\n"


ACKS = (b"acknowledgments\n", b"ACK " + A + b"\n", b"ready\n")
F, D, P = Mark.FLUSH, Mark.DELIM, Mark.PACK


def test_v2_sections_in_spec_order() -> None:
    """ARCHITECTURE.md P9: acknowledgments, shallow-info, wanted-refs, packfile."""
    items = list(iter_v2_fetch_response(V2Answer(ACKS, True), shallow=[A_ID], unshallow=[B_ID],
                                        deepen=True, wanted_refs=[(b"refs/heads/x", T)]))
    assert items == [*ACKS, D, b"shallow-info\n", b"shallow " + A, b"unshallow " + B, D,
                     b"wanted-refs\n", T + b" refs/heads/x\n", D, PACKFILE_HEADER, P, F]


def test_v2_acknowledgments_alone_end_with_flush() -> None:
    acks = (b"acknowledgments\n", b"NAK\n")
    assert list(iter_v2_fetch_response(V2Answer(acks, False), deepen=True,
                                       wanted_refs=[(b"refs/heads/x", T)])) == [*acks, F]


def test_v2_shallow_info_when_deepening_or_client_is_shallow() -> None:
    done = V2Answer(None, True)
    assert list(iter_v2_fetch_response(done)) == [PACKFILE_HEADER, P, F]
    for kw in ({"deepen": True}, {"client_shallow": True}):
        assert list(iter_v2_fetch_response(done, **kw)) == [
            b"shallow-info\n", D, PACKFILE_HEADER, P, F]
    assert list(iter_v2_fetch_response(None, deepen=True)) == []


def test_v0_shallow_list_and_flush_come_first_even_empty() -> None:
    """ARCHITECTURE.md P8."""
    nak = V0Answer((b"NAK\n",), True)
    assert list(iter_v0_fetch_response(nak, deepen=True)) == [F, b"NAK\n", P, F]
    assert list(iter_v0_fetch_response(nak, shallow=[A_ID], deepen=True, sideband=False)) == [
        b"shallow " + A, F, b"NAK\n", P]
    assert list(iter_v0_fetch_response(nak, shallow=[A_ID])) == [b"NAK\n", P, F]
    assert list(iter_v0_fetch_response(V0Answer((), False), deepen=True)) == [F]
    assert list(iter_v0_fetch_response(None, deepen=True)) == []


# ------------------------------------------------------------------ refs / hideRefs


@pytest.mark.parametrize(
    ("ref", "patterns", "hidden"),
    [
        (b"refs/pull/1/head", [b"refs/pull"], True),
        (b"refs/pull", [b"refs/pull"], True),
        (b"refs/pullx", [b"refs/pull"], False),  # a path prefix, not a string prefix
        (b"refs/heads/main", [b"refs/pull"], False),
        (b"refs/heads/main", [], False),
        (b"refs/other/visible", [b"refs/other", b"!refs/other/visible"], False),
        (b"refs/other/x", [b"refs/other", b"!refs/other/visible"], True),
        (b"refs/other/visible", [b"!refs/other/visible", b"refs/other"], True),  # last wins
        (b"refs/heads/x", [b"refs"], True),
        (b"HEAD", [b"HEAD"], True),
    ],
)
def test_ref_is_hidden(ref: bytes, patterns: list[bytes], hidden: bool) -> None:
    assert ref_is_hidden(ref, patterns) is hidden


def test_ref_is_hidden_full_name_pattern() -> None:
    full = b"refs/namespaces/ns/refs/heads/main"
    assert ref_is_hidden(b"refs/heads/main", [b"^refs/namespaces/ns"], full)
    assert not ref_is_hidden(b"refs/heads/main", [b"refs/namespaces/ns"], full)
    assert not ref_is_hidden(b"refs/heads/main", [b"!^refs/namespaces/ns"], full)
    # Without a namespace, ^ matches the name itself.
    assert ref_is_hidden(b"refs/heads/main", [b"^refs/heads"])


def test_parse_hide_pattern() -> None:
    assert parse_hide_pattern(b"refs/pull/") == b"refs/pull"
    assert parse_hide_pattern(b"refs/pull//") == b"refs/pull"
    assert parse_hide_pattern(b"!refs/x") == b"!refs/x"


def test_ref_matches_prefixes() -> None:
    assert ref_matches_prefixes(b"refs/heads/main", [])
    assert ref_matches_prefixes(b"refs/heads/main", [b"refs/tags/", b"refs/heads/m"])
    assert not ref_matches_prefixes(b"refs/heads/main", [b"refs/tags/"])


def test_values_are_frozen_and_slotted() -> None:
    r = Ref(b"refs/heads/main", A)
    with pytest.raises(AttributeError):
        r.oid = B  # type: ignore[misc]
    assert not hasattr(r, "__dict__")
    assert not hasattr(HeadInfo(None, None), "__dict__")
