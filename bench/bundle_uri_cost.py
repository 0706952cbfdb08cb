"""What one v2 ``bundle-uri`` command costs the server once gitspout has a bundle of the
repository (issue 29), in process: a fresh request view each time, as a request gets
(refs validated by stat, I2), then ``read_command``. ls-refs beside it for scale.

    python -m bench.bundle_uri_cost --root bench/work/real --repo dulwich-gc.git [--n 2000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from gitspout.server.app.config import Config
from gitspout.server.app.state import ServerState
from gitspout.server.core.commands import read_command


def _pkt(line: str) -> bytes:
    data = line.encode() + b"\n"
    return b"%04x" % (len(data) + 4) + data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--repo", required=True)
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as where:
        cfg = Config(root=args.root, bundles=True, bundle_dir=where)
        state = ServerState.create(cfg)
        assert state.bundles is not None
        repo = state.resolver.resolve(args.repo)
        ctx = state.detached_view(repo)
        t0 = time.perf_counter()
        written = state.bundles.write(ctx)
        ctx.close()
        print(f"bundle written in {time.perf_counter() - t0:.2f} s: {written is not None}")
        bodies = {
            "bundle-uri": _pkt("command=bundle-uri") + _pkt("object-format=sha1") + b"0000",
            "ls-refs": _pkt("command=ls-refs") + _pkt("object-format=sha1") + b"0001"
            + _pkt("peel") + _pkt("symrefs") + _pkt("ref-prefix refs/heads/") + b"0000",
        }
        for name, body in bodies.items():
            times = []
            for i in range(args.n):
                ctx = state.detached_view(repo)
                ctx.bundle_offer = state.bundles.offer("http://h", args.repo)
                t = time.perf_counter()
                cmd = read_command(ctx, body)
                times.append(time.perf_counter() - t)
                ctx.close()
                if i == 0 and name == "bundle-uri":
                    assert cmd is not None and b"creationtoken" in b"".join(
                        getattr(cmd, "chunks", [])), "no bundle offered"
            times.sort()
            print(f"{name}: median {statistics.median(times) * 1e6:.0f} us, "
                  f"p90 {times[int(0.9 * len(times))] * 1e6:.0f} us, "
                  f"first {times[0] * 1e6:.0f} us min over {args.n}")
        state.bundles.close()
        state.pool.shutdown(wait=False)


if __name__ == "__main__":
    main()
