import sys; sys.path.insert(0, "/tmp/rv-sec")
from harness import *
root = "/tmp/rv-sec/t1/root"
I = ids = json.load(open("/tmp/rv-sec/t1/packed.git.ids.json"))
port = int(sys.argv[1]); modes = sys.argv[2:]
hidden = {ids[k] for k in HIDDEN_KEYS}
inv = {v: k for k, v in ids.items()}
def scan(label, st, r):
    found = [inv[h] for h in hidden if h.encode() in r]
    names = [n for n in (b"refs/hidden", b"secret-tag") if n in r]
    print(("LEAK " if found or names else "ok   ") + label, st, found, names)
    if os.environ.get("V") == "1" or found or names: print("     ", r[:1500])
with Server(root, port) as s:
    for m in modes:
        repo = f"{root}/{m}.git"
        st, r = info_refs(s.base, f"{m}.git"); scan(f"{m} info/refs v0", st, r)
        st, r = info_refs(s.base, f"{m}.git", v2=True); scan(f"{m} info/refs v2", st, r)
        for args in ([], ["peel", "symrefs"], ["ref-prefix refs/hidden"], ["ref-prefix refs/hidden/", "peel", "symrefs"], ["ref-prefix refs/tags/secret", "peel"], ["ref-prefix r"], ["ref-prefix ", "peel", "symrefs", "unborn"], ["ref-prefix HEAD", "symrefs"]):
            st, r = post(s.base, f"{m}.git", v2_cmd("ls-refs", args), v2=True); scan(f"{m} ls-refs {args}", st, r)
        for k in ["h1","h1_tree","h1_secret","h1_big","h3","secret_tag","hidtagobj","dangling_blob","c2","vis_big"]:
            st, r = post(s.base, f"{m}.git", v2_cmd("object-info", ["size", f"oid {I[k]}"]), v2=True)
            print(f"{m} object-info {k}", st, r[:200])
        for wr in ("refs/hidden/secret", "refs/tags/secret-tag", "refs/hidden/tags/hidc1", "refs/hidden", "hidden/secret", "refs/heads/main", "refs/hidden//secret", "refs//hidden/secret", "refs/hidden/./secret", "refs/heads/../hidden/secret", "refs/Hidden/secret", "HEAD"):
            st, r = post(s.base, f"{m}.git", v2_cmd("fetch", [f"want-ref {wr}", "ofs-delta", "no-progress", "done"]), v2=True)
            show(analyze(st, r, ids, repo, f"{m} want-ref {wr}"))
        # include-tag: want c2 / c1 and ask include-tag; hidden tags hidc1 (->c1), hidtagobj (->c2)
        for w in ("c1", "c2"):
            st, r = post(s.base, f"{m}.git", v2_cmd("fetch", [f"want {I[w]}", "include-tag", "ofs-delta", "no-progress", "done"]), v2=True)
            show(analyze(st, r, ids, repo, f"{m} v2 include-tag want {w}"))
            st, r = post(s.base, f"{m}.git", v0_body([I[w]], caps="side-band-64k ofs-delta include-tag no-progress"))
            show(analyze(st, r, ids, repo, f"{m} v0 include-tag want {w}"))
