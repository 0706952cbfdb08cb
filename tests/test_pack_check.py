"""server/packgen/verify.py PackCheck on packs git wrote: whole ones pass in pieces of any
size; a flipped byte anywhere, a cut, or bytes added fail."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from gitspout.server.packgen.verify import PackCheck
from gitutil import Committer, Git


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory, git: Git) -> dict[str, bytes]:
    """A pack with deltas (ofs and ref), small trees, and a large blob that compresses to
    little (it inflates past PackCheck's piece); and an empty pack."""
    work = tmp_path_factory.mktemp("pcwork") / "w"
    git.run("init", "-q", "-b", "main", str(work))
    c = Committer(git, work)
    rnd = random.Random(7)
    lines = [f"line {i}: {rnd.random()}\n" for i in range(400)]
    for n in range(12):
        lines[n * 13] = f"changed in {n}\n"
        c.commit({"f.txt": "".join(lines), f"d{n % 3}/g.txt": f"{n}\n" * 50,
                  "zeros.bin": b"\0" * (3 << 20) + bytes([n])}, f"c{n}")
    out = {}
    for name, extra in (("ofs", []), ("ref", ["--no-reuse-delta"])):
        revs = git.out("rev-list", "--objects", "main", cwd=work).encode()
        args = ["pack-objects", "--stdout", *extra] + ([] if name == "ofs" else [])
        if name == "ref":
            # Without --delta-base-offset in a v2 pack, deltas name their base by id.
            out[name] = git.run(*args, cwd=work, input=revs).stdout
        else:
            out[name] = git.run(*args, "--delta-base-offset", cwd=work, input=revs).stdout
    out["empty"] = git.run("pack-objects", "--stdout", cwd=work, input=b"").stdout
    return out


def _check(data: bytes, step: int) -> str | None:
    check = PackCheck()
    for i in range(0, len(data), step):
        check.feed(data[i:i + step])
    return check.fault()


@pytest.mark.parametrize("kind", ["ofs", "ref", "empty"])
@pytest.mark.parametrize("step", [1, 5, 300, 65536, 1 << 30])
def test_whole_packs_pass(packs: dict[str, bytes], kind: str, step: int) -> None:
    data = packs[kind]
    if step == 1 and len(data) > 50_000:
        step = 3  # a byte at a time: slow in Python for the large pack, 3 is as tricky
    assert _check(data, step) is None


def test_packs_have_both_delta_kinds(packs: dict[str, bytes], git: Git, tmp_path: Path) -> None:
    """The fixture's packs hold what they are meant to: the check sees each entry kind."""
    kinds = {}
    for name in ("ofs", "ref"):
        data = packs[name]
        kinds[name] = {(data[i] >> 4) & 7 for i in _entry_offsets(git, tmp_path, name, data)}
    assert 6 in kinds["ofs"] and 7 in kinds["ref"]


def _entry_offsets(git: Git, tmp_path: Path, name: str, data: bytes) -> list[int]:
    pack = tmp_path / f"{name}.pack"
    pack.write_bytes(data)
    git.run("index-pack", str(pack))
    idx = pack.with_suffix(".idx").read_bytes()
    return [int(line.split()[0]) for line in
            git.out("show-index", input=idx).splitlines()]


@pytest.mark.parametrize("kind", ["ofs", "ref"])
def test_damage_anywhere_fails(packs: dict[str, bytes], kind: str) -> None:
    data = packs[kind]
    rnd = random.Random(11)
    for at in [12, 13, len(data) // 2, len(data) - 21, len(data) - 1,
               *(rnd.randrange(12, len(data)) for _ in range(40))]:
        bad = bytearray(data)
        bad[at] ^= 1 << rnd.randrange(8)
        assert _check(bytes(bad), 4096) is not None, at
    for cut in (11, 40, len(data) // 3, len(data) - 20, len(data) - 1):
        assert _check(data[:cut], 4096) is not None, cut
    assert _check(data + b"\0", 4096) is not None
