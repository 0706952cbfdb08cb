#!/bin/sh
# CGI for git's /one_time_script/ location in the gitspout run of
# tests/gitsuite/gitsuite_run.py.
#
# git's t/lib-httpd/apply-one-time-script.sh runs git-http-backend, and when the test left a
# "one-time-script" in the httpd directory, passes the CGI answer through it once (tests
# use it to fake a server that changes between requests or misbehaves). This does the same
# with gitspout's answer for the upload-pack requests (curl to 127.0.0.1:$GITSPOUT_PORT,
# turned back into CGI output), and runs git-http-backend for anything else.
cd "${DOCUMENT_ROOT%/www}" || exit 1

case "$PATH_INFO" in
*/git-upload-pack) upload_pack=yes ;;
*/info/refs)
	case "&$QUERY_STRING&" in
	*"&service=git-upload-pack&"*) upload_pack=yes ;;
	esac
	;;
esac
# Anything else: git's own script, which lib-httpd.sh installed here.
test -n "$upload_pack" || exec ./apply-one-time-script.sh

# gitspout's answer as a CGI answer: "Status:" for the status line, the headers that
# describe the transfer (not the content) dropped, since Apache makes its own.
gitspout () {
	tmp=$(mktemp -d) || exit 1
	set -- -sS --http1.1 -X "$REQUEST_METHOD" -D "$tmp/head" -o "$tmp/body" -H "Expect:"
	test -n "$CONTENT_TYPE" && set -- "$@" -H "Content-Type: $CONTENT_TYPE"
	test -n "$HTTP_ACCEPT" && set -- "$@" -H "Accept: $HTTP_ACCEPT"
	test -n "$HTTP_GIT_PROTOCOL" && set -- "$@" -H "Git-Protocol: $HTTP_GIT_PROTOCOL"
	test -n "$HTTP_CONTENT_ENCODING" &&
		set -- "$@" -H "Content-Encoding: $HTTP_CONTENT_ENCODING"
	test "$REQUEST_METHOD" = POST && set -- "$@" --data-binary @-
	curl "$@" "http://127.0.0.1:$GITSPOUT_PORT$PATH_INFO${QUERY_STRING:+?$QUERY_STRING}" ||
		{ rm -rf "$tmp"; exit 1; }
	tr -d '\r' <"$tmp/head" | sed -n \
		-e '1s/^HTTP\/[0-9.]* /Status: /p' \
		-e '/^[Tt]ransfer-[Ee]ncoding:/d' -e '/^[Cc]ontent-[Ll]ength:/d' \
		-e '/^[Cc]onnection:/d' -e '/^[Kk]eep-[Aa]live:/d' -e '/^[Dd]ate:/d' \
		-e '/^[Ss]erver:/d' -e '2,$p'
	cat "$tmp/body"
	rm -rf "$tmp"
}

# From here on as apply-one-time-script.sh does it.
if test -f one-time-script
then
	LC_ALL=C
	export LC_ALL

	gitspout >out
	./one-time-script out >out_modified

	if cmp -s out out_modified
	then
		cat out
	else
		cat out_modified
		rm one-time-script
	fi
else
	gitspout
fi
