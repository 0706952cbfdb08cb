"""Build the gc and unmaintained variants of real repositories on disk.

Sources are bare repositories already on this machine (they are only read):

* ``dulwich`` -- /work/.mirror/jelmer+dulwich/repo (~57k objects, 2k refs)
* ``git``     -- /work/.mirror/git+git/repo (~849k objects, 500 MB pack)

Results go to ``bench/work/real/<name>-gc.git`` and
``<name>-unmaintained.git`` (see :mod:`bench.variants` for the shapes).
Existing results are reused; nothing here is ever committed.

    python bench/prepare_real.py [NAME ...] [--out DIR] [--skip-unmaintained NAME]
                                 [--verify]

The gc variant keeps the upstream deltas (``repack -adb`` without ``-f``);
for git/git the bitmap repack still takes a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.variants import make_variants, verify_same_content  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = BENCH_DIR / "work" / "real"
REAL_REPOS: dict[str, Path] = {
    "dulwich": Path("/work/.mirror/jelmer+dulwich/repo"),
    "git": Path("/work/.mirror/git+git/repo"),
}


def prepare(name: str, out: Path, *, unmaintained: bool = True,
            verify: bool = False) -> None:
    """Build (or reuse) both variants of the real repository *name*."""
    src = REAL_REPOS[name]
    if not (src / "HEAD").is_file() or not (src / "objects").is_dir():
        raise SystemExit(f"{name}: source {src} is not a git directory")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    for label, info in make_variants(src, out, name, unmaintained=unmaintained):
        print(f"{name} {label}: {info.summary()}", flush=True)
    if verify and unmaintained:
        t1 = time.monotonic()
        n = verify_same_content(out / f"{name}-gc.git", out / f"{name}-unmaintained.git")
        print(f"{name}: gc and unmaintained hold the same {n} reachable objects "
              f"(checked in {time.monotonic() - t1:.1f}s)", flush=True)
    print(f"{name}: done in {time.monotonic() - t0:.1f}s", flush=True)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description="Prepare real-repository benchmark fixtures")
    ap.add_argument("names", nargs="*", metavar="NAME",
                    help=f"which repositories among {sorted(REAL_REPOS)} (default: all)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--skip-unmaintained", action="append", default=[], metavar="NAME",
                    choices=list(REAL_REPOS), help="only build the gc variant of NAME")
    ap.add_argument("--verify", action="store_true",
                    help="check both variants hold the same refs and reachable objects")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.names) - set(REAL_REPOS))
    if unknown:
        ap.error(f"unknown repositories {unknown}; known: {sorted(REAL_REPOS)}")
    for name in args.names or REAL_REPOS:
        prepare(name, args.out.resolve(), unmaintained=name not in args.skip_unmaintained,
                verify=args.verify)
    return 0


if __name__ == "__main__":
    sys.exit(main())
