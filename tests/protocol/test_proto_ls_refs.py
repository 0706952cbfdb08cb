"""protocol.ls_refs: argument parsing and the answer's lines."""

from __future__ import annotations

import pytest
from gitspout.protocol.errors import ClientError
from gitspout.protocol.ls_refs import TOO_MANY_PREFIXES, LsRefsRequest, iter_ls_refs, parse_ls_refs_args
from gitspout.protocol.refs import HeadInfo, Ref

A = b"a" * 40
B = b"b" * 40
T = b"7" * 40
HEAD = HeadInfo(b"refs/heads/main", A)
UNBORN = HeadInfo(b"refs/heads/main", None)
DETACHED = HeadInfo(None, B)
REFS = [
    Ref(b"refs/heads/alias", A, symref_target=b"refs/heads/main"),
    Ref(b"refs/heads/main", A),
    Ref(b"refs/heads/topic", B),
    Ref(b"refs/tags/v1", T, peeled=B),
]


def test_parse_defaults() -> None:
    assert parse_ls_refs_args([]) == LsRefsRequest(False, False, False, ())


def test_parse_every_argument() -> None:
    req = parse_ls_refs_args(
        [b"peel", b"symrefs", b"unborn", b"ref-prefix refs/heads/", b"ref-prefix HEAD"]
    )
    assert req == LsRefsRequest(True, True, True, (b"refs/heads/", b"HEAD"))


def test_parse_empty_prefix_is_kept() -> None:
    assert parse_ls_refs_args([b"ref-prefix "]).prefixes == (b"",)


@pytest.mark.parametrize(
    "arg", [b"frobnicate", b"peel ", b"PEEL", b"ref-prefix", b"ref-prefixrefs/", b"", b"\xff"]
)
def test_parse_refuses(arg: bytes) -> None:
    with pytest.raises(ClientError, match="unexpected line"):
        parse_ls_refs_args([arg])


def test_too_many_prefixes_means_all_refs() -> None:
    """ls-refs.c: past 65536 prefixes the list is ignored (it would only get slower)."""
    few = parse_ls_refs_args([b"ref-prefix p%d" % i for i in range(TOO_MANY_PREFIXES - 1)])
    assert len(few.prefixes) == TOO_MANY_PREFIXES - 1
    many = parse_ls_refs_args([b"ref-prefix p%d" % i for i in range(TOO_MANY_PREFIXES + 5)])
    assert many.prefixes == ()


def ls(req: LsRefsRequest, head: HeadInfo | None = HEAD, refs=REFS) -> list[bytes]:
    return list(iter_ls_refs(req, head, refs))


def test_plain() -> None:
    assert ls(LsRefsRequest()) == [
        A + b" HEAD\n",
        A + b" refs/heads/alias\n",
        A + b" refs/heads/main\n",
        B + b" refs/heads/topic\n",
        T + b" refs/tags/v1\n",
    ]


def test_symrefs_and_peel() -> None:
    assert ls(LsRefsRequest(peel=True, symrefs=True)) == [
        A + b" HEAD symref-target:refs/heads/main\n",
        A + b" refs/heads/alias symref-target:refs/heads/main\n",
        A + b" refs/heads/main\n",
        B + b" refs/heads/topic\n",
        T + b" refs/tags/v1 peeled:" + B + b"\n",
    ]


def test_detached_head_has_no_symref_target() -> None:
    assert ls(LsRefsRequest(symrefs=True), DETACHED, [])[0] == B + b" HEAD\n"


def test_no_head() -> None:
    out = ls(LsRefsRequest(symrefs=True, unborn=True), None)
    assert out[0] == A + b" refs/heads/alias symref-target:refs/heads/main\n"
    assert len(out) == len(REFS)


@pytest.mark.parametrize(
    ("req", "first"),
    [
        (LsRefsRequest(), None),
        (LsRefsRequest(unborn=True), None),
        (LsRefsRequest(symrefs=True), None),
        (LsRefsRequest(symrefs=True, unborn=True), b"unborn HEAD symref-target:refs/heads/main\n"),
        (LsRefsRequest(symrefs=True, unborn=True, peel=True),
         b"unborn HEAD symref-target:refs/heads/main\n"),
    ],
)
def test_unborn_head(req: LsRefsRequest, first: bytes | None) -> None:
    """ls-refs.c send_possibly_unborn_head: only with both unborn and symrefs."""
    out = ls(req, UNBORN, [])
    assert out == ([] if first is None else [first])


def test_unborn_head_without_target_is_not_sent() -> None:
    assert ls(LsRefsRequest(symrefs=True, unborn=True), HeadInfo(None, None), []) == []


@pytest.mark.parametrize(
    ("prefixes", "names"),
    [
        ((b"refs/heads/",), [b"refs/heads/alias", b"refs/heads/main", b"refs/heads/topic"]),
        ((b"refs/heads/m", b"refs/tags/"), [b"refs/heads/main", b"refs/tags/v1"]),
        ((b"HEAD",), [b"HEAD"]),
        ((b"H",), [b"HEAD"]),
        ((b"refs/nothing/",), []),
        ((b"",), [b"HEAD", b"refs/heads/alias", b"refs/heads/main", b"refs/heads/topic",
                  b"refs/tags/v1"]),
    ],
)
def test_prefixes(prefixes: tuple[bytes, ...], names: list[bytes]) -> None:
    out = ls(LsRefsRequest(prefixes=prefixes))
    assert [line[41:-1] for line in out] == names


def test_peel_only_for_peeled_refs() -> None:
    out = ls(LsRefsRequest(peel=True), None)
    assert [b"peeled:" in line for line in out] == [False, False, False, True]
