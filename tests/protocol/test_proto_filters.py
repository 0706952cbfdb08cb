"""protocol.filters: every filter-spec form, combine: with %-encoding, sizes, errors."""

from __future__ import annotations

import pytest
from gitspout.protocol.errors import ClientError
from gitspout.protocol.filters import (
    BlobLimit,
    BlobNone,
    Combine,
    ObjectType,
    SparseOid,
    TreeDepth,
    filter_config_name,
    format_filter_spec,
    iter_filter_leaves,
    parse_filter_spec,
)


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("blob:none", BlobNone()),
        ("blob:limit=0", BlobLimit(0)),
        ("blob:limit=1024", BlobLimit(1024)),
        ("blob:limit=1k", BlobLimit(1024)),
        ("blob:limit=1K", BlobLimit(1024)),
        ("blob:limit=3m", BlobLimit(3 << 20)),
        ("blob:limit=3M", BlobLimit(3 << 20)),
        ("blob:limit=2g", BlobLimit(2 << 30)),
        ("blob:limit=2G", BlobLimit(2 << 30)),
        ("blob:limit=007", BlobLimit(7)),
        # C git reads the number with strtoumax in base 0 (parse.c git_parse_unsigned)
        ("blob:limit=010", BlobLimit(8)),
        ("blob:limit=0x10", BlobLimit(16)),
        ("blob:limit=0X1fk", BlobLimit(31 << 10)),
        ("blob:limit=+1", BlobLimit(1)),
        ("blob:limit= \t5", BlobLimit(5)),
        ("blob:limit=18446744073709551615", BlobLimit((1 << 64) - 1)),
        ("blob:limit=16777215g", BlobLimit(((1 << 24) - 1) << 30)),
        ("tree:0x2", TreeDepth(2)),
        ("tree:0", TreeDepth(0)),
        ("tree:3", TreeDepth(3)),
        ("tree:1k", TreeDepth(1024)),
        ("object:type=blob", ObjectType("blob")),
        ("object:type=tree", ObjectType("tree")),
        ("object:type=commit", ObjectType("commit")),
        ("object:type=tag", ObjectType("tag")),
        ("sparse:oid=main:.sparse", SparseOid("main:.sparse")),
        ("sparse:oid=", SparseOid("")),
        ("combine:blob:none+tree:2", Combine((BlobNone(), TreeDepth(2)))),
        ("combine:tree:0", Combine((TreeDepth(0),))),
        ("combine:blob%3Anone+tree%3A2", Combine((BlobNone(), TreeDepth(2)))),
        ("combine:blob%3anone+blob%3alimit%3d1k", Combine((BlobNone(), BlobLimit(1024)))),
        (
            "combine:sparse%3Aoid%3Dmain%3A.a%2Bb+object:type=blob",
            Combine((SparseOid("main:.a+b"), ObjectType("blob"))),
        ),
        ("combine:sparse:oid=a%25b", Combine((SparseOid("a%b"),))),
    ],
)
def test_parse(text: str, spec: object) -> None:
    assert parse_filter_spec(text) == spec
    assert parse_filter_spec(text.encode()) == spec


@pytest.mark.parametrize(
    "text",
    [
        "",
        "blob",
        "blob:",
        "blob:none ",
        " blob:none",
        "blob:nonE",
        "blob:limit=",
        "blob:limit=k",
        "blob:limit=-1",
        "blob:limit=1t",
        "blob:limit=1kb",
        "blob:limit=1 ",
        "blob:limit=1.5",
        "blob:limit=08",
        "blob:limit=0x",
        "blob:limit=+",
        "blob:limit=++1",
        "blob:limit=1-",
        "blob:limit=18446744073709551616",
        "blob:limit=99999999999999999999",
        "blob:limit=17179869184g",
        "blob:limit=\u0661",  # ARABIC-INDIC DIGIT ONE: isdigit() but not ASCII
        "tree:",
        "tree:x",
        "tree:-1",
        "tree:\u00b2",  # SUPERSCRIPT TWO
        "object:type=",
        "object:type=blobs",
        "object:type=BLOB",
        "sparse:path=/x",
        "sparse:oid",
        "combine:",
        "combine:+",
        "combine:blob:none+",
        "combine:+blob:none",
        "combine:blob:none++tree:1",
        "combine:blob%3",
        "combine:blob%3Xnone",
        "combine:blob%%none",
        "combine:bogus",
        "combine:combine:blob:none",
        "combine:combine%3Ablob%3Anone",
        "combine:combine%3Ablob%3Anone%2Btree%3A1",
        "unknown",
        "x" * 5000,
        "combine:" + "+".join(["blob:none"] * 65),
    ],
)
def test_parse_refuses(text: str) -> None:
    with pytest.raises(ClientError) as info:
        parse_filter_spec(text)
    assert info.value.http_status == 400
    assert "filter-spec" in info.value.message


def test_parse_refuses_non_utf8() -> None:
    with pytest.raises(ClientError, match="UTF-8"):
        parse_filter_spec(b"blob:\xffnone")


def test_combine_up_to_64_parts() -> None:
    spec = parse_filter_spec("combine:" + "+".join(["blob:none"] * 64))
    assert isinstance(spec, Combine) and len(spec.filters) == 64


def test_spec_length_limit() -> None:
    assert parse_filter_spec("sparse:oid=" + "a" * (4096 - 11)) == SparseOid("a" * 4085)
    with pytest.raises(ClientError):
        parse_filter_spec("sparse:oid=" + "a" * (4097 - 11))


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        (BlobNone(), "blob:none"),
        (BlobLimit(1024), "blob:limit=1024"),  # sizes fully expanded
        (TreeDepth(0), "tree:0"),
        (ObjectType("commit"), "object:type=commit"),
        (SparseOid("HEAD:x"), "sparse:oid=HEAD:x"),
        (Combine((BlobNone(), TreeDepth(1))), "combine:blob:none+tree:1"),
        (Combine((SparseOid("a+b c%~"),)), "combine:sparse:oid=a%2bb%20c%25%7e"),
        (Combine((SparseOid("é"),)), "combine:sparse:oid=%c3%a9"),
    ],
)
def test_format(spec: object, text: str) -> None:
    assert format_filter_spec(spec) == text  # type: ignore[arg-type]
    assert parse_filter_spec(text) == spec


def test_format_then_parse_expands_sizes() -> None:
    assert format_filter_spec(parse_filter_spec("blob:limit=2k")) == "blob:limit=2048"


def test_format_refuses_other_types() -> None:
    with pytest.raises(TypeError):
        format_filter_spec("blob:none")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        (BlobNone(), "blob:none"),
        (BlobLimit(1), "blob:limit"),
        (TreeDepth(1), "tree"),
        (ObjectType("tag"), "object:type"),
        (SparseOid("x"), "sparse:oid"),
        (Combine((BlobNone(),)), "combine"),
    ],
)
def test_filter_config_name(spec: object, name: str) -> None:
    assert filter_config_name(spec) == name  # type: ignore[arg-type]


def test_filter_config_name_refuses_other_types() -> None:
    with pytest.raises(TypeError):
        filter_config_name(None)  # type: ignore[arg-type]


def test_iter_filter_leaves() -> None:
    assert iter_filter_leaves(BlobNone()) == [BlobNone()]
    both = Combine((BlobNone(), TreeDepth(1)))
    assert iter_filter_leaves(both) == [BlobNone(), TreeDepth(1)]


def test_specs_are_frozen_and_hashable() -> None:
    assert len({BlobNone(), BlobNone(), BlobLimit(1), BlobLimit(1)}) == 2
    with pytest.raises(AttributeError):
        BlobLimit(1).limit = 2  # type: ignore[misc]


# Numbers C git reads one way or refuses; each also in a unit. C git's own parser is the
# ground truth: ``git rev-list --filter`` reads the spec as upload-pack does.
GROUND_TRUTH_NUMBERS = ["0x10", "0X11", "+9", " 9", "\t9", "010", "011", "08", "0x", "0xg", "+",
                        "++1", "1-", "-0", "0", "00", "17", "017k", "0x1k", "9 ", "9kb", "9t",
                        "18446744073709551615", "18446744073709551616", "16777215g",
                        "16777216g", "17179869183g", "17179869184g", "99999999999999999999"]


def test_numbers_read_as_c_git_reads_them(tmp_path) -> None:
    """Accepted exactly when C git accepts; and read as the same number: with blobs of
    8 to 18 bytes, ``blob:limit=<n>`` omits what C git omits (blobs of n bytes or more)."""
    import subprocess

    env = {"GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(tmp_path / "r"), *args], capture_output=True,
                              text=True, env=env, timeout=60)

    subprocess.run(["git", "init", "-q", str(tmp_path / "r")], check=True, env=env)
    sizes = {}
    for n in range(8, 19):
        (tmp_path / "r" / f"f{n}").write_bytes(b"x" * (n - 1) + b"\n")
    git("add", ".")
    git("-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", "m")
    for line in git("ls-tree", "-l", "HEAD").stdout.splitlines():
        meta, _, name = line.partition("\t")
        sizes[meta.split()[2]] = int(meta.split()[3])
    checked = 0
    for number in GROUND_TRUTH_NUMBERS:
        text = f"blob:limit={number}"
        theirs = git("rev-list", "--objects", f"--filter={text}", "HEAD")
        try:
            ours = parse_filter_spec(text)
        except ClientError:
            assert theirs.returncode != 0, f"{text!r}: C git accepts it, we refuse it"
            continue
        assert theirs.returncode == 0, f"{text!r}: C git refuses it ({theirs.stderr.strip()})"
        assert isinstance(ours, BlobLimit)
        kept = {line.split()[0] for line in theirs.stdout.splitlines()} & sizes.keys()
        assert kept == {oid for oid, size in sizes.items() if size < ours.limit}, text
        checked += 1
    assert checked >= 10
