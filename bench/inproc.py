"""In-process CPU of one request, cold (a fresh ServerState) and warm, for A/B comparisons.

Runs the request path without HTTP (resolve, plan, produce the pack) in one thread, so the
CPU time is the server's alone, without the noise of a shared machine's sockets and pool:

    python bench/inproc.py new ROOT REPO clone|blobless|fetch1|adv N
    PYTHONPATH=OLD_TREE python bench/inproc.py old ROOT REPO clone N   # a tree from before
                                                                       # the gitspout import root

``old`` imports the layout of revisions before the move to ``gitspout.server`` (712c52b and
earlier); ``new`` the installed package. Prints medians of N cold and 3N warm requests.
"""
import statistics
import subprocess
import sys
import time

layout, root, repo, mode, n = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
if layout == "old":
    from server.config import load_config
    from server.http import ServerState
    from server.metrics import RequestRecord
    from server.upload import iter_pack, plan_fetch

    from protocol.fetch_request import parse_v2_fetch_args
    def features(ctx):  # type: ignore[no-untyped-def]
        return ctx.v2_features()

    def adv(ctx):  # type: ignore[no-untyped-def]
        return ctx.encoded(("v0", 0), lambda: ctx.v0_advertisement(0))
else:
    from gitspout.protocol.fetch_request import parse_v2_fetch_args
    from gitspout.server.app.config import load_config
    from gitspout.server.app.metrics import RequestRecord
    from gitspout.server.app.state import ServerState
    from gitspout.server.core import answers
    from gitspout.server.core.fetch import plan_fetch
    from gitspout.server.packgen import PackStream

    def iter_pack(ctx, plan):  # type: ignore[no-untyped-def]
        return PackStream(plan.order, ctx.objects()) if plan.order is not None else iter(())

    def features(ctx):  # type: ignore[no-untyped-def]
        return answers.v2_features(ctx)

    def adv(ctx):  # type: ignore[no-untyped-def]
        return answers.encoded(ctx, ("v0", 0), lambda: answers.v0_advertisement(ctx, 0))
cfg = load_config({"root": root}, env={})
have = subprocess.run(["git","-C",f"{root}/{repo}","rev-parse","HEAD~1"],capture_output=True).stdout.strip()
def run(state: ServerState) -> int:
    ctx = (state.context(state.resolver.resolve(repo), RequestRecord()) if layout == "old"
           else state.view(state.scope(RequestRecord()), state.resolver.resolve(repo)))
    if mode == "adv":
        return sum(len(c) for c in adv(ctx))
    head, refs = ctx.visible()
    if mode == "fetch1":
        lines = [b"want " + head.oid, b"have " + have, b"thin-pack"]
    else:
        lines = [b"want " + w for w in sorted({r.oid for r in refs})]
        if mode == "blobless":
            lines.append(b"filter blob:none")
    lines += [b"ofs-delta", b"no-progress", b"done"]
    req = parse_v2_fetch_args(lines, features(ctx), ctx.hash_len * 2)
    plan = plan_fetch(ctx, req)
    return sum(len(c) for c in iter_pack(ctx, plan) if isinstance(c, (bytes, bytearray, memoryview)))


def timed(state: ServerState) -> float:
    start = time.process_time()
    run(state)
    return time.process_time() - start


cold: list[float] = []
warm: list[float] = []
for _ in range(n):
    state = ServerState.create(cfg)
    cold.append(timed(state))
    warm.extend(timed(state) for _ in range(3))
print(f"{layout} {repo} {mode}: cold median {statistics.median(cold) * 1000:.1f} ms, "
      f"warm median {statistics.median(warm) * 1000:.1f} ms (n={n})")
