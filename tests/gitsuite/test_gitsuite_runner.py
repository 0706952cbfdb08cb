"""The git test-suite runner's pure parts: git's TAP parsed, two runs compared, the report,
and the Apache routing rules (make test-git-suite itself needs git's source: not here)."""

from __future__ import annotations

import re
from pathlib import Path

from gitsuite_apache import proxy_conf, wrapper_script
from gitsuite_run import http_scripts, resolve_scripts
from gitsuite_tap import ScriptResult, compare, format_report, parse_tap, verbose_section

# Shaped like git 2.55's t/test-lib.sh output (--verbose-log: TAP only on stdout).
STOCK_TAP = """\
ok 1 - setup repository
ok 2 - clone http repository
ok 3 # skip clone with trace (missing EXPENSIVE)
not ok 4 - fetch a namespace # TODO known breakage
ok 5 - no-op fetch # TODO known breakage vanished
ok 6 - http.uploadpack false
not ok 7 - flaky one
# still have 1 known breakage(s)
# failed 1 among remaining 6 test(s)
1..7
"""
GITSPOUT_TAP = STOCK_TAP.replace("ok 6 - http.uploadpack false",
                                 "not ok 6 - http.uploadpack false").replace(
    "not ok 7 - flaky one", "ok 7 - flaky one").replace(
    "ok 2 - clone http repository", "ok 2 - clone http repository\n#\tgit clone ... ok 9 - x")


def test_parse_counts_as_prove_does() -> None:
    r = parse_tap("t5551-http-fetch-smart", STOCK_TAP.splitlines(keepends=True))
    assert r.plan == 7 and r.skip_all is None
    assert {n: t.status for n, t in r.tests.items()} == {
        1: "pass", 2: "pass", 3: "skip", 4: "todo", 5: "fixed", 6: "pass", 7: "fail"}
    assert r.tests[3].title == "clone with trace (missing EXPENSIVE)"
    assert r.tests[4].title == "fetch a namespace"
    assert [t.number for t in r.failures] == [7]
    assert r.ran == 6
    r.exit_code = 1
    assert not r.aborted  # exited 1 because test 7 failed


def test_whole_script_skipped_and_aborted_scripts() -> None:
    skipped = parse_tap("t0611-reftable-httpd", ["1..0 # SKIP no reftable here\n"])
    assert skipped.plan == 0 and skipped.skip_all == "no reftable here" and not skipped.tests
    died = parse_tap("t5702-protocol-v2", ["ok 1 - setup\n", "not ok 2 - x\n"])
    died.exit_code = 1
    assert died.aborted  # no plan: it stopped before test_done
    broken = parse_tap("t5702-protocol-v2", ["ok 1 - setup\n", "1..1\n"])
    broken.exit_code = 1
    assert broken.aborted  # a non-zero exit with nothing failed (a setup error)
    row = compare(died, broken)
    assert any("stock: aborted" in n for n in row.notes)
    assert any("gitspout: aborted" in n for n in row.notes)


def test_compare_lists_failures_of_one_side_only() -> None:
    stock = parse_tap("t5561-http-backend", STOCK_TAP.splitlines())
    spout = parse_tap("t5561-http-backend", GITSPOUT_TAP.splitlines())
    row = compare(stock, spout)
    assert row.tests == 7 and row.skipped == 1
    assert row.stock_failures == (7,) and row.gitspout_failures == (6,)
    assert [(t.number, t.title) for t in row.gitspout_only] == [(6, "http.uploadpack false")]
    assert [t.number for t in row.stock_only] == [7]
    # a known breakage is never a failure, on either side
    assert 4 not in row.stock_failures + row.gitspout_failures


def test_a_test_stock_skipped_is_not_gitspout_only() -> None:
    stock = parse_tap("t5702-protocol-v2", ["ok 1 # skip x (missing Y)\n", "1..1\n"])
    spout = parse_tap("t5702-protocol-v2", ["not ok 1 - x\n", "1..1\n"])
    assert compare(stock, spout).gitspout_only == ()


def test_results_survive_json() -> None:
    r = parse_tap("t5551-http-fetch-smart", STOCK_TAP.splitlines())
    r.exit_code, r.seconds = 1, 12.34
    back = ScriptResult.from_json(r.to_json())
    assert back.tests == r.tests and back.plan == 7 and back.exit_code == 1
    assert back.seconds == 12.3


def test_report_table_and_listing() -> None:
    stock = parse_tap("t5561-http-backend", STOCK_TAP.splitlines())
    spout = parse_tap("t5561-http-backend", GITSPOUT_TAP.splitlines())
    other = parse_tap("t5551-http-fetch-smart", ["ok 1 - a\n", "1..1\n"])
    text = format_report([compare(stock, spout), compare(other, other)])
    lines = text.splitlines()
    assert "| t5561-http-backend | 7 | 1 | 1 | 1 | 6 |" in lines
    assert "| t5551-http-fetch-smart | 1 | 0 | 0 | 0 | - |" in lines
    assert "| **total** | 8 | 1 | 1 | 1 | 1 |" in lines
    i = lines.index("Failed only with gitspout: 1")
    assert lines[i + 1] == "- t5561.6 http.uploadpack false"
    assert "Failed only with stock git-http-backend: 1" in lines


BRIDGE = "/o/bin/one-time-bridge.sh"

# Paths as git 2.55's t/lib-httpd/apache.conf and its tests use them.
UPLOAD_PACK_PATHS = ["/smart/repo.git/", "/auth/smart/repo.git/", "/smart_namespace/repo.git/",
                     "/smart_v0/repo.git/", "/smart_headers/repo.git/", "/auth-fetch/smart/r/",
                     "/smart_noexport/a/b.git/"]
NOT_PROXIED = ["/smart/incomplete_length/git-upload-pack",
               "/smart/incomplete_body/git-upload-pack",
               "/error_git_upload_pack/smart/repo.git/git-upload-pack",
               "/one_time_script/repo.git/git-upload-pack", "/custom_auth/repo.git/git-upload-pack",
               "/dumb/repo.git/info/refs", "/smart/repo.git/git-receive-pack",
               "/smart/repo.git/objects/info/packs", "/smart/repo.git/HEAD"]


def _rules() -> list[tuple[list[tuple[str, str, bool]], re.Pattern[str], str]]:
    """The conf's RewriteRules with their RewriteConds:
    ([(variable, regex, negated)], pattern, substitution + flags)."""
    rules, conds = [], []
    for line in proxy_conf(BRIDGE).splitlines():
        m = re.match(r"RewriteCond %\{(\w+)\} (!?)(\S+)", line)
        if m:
            conds.append((m[1], m[3], m[2] == "!"))
        m = re.match(r"RewriteRule (\S+) (.+)$", line)
        if m:
            rules.append((conds, re.compile(m[1]), m[2]))
            conds = []
    return rules


def _routed(uri: str, query: str = "") -> str | None:
    """Where the conf's rules send a request, as mod_rewrite evaluates them: the first rule
    whose pattern matches and whose conditions all hold, its $1 filled in."""
    values = {"REQUEST_URI": uri, "QUERY_STRING": query}
    for conds, rule, target in _rules():
        if all(bool(re.search(rx, values[var])) != neg for var, rx, neg in conds):
            m = rule.search(uri)
            if m:
                return target.replace("$1", m[1])
    return None


def _proxied(uri: str, query: str = "") -> str | None:
    """The path a request is proxied to gitspout with, if it is."""
    gitspout = "http://127.0.0.1:${GITSPOUT_PORT}/"
    target = _routed(uri, query)
    if target is None or not target.endswith(" [P]"):
        return None
    assert target.startswith(gitspout), target
    return "/" + target[len(gitspout):-len(" [P]")]


def test_upload_pack_requests_reach_gitspout_with_the_prefix_stripped() -> None:
    """... except /smart_namespace/'s, which gitspout maps to the namespace ns."""
    for base in UPLOAD_PACK_PATHS:
        repo = "/" + base.split("smart", 1)[1].split("/", 1)[1]
        if base.startswith("/smart_namespace/"):
            repo = base
        assert _proxied(base + "info/refs", "service=git-upload-pack") == repo + "info/refs"
        assert _proxied(base + "git-upload-pack") == repo + "git-upload-pack"


def test_everything_else_stays_on_git_http_backend() -> None:
    for uri in NOT_PROXIED:
        assert _proxied(uri) is None, uri
        assert uri.startswith("/one_time_script/") or _routed(uri) is None, uri
        assert _proxied(uri, "service=git-upload-pack") is None, uri
    assert _proxied("/smart/repo.git/info/refs") is None  # dumb info/refs
    assert _proxied("/smart/repo.git/info/refs", "service=git-receive-pack") is None
    # a URL an earlier [R] rule already rewrote must stay a redirect
    assert _proxied("redirect:http://127.0.0.1:5551/smart/repo.git/info/refs",
                    "service=git-upload-pack") is None


def test_one_time_script_goes_through_the_bridge() -> None:
    for path in ("repo/info/refs", "repo/git-upload-pack", "repo/git-receive-pack"):
        assert _routed(f"/one_time_script/{path}", "service=git-upload-pack") == (
            f'"{BRIDGE}/{path}" [H=cgi-script]')
    assert re.search(r'<Directory "/o/bin">\s+Options \+ExecCGI', proxy_conf(BRIDGE))


def test_smart_v0_drops_the_protocol_header() -> None:
    conf = proxy_conf(BRIDGE)
    assert re.search(r"<LocationMatch /smart_v0/>\s+RequestHeader unset Git-Protocol$", conf,
                     re.MULTILINE)


def test_wrapper_passes_other_calls_through() -> None:
    text = wrapper_script("/usr/sbin/apache2", "/o/bin/gitspout proxy.conf", timeout_s=5)
    assert text.startswith("#!/bin/sh\n")
    assert "conf='/o/bin/gitspout proxy.conf'" in text
    assert 'exec "$httpd" "$@" -c "Define GITSPOUT_PORT $port" -c "Include $conf"' in text
    assert "if test $n -gt 50" in text


VERBOSE = """\
ok 68 - before
expecting success of 5702.69 'fetch from namespaced repo':
\tgit fetch "$HTTPD_URL/smart_namespace/nsrepo" &&
\ttest_cmp expect actual

-261c22f
+803c7ce
not ok 69 - fetch from namespaced repo
expecting success of 5702.70 'next':
ok 70 - next
"""


def test_verbose_section_is_one_test() -> None:
    section = verbose_section(VERBOSE.splitlines(keepends=True), 69)
    assert section[0] == "expecting success of 5702.69 'fetch from namespaced repo':"
    assert section[-1] == "not ok 69 - fetch from namespaced repo"
    assert "+803c7ce" in section and not any("5702.70" in line for line in section)
    assert verbose_section(VERBOSE.splitlines(), 6) == []


def test_all_http_scripts(tmp_path: Path) -> None:
    (tmp_path / "t5551-http-fetch-smart.sh").write_text('. "$TEST_DIRECTORY"/lib-httpd.sh\n')
    (tmp_path / "t5559-http-fetch-smart-http2.sh").write_text(". ./t5551-http-fetch-smart.sh\n")
    (tmp_path / "t5555-http-smart-common.sh").write_text("git http-backend\n")
    (tmp_path / "lib-httpd.sh").write_text("start_httpd () {\n}\n")
    names = [p.name for p in resolve_scripts(tmp_path, "all-http")]
    assert names == ["t5551-http-fetch-smart.sh", "t5559-http-fetch-smart-http2.sh"]
    assert http_scripts(tmp_path) == resolve_scripts(tmp_path, "t5551,t5559")


def test_forward_proxy_auth_of_t5564_spares_the_reverse_proxy() -> None:
    # t5564 defines PROXY: git's <Proxy "*"> then asks every proxied request for
    # proxy auth, and t5564.4-6 fail under the gitspout run without this exception.
    assert re.search(r'<IfDefine PROXY>\s+<Proxy "http://127\.0\.0\.1:\$\{GITSPOUT_PORT\}/\*">'
                     r"\s+Require all granted\s+</Proxy>", proxy_conf(BRIDGE))
