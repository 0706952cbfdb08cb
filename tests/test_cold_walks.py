"""The cold path's building blocks against git itself (docs/ARCHITECTURE.md, "Cold path").

* The reverse index (sorted with numpy, or read from a ``.rev`` file, with or without
  64-bit offsets in the ``.idx``) is git's pack order, as ``git show-index`` tells it.
* The tree diff that reads two trees' bytes and parses only where they differ finds the
  same changes as a diff of the fully parsed trees, for every commit of a history made of
  edits, additions, removals, renames, a file turned directory and names that look like
  tree entries.
* A delta's base, from the headers parsed in vector steps, is the one ``git verify-pack``
  names; a filtered clone's layout computed in vector steps is the entry loop's.
* The bitmap walk's object set for each ref (most of them tips without a bitmap) is
  ``git rev-list --objects`` of that ref, and a mirror clone of every layout over HTTP
  passes ``git fsck`` with the same refs.
"""

from __future__ import annotations

import shutil
import subprocess
from array import array
from pathlib import Path

import numpy as np
import pytest
from dulwich.objects import parse_tree
from gitspout.server.core.context import RequestContext
from gitspout.server.graph.bitmapwalk import open_bitmap_index
from gitspout.server.graph.commits import _merge_changes
from gitspout.server.packgen.layout import _SLOW, _compute, _vector_layout
from gitspout.server.store.bitmaps import iter_set_bits
from gitspout.server.store.objformat import OBJ_COMMIT
from gitspout.server.store.odb import PackRegistry
from gitspout.server.store.packs import PackFormatError
from gitspout.server.store.packscan import base_ranks_of, scan_headers
from gitspout.server.store.repos import RepoResolver
from gitspout.server.store.revindex import sort_positions as _sort_positions
from gitutil import Git, fsck, git_env, repo_state, start_server
from hypothesis import assume, given, settings
from hypothesis import strategies as st

LAYOUTS = ("plain", "rev", "large")


class _Stream:
    """A ``git fast-import`` stream: hundreds of commits in well under a second."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.marks = 0
        self.when = 1_600_000_000

    def _data(self, text: str) -> None:
        raw = text.encode()
        self.parts.append(b"data %d\n%s\n" % (len(raw), raw))

    def commit(self, ref: str, changes: dict[str, str | None], message: str,
               parent: int | None = None) -> int:
        self.marks += 1
        self.when += 60
        self.parts.append(f"commit {ref}\nmark :{self.marks}\n"
                          f"committer C <c@example.com> {self.when} +0000\n".encode())
        self._data(message)
        if parent is not None:
            self.parts.append(f"from :{parent}\n".encode())
        for path, content in changes.items():
            if content is None:
                self.parts.append(f"D {path}\n".encode())
            else:
                self.parts.append(f"M 100644 inline {path}\n".encode())
                self._data(content)
        self.parts.append(b"\n")
        return self.marks

    def branch(self, ref: str, mark: int) -> None:
        self.parts.append(f"reset {ref}\nfrom :{mark}\n\n".encode())

    def tag(self, name: str, mark: int) -> None:
        self.parts.append(f"tag {name}\nfrom :{mark}\n"
                          f"tagger C <c@example.com> {self.when} +0000\n".encode())
        self._data(f"release {name}")


def _history(git: Git, repo: Path) -> None:
    """Edits of one file (trees of the same length), several files with new entries,
    removals, a rename, a file turned directory, names with spaces and digits, an annotated
    tag, and side branches left behind more than 100 commits ago (git gives them no
    bitmap) beside a topic branch."""
    s = _Stream()
    files: dict[str, str | None] = {f"src/mod{i:02}.py": f"# module {i}\n" * 3 for i in range(40)}
    files.update({"README": "hello\n", "docs/a b.txt": "spaces\n",
                  "100644 x": "a name that looks like an entry\n", "bin/tool": "x" * 50})
    main = s.commit("refs/heads/main", files, "initial")
    for i in range(60):
        main = s.commit("refs/heads/main", {f"src/mod{(7 * i) % 40:02}.py": f"# edit {i}\n"},
                        f"edit {i}")
        if i % 5 == 0:
            main = s.commit("refs/heads/main", {f"src/mod{i % 40:02}.py": f"# a\n{i}\n",
                                                f"docs/n{i}.md": f"{i}\n", "README": f"hi {i}\n"},
                            f"several {i}")
        if i % 7 == 3:
            side = s.commit(f"refs/heads/side{i}", {f"new/dir{i}/f.txt": f"{i}\n",
                                                   "src/mod03.py": f"# side {i}\n"},
                            f"side {i}", parent=main)
            s.commit(f"refs/heads/side{i}", {f"new/dir{i}/g.txt": f"{i}\n"}, f"side {i} 2",
                     parent=side)
    main = s.commit("refs/heads/main", {"src/mod05.py": None}, "remove")
    main = s.commit("refs/heads/main", {"src/mod06.py": None,
                                        "src/mod06-renamed.py": "# module 6\n" * 3}, "rename")
    main = s.commit("refs/heads/main", {"bin/tool": None, "bin/tool/now-a-dir": "d\n"},
                    "file becomes a directory")
    s.tag("v1", main)
    fork = main
    for i in range(130):
        main = s.commit("refs/heads/main", {f"src/mod{(3 * i) % 40:02}.py": f"# late {i}\n"},
                        f"late {i}")
    topic = fork
    for i in range(4):
        topic = s.commit("refs/heads/topic", {f"topic/{i}.txt": f"{i}\n",
                                              "src/mod02.py": f"# topic {i}\n"},
                         f"topic {i}", parent=topic)
    git.run("init", "-q", "--bare", str(repo))
    git.run("fast-import", "--quiet", cwd=repo, input=b"".join(s.parts))


@pytest.fixture(scope="module")
def layouts(git: Git, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One history served as three bitmapped single-pack layouts: the index's 32-bit
    offsets and no ``.rev``; a ``.rev`` file; 64-bit offsets for most entries."""
    build = tmp_path_factory.mktemp("build")
    root = tmp_path_factory.mktemp("layouts")
    _history(git, build / "src.git")
    for name in LAYOUTS:
        repo = root / f"{name}.git"
        git.run("clone", "-q", "--mirror", str(build / "src.git"), str(repo))
        extra = ["-c", "pack.writeReverseIndex=true"] if name == "rev" else \
            ["-c", "pack.writeReverseIndex=false"]
        git.run(*extra, "repack", "-q", "-adb", cwd=repo)
        packs = list((repo / "objects" / "pack").glob("*.pack"))
        assert len(packs) == 1
        if name == "large":  # index entries past offset 0x100 in the 64-bit table
            idx = packs[0].with_suffix(".idx")
            idx.unlink()
            git.run("index-pack", "--index-version=2,0x100", str(packs[0]), cwd=repo)
        assert packs[0].with_suffix(".rev").exists() == (name == "rev")
        assert packs[0].with_suffix(".bitmap").exists()
    return root


def _context(root: Path, name: str) -> RequestContext:
    return RequestContext(RepoResolver(str(root)).resolve(name), PackRegistry(), b"test")


def _git_pack_order(git: Git, idx: Path) -> list[tuple[int, bytes]]:
    """(offset, id) of every entry in pack order, from ``git show-index``."""
    rows = []
    for line in git.run("show-index", input=idx.read_bytes()).stdout.decode().splitlines():
        off, hx = line.split()[:2]
        rows.append((int(off), bytes.fromhex(hx)))
    return sorted(rows)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_reverse_index_is_git_pack_order(git: Git, layouts: Path, layout: str) -> None:
    ctx = _context(layouts, f"{layout}.git")
    try:
        (pack,) = ctx.odb.packs
        expected = _git_pack_order(git, Path(pack.base + ".idx"))
        if layout == "large":
            assert max(off for off, _ in expected) > 0x100 and pack.offset_at(0) >= 0
        offs = pack.sorted_offsets
        assert list(offs[: pack.count]) == [off for off, _ in expected]
        assert offs[pack.count] == pack.pack_size - pack.hash_len
        for rank, (off, oid) in enumerate(expected):
            pos = pack.find(oid)
            assert pack.pack_order[rank] == pos
            assert pack.rank_of_index_pos(pos) == rank
            assert pack.offset_at(pos) == off
    finally:
        ctx.close()


def _full_diff(old: bytes | None, new: bytes) -> list[tuple[int, bytes, bytes | None]]:
    """What differs, from both trees parsed whole: the reference for ``tree_changes``."""
    known = {n: (m, bytes.fromhex(h.decode())) for n, m, h in parse_tree(old, 20)} if old else {}
    out = []
    for name, mode, hx in parse_tree(new, 20):
        oid = bytes.fromhex(hx.decode())
        prev = known.get(name)
        if prev is None:
            out.append((mode, oid, None))
        elif prev[1] != oid:
            same_kind = (prev[0] & 0o170000 == 0o040000) == (mode & 0o170000 == 0o040000)
            out.append((mode, oid, prev[1] if same_kind else None))
    return out


def test_tree_changes_match_a_full_diff(git: Git, layouts: Path) -> None:
    ctx = _context(layouts, "plain.git")
    try:
        src = ctx.src
        pairs = 0
        fast = 0
        lines = git.out("--git-dir", str(layouts / "plain.git"), "rev-list", "--all",
                        "--parents").splitlines()
        stack = []
        for line in lines:
            commit, *parents = (bytes.fromhex(x) for x in line.split())
            if parents:
                stack.append((src.commit(commit).tree, src.commit(parents[0]).tree))
        seen = set()
        while stack:
            new, old = stack.pop()
            if (new, old) in seen or new == old:
                continue
            seen.add((new, old))
            got = src.tree_changes(new, old)
            assert got == _full_diff(src.tree_data(old), src.tree_data(new)), (new.hex(), old.hex())
            pairs += 1
            fast += len(src.tree_data(new)) == len(src.tree_data(old))
            for mode, oid, base in got:
                if mode & 0o170000 == 0o040000 and base is not None:
                    stack.append((oid, base))
        assert pairs > 60 and fast > 20  # both ways of diffing were taken
        root = src.commit(bytes.fromhex(lines[-1].split()[0])).tree
        assert src.tree_changes(root, None) == _full_diff(None, src.tree_data(root))
    finally:
        ctx.close()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bitmap_walk_of_each_ref_is_rev_list(git: Git, layouts: Path, layout: str) -> None:
    repo = layouts / f"{layout}.git"
    ctx = _context(layouts, f"{layout}.git")
    try:
        bi = open_bitmap_index(ctx.src)
        assert bi is not None
        refs = git.out("--git-dir", str(repo), "for-each-ref", "--format=%(objectname)")
        tips = sorted({bytes.fromhex(x) for x in refs.split()})
        without_bitmap = 0
        for tip in tips:
            target, type_num, _ = ctx.src.peel(tip)
            without_bitmap += type_num == OBJ_COMMIT and bi.bm.bitmap_at(bi.pack.find(target)) is None
            reach = bi.reach([tip])
            listed = git.out("--git-dir", str(repo), "rev-list", "--objects", tip.hex())
            expected = {bytes.fromhex(line[:40]) for line in listed.splitlines()}
            got = {bi.pack.oid_at(bi.pack.pack_order[r])
                   for r in range(bi.pack.count) if reach.test(r)}
            assert got | set(reach.extra) == expected, tip.hex()
        assert without_bitmap >= 1
    finally:
        ctx.close()


def test_mirror_clone_of_each_layout(git: Git, layouts: Path, tmp_path: Path) -> None:
    server = start_server(layouts)
    try:
        for layout in LAYOUTS:
            out = tmp_path / f"{layout}.git"
            subprocess.run(["git", "clone", "-q", "--mirror", f"{server.url}/{layout}.git",
                            str(out)], env=git_env(git.home), check=True, capture_output=True,
                           timeout=120)
            fsck(git, out)
            assert repo_state(git, out) == repo_state(git, layouts / f"{layout}.git")
            shutil.rmtree(out)
    finally:
        server.stop()


_MODES = (0o100644, 0o100755, 0o040000, 0o120000, 0o160000)


def _raw_tree(entries: dict[bytes, tuple[int, bytes]]) -> bytes:
    """A tree's bytes in git's order (a directory sorts as its name plus "/")."""
    def order(name: bytes) -> bytes:
        return name + b"/" if entries[name][0] == 0o040000 else name
    return b"".join(b"%o %s\0%s" % (entries[n][0], n, entries[n][1]) for n in sorted(entries, key=order))


# Names of "A", "-" and "." ("-" and "." sort before "/"): "A-" comes before the
# directory "A" but after the file "A".
_names = st.binary(min_size=1, max_size=3).map(lambda b: bytes(b"A-.B"[c % 4] for c in b))
# Ids of few distinct bytes, NULs and spaces among them: a parser that looked for them
# inside an id would go wrong.
_ids = st.binary(min_size=20, max_size=20).map(lambda b: bytes(c % 3 * 16 for c in b))
_trees = st.dictionaries(_names, st.tuples(st.sampled_from(_MODES), _ids), max_size=12)


@given(old=_trees, edits=st.lists(st.tuples(_names, st.none() | st.tuples(st.sampled_from(_MODES), _ids)),
                                   max_size=4))
@settings(max_examples=400, deadline=None)
def test_merge_changes_match_a_full_diff(old: dict[bytes, tuple[int, bytes]],
                                          edits: list[tuple[bytes, tuple[int, bytes] | None]]) -> None:
    """Random trees and random edits (entries added, removed, retyped, given new ids): the
    merge that parses only where the trees differ finds what a whole parse finds."""
    new = dict(old)
    for name, value in edits:
        if value is None:
            new.pop(name, None)
        else:
            new[name] = value
    a, b = _raw_tree(new), _raw_tree(old)

    def kind(mode: int) -> int:  # a tree, a gitlink, or a file of any mode
        return mode & 0o170000 if mode & 0o170000 in (0o040000, 0o160000) else 0

    # An id names one object, of one type: a file that became a directory (or a gitlink)
    # has another id. With the same one, whether the merge sees a change depends on the
    # entries between the two places the name sorts at.
    assume(all(kind(old[n][0]) == kind(m) for n, (m, oid) in new.items()
               if n in old and old[n][1] == oid))

    expected = [(mode, oid, None if name not in old else old[name][1] if kind(old[name][0]) == kind(mode)
                 else None)
                for name, mode, oid in ((n, m, bytes.fromhex(h.decode())) for n, m, h in parse_tree(a, 20))
                if name not in old or old[name][1] != oid]
    assert _merge_changes(a, b, 20) == expected


@given(st.sets(st.integers(0, (1 << 40) - 1), max_size=300),
       st.sampled_from([1 << 16, 1 << 32, 1 << 40, 1 << 63]))
@settings(max_examples=300, deadline=None)
def test_sort_positions_is_argsort(offsets: set[int], limit: int) -> None:
    """The radix sort of the reverse index orders index positions as argsort does, and
    gives the offsets in that order: with one pass (offsets under 64 KiB), on 32-bit keys
    (a pack under 4 GiB, two passes) and on 64-bit ones (three passes, or four)."""
    values = np.array(sorted({v % limit for v in offsets}, key=lambda v: (v * 2654435761) % 1000003),
                      dtype=np.uint64)
    order, in_order = _sort_positions(values, limit)
    assert order.tolist() == np.argsort(values).tolist()
    assert in_order.tolist() == sorted(values.tolist())


@given(st.integers(0, 1 << 600), st.integers(1, 600))
@settings(max_examples=200, deadline=None)
def test_iter_set_bits_lists_the_bits_below_the_limit(value: int, limit: int) -> None:
    value &= (1 << limit) - 1
    assert iter_set_bits(value, limit) == [i for i in range(limit) if value >> i & 1]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_find_before_and_after_the_prefix_array(git: Git, layouts: Path, layout: str) -> None:
    """The first lookups of a pack bisect its names in Python; later ones bisect the prefix
    array. Both find every id at its index position, and neither finds an absent id (one
    that shares its first 4 bytes with a present one, one past the last of its fan-out
    bucket, one before the first)."""
    ctx = _context(layouts, f"{layout}.git")
    try:
        (pack,) = ctx.odb.packs
        ids = [pack.oid_at(i) for i in range(pack.count)]
        absent = [i[:4] + bytes(16) for i in ids] + [i[:-1] + bytes([(i[-1] + 1) % 256]) for i in ids]
        absent += [bytes(20), b"\xff" * 20]
        absent = [a for a in absent if a not in set(ids)]
        assert pack._prefixes is None
        slow = [pack._bisect_names(i) for i in ids] + [pack._bisect_names(a) for a in absent]
        fast = [pack.find(i) for i in ids] + [pack.find(a) for a in absent]
        assert pack._prefixes is not None, "the prefix array is built after enough lookups"
        assert slow == fast == list(range(len(ids))) + [-1] * len(absent)
    finally:
        ctx.close()


def _git_base_ranks(git: Git, pack: Path) -> list[int]:
    """Per pack-order rank, the base's rank for a delta and the rank itself otherwise, from
    ``git verify-pack -v`` (git names a delta's base by id)."""
    rows = []
    for line in git.out("verify-pack", "-v", str(pack.with_suffix(".idx"))).splitlines():
        parts = line.split()
        if len(parts) >= 5 and len(parts[0]) == 40 and parts[1] in ("commit", "tree", "blob", "tag"):
            rows.append((int(parts[4]), parts[0], parts[6] if len(parts) == 7 else None))
    rows.sort()
    rank_of = {oid: rank for rank, (_, oid, _) in enumerate(rows)}
    return [rank_of[base] if base else rank for rank, (_, _, base) in enumerate(rows)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_base_ranks_are_git_delta_bases(git: Git, layouts: Path, layout: str) -> None:
    """Every entry's base rank, from the headers parsed in vector steps (packscan.py), is
    the base ``git verify-pack`` names, and what the per-entry header parser finds."""
    ctx = _context(layouts, f"{layout}.git")
    try:
        (pack,) = ctx.odb.packs
        got = list(base_ranks_of(pack))
        assert got == _git_base_ranks(git, Path(pack.base + ".pack"))
        assert got == [pack.base_rank_at(r) for r in range(pack.count)]
        assert sum(1 for r, b in enumerate(got) if r != b) > pack.count // 4, "deltas to check"
    finally:
        ctx.close()


def _closed_under_bases(keep: np.ndarray, bases: np.ndarray) -> np.ndarray:
    while True:
        need = bases[keep]
        need = need[need >= 0]
        if keep[need].all():
            return keep
        keep[need] = True


@pytest.mark.parametrize("layout", LAYOUTS)
@given(seed=st.integers(0, 1 << 32), share=st.floats(0.01, 1.0), closed=st.booleans())
@settings(max_examples=60, deadline=None)
def test_vector_layout_is_the_entry_loop(git: Git, layouts: Path, layout: str, seed: int,
                                         share: float, closed: bool) -> None:
    """A filtered clone's layout computed in vector steps (every delta's base selected)
    is the one the entry-by-entry loop computes, field by field: the same rewritten
    distances, literals and segments. A selection that leaves a base out is None for
    both, or handed to the loop when bases may be written whole."""
    ctx = _context(layouts, f"{layout}.git")
    try:
        (pack,) = ctx.odb.packs
        bases = np.frombuffer(base_ranks_of(pack), dtype=np.int32)
        keep = np.random.default_rng(seed).random(pack.count) < share
        if closed:
            keep = _closed_under_bases(keep, bases)
        order = array("I", np.flatnonzero(keep).astype(np.uint32).tobytes())
        if not order:
            return
        fast = _vector_layout(pack, order, False)
        slow = _compute(pack, order, None, 6)
        if closed:
            assert fast is not None and slow is not None
        assert (fast is None) == (slow is None)
        if fast is not None and slow is not None:
            assert fast == slow
        if not closed and fast is None and slow is None:
            assert _vector_layout(pack, order, True) is _SLOW
    finally:
        ctx.close()


def test_scan_refuses_a_bad_entry_type(git: Git, layouts: Path, tmp_path: Path) -> None:
    """An entry whose header names type 5 (reserved), runs past the pack, or has a size
    varint over 10 bytes is a corrupt pack."""
    src = layouts / "plain.git" / "objects" / "pack"
    for damage in ("type", "truncated", "long"):
        root = tmp_path / damage
        shutil.copytree(layouts / "plain.git", root / "r.git")
        (pack_path,) = (root / "r.git" / "objects" / "pack").glob("*.pack")
        ctx = _context(root, "r.git")
        try:
            (pack,) = ctx.odb.packs
            ranks = np.arange(pack.count, dtype=np.int64)
            last = pack.sorted_offsets[pack.count - 1]
            raw = bytearray(pack_path.read_bytes())
            if damage in ("type", "long"):
                if damage == "type":
                    raw[last] = (raw[last] & 0x8F) | (5 << 4)
                else:  # a size varint of 11 bytes (git's longest is 10)
                    for i in range(last, last + 10):
                        raw[i] |= 0x80
                    raw[last + 10] &= 0x7F
                pack_path.write_bytes(raw)  # same inode: the open descriptor reads it
            else:
                with open(pack_path, "r+b") as f:
                    f.truncate(last + 1)
                    f.seek(last)
                    f.write(bytes([raw[last] | 0x80]))  # its size varint goes on past the end
            with pytest.raises(PackFormatError, match="bad object type 5|truncated"):
                scan_headers(pack, ranks)
        finally:
            ctx.close()
    assert src.exists()
