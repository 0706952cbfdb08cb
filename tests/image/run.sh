#!/usr/bin/env bash
# Builds the real Dockerfile with podman and runs the image and the compose stack as
# docs/container.md says, on a machine with no container registry (`make test-image`;
# .ci/run runs it after `make test`). Needs podman, podman-compose, mmdebstrap, git,
# python3 with PyYAML, and Debian's and PyPI's package registries.
#
# 1. base: the image the Dockerfile's FROM names (python:3.11-slim-bookworm), bootstrapped
#    from Debian packages with mmdebstrap and imported under that exact name, so that the
#    Dockerfile builds unchanged. The tarball is cached (GITSPOUT_IMAGE_CACHE).
# 2. build: `podman build --format docker`; the image keeps its HEALTHCHECK, has no
#    VOLUME, no compiler and no pip, and its gitspout is the package's version.
# 3. rebuild after a source and README change: the dependency layers are reused (not
#    downloaded again) and the new source is in the image (no stale stage).
# 4. run: read-only root, uid 10001, all capabilities dropped, repositories mounted
#    read-only, a named volume for the pack cache; clone, `git fsck`, refs equal to a
#    file:// clone's, `podman healthcheck run`, SIGTERM drains and exits 0. Without the
#    cache mount it refuses to start with a clear message. Then with the cache on a tmpfs
#    and an auth file: refused without credentials, served with them.
# 5. compose: podman-compose up (BUILDAH_FORMAT=docker, as documented) with stand-ins for
#    prom/prometheus and alpine/git built from Debian's packages; Grafana has no Debian
#    package and is left out (`up prometheus` starts the services it depends on only).
#    The example repository clones, Prometheus's gitspout target is up and every rule of
#    deploy/prometheus/rules.yml is loaded and evaluates.
#
# Podman runs with a containers.conf and a storage of its own under a temporary directory
# (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF): nothing here touches the machine's podman
# images or containers, and everything made here is removed at exit.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
HERE="$ROOT/tests/image"
PROBE=(python3 "$HERE/probe.py")
CACHE="${GITSPOUT_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gitspout-image}"
CACHE_DAYS=7      # a cached base older than this is bootstrapped again (security updates)
DEADLINE=120      # seconds for any one service to come up or any poll to succeed
START=$SECONDS
PASSED=0

say() { printf '[%4ds] %s\n' "$((SECONDS - START))" "$*"; }
pass() { PASSED=$((PASSED + 1)); say "ok: $*"; }
fail() { say "FAILED: $*" >&2; exit 1; }

for tool in podman podman-compose mmdebstrap git python3; do
  command -v "$tool" >/dev/null || fail "$tool is not installed (.ci/run installs it)"
done

VERSION="$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$ROOT/pyproject.toml")"
IMAGE="gitspout:$VERSION"

# The base image's name, from the Dockerfile's ARG default and FROM line.
PY_VERSION="$(sed -n 's/^ARG PYTHON_VERSION=\(.*\)$/\1/p' "$ROOT/Dockerfile")"
BASE_REF="$(sed -n 's/^FROM \(python:[^ ]*\).*/\1/p' "$ROOT/Dockerfile" | sort -u)"
BASE_REF="${BASE_REF//\$\{PYTHON_VERSION\}/$PY_VERSION}"
[[ "$BASE_REF" =~ ^python:([0-9.]+)-slim-([a-z]+)$ ]] \
  || fail "the Dockerfile's FROM lines name one python:X.Y-slim-SUITE image, not '$BASE_REF'"
PY="python${BASH_REMATCH[1]}"
SUITE="${BASH_REMATCH[2]}"
BASE_IMAGE="docker.io/library/$BASE_REF"

# Image names that docker-compose.yml pins, for the stand-ins.
read -r PROM_IMAGE GIT_IMAGE < <(python3 - "$ROOT/docker-compose.yml" <<'EOF'
import sys, yaml
svc = yaml.safe_load(open(sys.argv[1]))["services"]
print(svc["prometheus"]["image"], svc["init-repos"]["image"])
EOF
)

# git for the test's own repositories and clones: no user or system configuration.
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_TERMINAL_PROMPT=0 \
  GIT_AUTHOR_NAME=test GIT_AUTHOR_EMAIL=test@example.invalid \
  GIT_COMMITTER_NAME=test GIT_COMMITTER_EMAIL=test@example.invalid

WORK="$(mktemp -d /var/tmp/gitspout-image.XXXXXX)"
PROJECT="gitspoutci$$"
export CONTAINERS_CONF="$WORK/containers.conf" CONTAINERS_STORAGE_CONF="$WORK/storage.conf"
export BUILDAH_FORMAT=docker   # keep HEALTHCHECK (OCI images have none), as documented

# Podman on this kind of machine: crun fails on the hybrid cgroups, so runc; and the
# default ulimits (1048576) exceed the hard limits, so they are set to the hard limits.
# podman lowers its own RLIMIT_NPROC to kernel.pid_max at start, so nproc is at most that.
nofile="$(ulimit -Hn)"; [ "$nofile" = unlimited ] && nofile=1048576
nproc="$(ulimit -Hu)"; pid_max="$(cat /proc/sys/kernel/pid_max)"
{ [ "$nproc" = unlimited ] || [ "$nproc" -gt "$pid_max" ]; } && nproc="$pid_max"
mkdir -p "$WORK/storage" "$WORK/run" "$WORK/tmp" "$CACHE"
cat > "$CONTAINERS_CONF" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
tmp_dir = "$WORK/tmp"
events_logger = "file"
events_logfile_path = "$WORK/events.log"
EOF
cat > "$CONTAINERS_STORAGE_CONF" <<EOF
[storage]
driver = "overlay"
graphroot = "$WORK/storage"
runroot = "$WORK/run"
EOF

cleanup() {
  local rc=$?
  set +e
  # Only ever podman on the storage made here, never the machine's.
  grep -q "^graphroot = \"$WORK/storage\"$" "$CONTAINERS_STORAGE_CONF" || { rm -rf "$WORK"; exit "$rc"; }
  if [ "$rc" -ne 0 ] && [ -f "$WORK/compose.log" ]; then
    echo "--- compose.log (tail)"; tail -40 "$WORK/compose.log"
    for c in $(podman ps -a --format '{{.Names}}' 2>/dev/null); do
      echo "--- podman logs $c (tail)"; podman logs --tail 20 "$c" 2>&1
    done
  fi
  podman rm -a -f -t 0 >/dev/null 2>&1
  podman volume rm -a -f >/dev/null 2>&1
  podman rmi -a -f >/dev/null 2>&1
  # podman-compose's network: CNI's dnsname plugin leaves an INPUT rule for its bridge,
  # and host-local its address records; removed while the bridge is still ours.
  local net="${PROJECT}_default" bridge
  if bridge="$(podman network inspect --format '{{.NetworkInterface}}' "$net" 2>/dev/null)" \
      && [ -n "$bridge" ] && command -v iptables >/dev/null; then
    while iptables -D INPUT -i "$bridge" -p udp -m udp --dport 53 -j ACCEPT 2>/dev/null; do :; done
  fi
  podman network rm -f "$net" >/dev/null 2>&1
  rm -rf "/var/lib/cni/networks/$net"
  grep -o " $WORK/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
  rm -rf "$WORK"
  if [ "$rc" -eq 0 ]; then
    say "cleaned up; $((SECONDS - START)) s in all"
    echo "image: $PASSED passed, 0 failed"
  else
    echo "image: $PASSED passed, 1 failed"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
say "podman $(podman version --format '{{.Client.Version}}'), storage in $WORK, image $IMAGE"

# -- 1. base ------------------------------------------------------------------------------
# What the Dockerfile's stages need of the base: python3 with venv and ensurepip, CA
# certificates, useradd; apt (part of minbase) for the build stage's binutils. Docs,
# man pages and locales are left out, as in the slim images. The machine's own extra CA
# certificates go in too (a TLS-inspecting proxy in front of PyPI), and PIP_CERT points
# pip, whose own bundle would not have them, at the system's.
PACKAGES="python3,$PY,python3-venv,ca-certificates,passwd"
key="$( { echo "v1 $SUITE $PACKAGES"; cat /usr/local/share/ca-certificates/*.crt 2>/dev/null; } | sha256sum | cut -c1-16)"
tarball="$CACHE/base-$SUITE-$PY-$key.tar"
find "$CACHE" -name 'base-*.tar' -mtime +"$CACHE_DAYS" -delete
if [ -s "$tarball" ]; then
  say "base: cached $tarball"
else
  say "base: bootstrapping $SUITE with $PACKAGES (mmdebstrap)"
  # shellcheck disable=SC2016  # $1 and $f are the hook's, not this script's
  mmdebstrap --variant=minbase --format=tar --include="$PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='for f in /usr/local/share/ca-certificates/*.crt; do [ -e "$f" ] && cp "$f" "$1/usr/local/share/ca-certificates/"; done; chroot "$1" update-ca-certificates >/dev/null' \
    "$SUITE" "$tarball.part" http://deb.debian.org/debian > "$WORK/mmdebstrap.log" 2>&1 \
    || { tail -20 "$WORK/mmdebstrap.log"; fail "mmdebstrap"; }
  mv "$tarball.part" "$tarball"
fi
podman import -q --change 'ENV LANG=C.UTF-8' --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
  --change 'CMD ["python3"]' "$tarball" "$BASE_IMAGE" >/dev/null
[ "$(podman run --rm "$BASE_REF" python3 -c 'import sys; print("python%d.%d" % sys.version_info[:2])')" = "$PY" ] \
  || fail "base image has no $PY"
pass "base image $BASE_IMAGE ($PY, Debian $SUITE), $(du -m "$tarball" | cut -f1) MB tarball"

# -- 2. build -----------------------------------------------------------------------------
t0=$SECONDS
podman build --format docker -t "$IMAGE" "$ROOT" > "$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log"; fail "podman build"; }
say "build: $((SECONDS - t0)) s"
inspect() { podman image inspect --format "$1" "$IMAGE"; }
[[ "$(inspect '{{json .Config.Healthcheck.Test}}')" == *"/healthz"* ]] || fail "no HEALTHCHECK in the image"
[ "$(inspect '{{json .Config.Volumes}}')" = null ] || fail "the image declares a VOLUME: $(inspect '{{json .Config.Volumes}}')"
[ "$(inspect '{{.Config.User}}')" = "10001:10001" ] || fail "user is $(inspect '{{.Config.User}}')"
pass "built $IMAGE: HEALTHCHECK kept (docker format), no VOLUME, USER 10001:10001"
# One-off commands run with --no-healthcheck: podman schedules health checks with systemd
# timers and logs an error per container where there is no systemd. The served containers
# below keep their check (that error is expected there) and are checked on demand.
oneoff=(podman run --rm --no-healthcheck)
got="$("${oneoff[@]}" --entrypoint gitspout "$IMAGE" --version)"
[ "$got" = "gitspout $VERSION" ] || fail "gitspout --version in the image says '$got', not $VERSION"
"${oneoff[@]}" --entrypoint sh "$IMAGE" -c \
  '! command -v gcc && ! command -v cc && ! python -c "import pip" 2>/dev/null && ! command -v git' >/dev/null \
  || fail "the image has a compiler, pip or git"
pass "the image's gitspout is the package's version ($VERSION); no compiler, pip or git in it"
size_mb=$(( $(inspect '{{.Size}}') / 1000000 ))
say "image size: $size_mb MB; layers (podman history):"
podman history --format '{{.Size}}\t{{.CreatedBy}}' "$IMAGE" | grep -v '^0 B' | cut -c1-110 | sed 's/^/    /'

# -- 3. rebuild after a change --------------------------------------------------------------
ctx="$WORK/context"
mkdir "$ctx"
cp -r "$ROOT"/{Dockerfile,.dockerignore,requirements.lock,requirements-build.lock,pyproject.toml,README.md,protocol,server} "$ctx/"
stamp="stamp-$$-$RANDOM"
echo "<!-- $stamp -->" >> "$ctx/README.md"
echo "# $stamp" >> "$ctx/server/__init__.py"
t0=$SECONDS
podman build --format docker -t gitspout:changed "$ctx" > "$WORK/rebuild.log" 2>&1 \
  || { tail -40 "$WORK/rebuild.log"; fail "podman build after a change"; }
layers() { podman image inspect --format '{{range .RootFS.Layers}}{{println .}}{{end}}' "$1" | grep .; }
mapfile -t before < <(layers "$IMAGE")
mapfile -t after < <(layers gitspout:changed)
n=${#before[@]}
if ! { [ "${#after[@]}" -eq "$n" ] && [ "${before[*]:0:n-1}" = "${after[*]:0:n-1}" ] \
        && [ "${before[n-1]}" != "${after[n-1]}" ]; }; then
  fail "after a source change, layers other than the last changed: ${before[*]} / ${after[*]}"
fi
grep -q "Successfully installed aiohappyeyeballs" "$WORK/rebuild.log" && fail "the rebuild installed the dependencies again"
"${oneoff[@]}" --entrypoint python gitspout:changed -c \
  "import gitspout.server as s, pathlib, sys; sys.exit('$stamp' not in pathlib.Path(s.__file__).read_text())" \
  || fail "the rebuilt image does not have the changed source (stale stage)"
podman rmi gitspout:changed >/dev/null
pass "rebuild after a source and README change: $((SECONDS - t0)) s, only the last of $n layers new, the new source in it"

# -- 4. run as docs/container.md says ----------------------------------------------------------
repos="$WORK/repos"
mkdir -p "$repos"
git clone -q --bare --no-local "$ROOT" "$repos/gitspout.git"
git -C "$repos/gitspout.git" tag -a -m "a tag for the test" image-test HEAD
chmod -R a+rX "$repos"
# Without a writable pack cache directory, on a read-only root, it refuses with a message.
if out="$("${oneoff[@]}" --read-only --tmpfs /tmp --cap-drop ALL \
      --security-opt no-new-privileges -v "$repos:/srv/git:ro" "$IMAGE" 2>&1)"; then
  fail "started without a pack cache mount on a read-only root"
fi
[[ "$out" == *"/var/cache/gitspout"*"not writable"* ]] || fail "unclear error without the cache mount: $out"
pass "without the pack cache mount it refuses to start: '$(tail -1 <<<"$out")'"

[ -S /run/systemd/private ] || say "no systemd here: podman logs 'unable to get systemd connection' for each container with a HEALTHCHECK (it cannot schedule the checks); expected, the checks are run with podman healthcheck run"
podman volume create gitspout-cache >/dev/null
podman run -d --name gitspout-run -p 127.0.0.1::8080 --read-only --tmpfs /tmp \
  --cap-drop ALL --security-opt no-new-privileges \
  -v "$repos:/srv/git:ro" -v gitspout-cache:/var/cache/gitspout "$IMAGE" >/dev/null
port="$(podman port gitspout-run 8080/tcp)"
[[ "$port" == 127.0.0.1:* ]] || fail "published on $port, not 127.0.0.1"
url="http://$port"
"${PROBE[@]}" wait-http "$url/healthz" "$DEADLINE" >/dev/null || fail "gitspout did not answer /healthz"
status="$(podman exec gitspout-run cat /proc/1/status)"
grep -q '^Uid:\s*10001\s' <<<"$status" || fail "not uid 10001: $(grep Uid <<<"$status")"
grep -q '^CapEff:\s*0000000000000000' <<<"$status" || fail "has capabilities: $(grep CapEff <<<"$status")"
grep -q '^NoNewPrivs:\s*1' <<<"$status" || fail "no-new-privileges not set"
if err="$(podman exec -u 0 gitspout-run touch /opt/probe 2>&1)"; then fail "the root filesystem is writable"; fi
[[ "$err" == *"Read-only file system"* ]] || fail "unexpected: $err"
pass "serving on $url as uid 10001, no capabilities, no-new-privileges, read-only root"

git clone -q "$url/gitspout.git" "$WORK/clone-http"
git clone -q --bare "file://$repos/gitspout.git" "$WORK/clone-file"
git -C "$WORK/clone-http" fsck --strict --no-dangling || fail "git fsck of the clone"
diff <(git ls-remote "$url/gitspout.git") <(git ls-remote "file://$repos/gitspout.git") \
  || fail "ls-remote over HTTP differs from file://"
diff <(git -C "$WORK/clone-http" rev-list --objects --all | sort) \
     <(git -C "$WORK/clone-file" rev-list --objects --all | sort) >/dev/null \
  || fail "the HTTP clone's objects differ from the file:// clone's"
pass "clone of $(git -C "$WORK/clone-file" rev-list --all | wc -l) commits: fsck --strict clean, refs and objects equal to file://"
podman healthcheck run gitspout-run || fail "podman healthcheck run"
pass "podman healthcheck run: healthy"
podman stop -t 40 gitspout-run >/dev/null
code="$(podman inspect --format '{{.State.ExitCode}}' gitspout-run)"
[ "$code" = 0 ] || fail "exit code $code after SIGTERM"
pass "SIGTERM: drained and exited 0"
podman rm gitspout-run >/dev/null
podman volume rm gitspout-cache >/dev/null

# The other documented ways: the pack cache on a tmpfs (podman's U: owned by the user), and an auth file
# (bcrypt is in the image) mounted read-only and named by GITSPOUT_AUTH_FILE.
password="secret-$$-$RANDOM"
hash="$(echo "$password" | "${oneoff[@]}" -i --entrypoint gitspout "$IMAGE" hash-password)"
printf '[users]\nci = "%s"\n[[access]]\nrepos = ["*"]\nusers = ["ci"]\n' "$hash" > "$WORK/users.toml"
chmod a+r "$WORK/users.toml"
podman run -d --name gitspout-auth -p 127.0.0.1::8080 --read-only --tmpfs /tmp \
  --tmpfs /var/cache/gitspout:size=64m,U \
  --cap-drop ALL --security-opt no-new-privileges -v "$repos:/srv/git:ro" \
  -v "$WORK/users.toml:/etc/gitspout/users.toml:ro" -e GITSPOUT_AUTH_FILE=/etc/gitspout/users.toml \
  "$IMAGE" >/dev/null
port="$(podman port gitspout-auth 8080/tcp)"
"${PROBE[@]}" wait-http "http://$port/healthz" "$DEADLINE" >/dev/null || fail "gitspout with auth did not answer /healthz"
if git ls-remote "http://$port/gitspout.git" >/dev/null 2>&1; then fail "served without credentials"; fi
diff <(git ls-remote "http://ci:$password@$port/gitspout.git") <(git ls-remote "file://$repos/gitspout.git") \
  || fail "ls-remote with credentials differs from file://"
podman rm -f -t 0 gitspout-auth >/dev/null
pass "pack cache on a tmpfs owned by 10001; --auth-file: refused without credentials, served with them"

# -- 5. the compose stack -------------------------------------------------------------------
t0=$SECONDS
for target in prometheus git; do
  tag="$PROM_IMAGE"; [ "$target" = git ] && tag="$GIT_IMAGE"
  podman build --target "$target" -t "$tag" -f "$HERE/standins.Containerfile" "$HERE" \
    >> "$WORK/standins.log" 2>&1 || { tail -20 "$WORK/standins.log"; fail "building the $target stand-in"; }
done
say "stand-ins $PROM_IMAGE (Debian's prometheus $(podman run --rm "$PROM_IMAGE" --version 2>&1 | sed -n 's/^prometheus, version \([^ ]*\).*/\1/p')) and $GIT_IMAGE (Debian's git): $((SECONDS - t0)) s"
# The image again, by podman-compose's own build (cached layers), to see that it keeps the
# HEALTHCHECK with BUILDAH_FORMAT=docker, as docs/container.md says.
podman rmi "$IMAGE" >/dev/null
gp="$("${PROBE[@]}" free-port)"; pp="$("${PROBE[@]}" free-port)"; grp="$("${PROBE[@]}" free-port)"
export PUBLISH_GITSPOUT_PORT="$gp" PUBLISH_PROMETHEUS_PORT="$pp" PUBLISH_GRAFANA_PORT="$grp"
GRAFANA_ADMIN_PASSWORD="$(python3 -c 'import secrets; print(secrets.token_urlsafe(16))')"
export GRAFANA_ADMIN_PASSWORD
compose=(podman-compose -p "$PROJECT" -f "$ROOT/docker-compose.yml")
# podman-compose 1.0.3 builds only the services named on `up`, so gitspout first.
t0=$SECONDS
"${compose[@]}" build gitspout > "$WORK/compose.log" 2>&1 || fail "podman-compose build"
[[ "$(inspect '{{json .Config.Healthcheck.Test}}')" == *"/healthz"* ]] \
  || fail "podman-compose built $IMAGE without its HEALTHCHECK"
pass "podman-compose build (BUILDAH_FORMAT=docker, cached layers): $((SECONDS - t0)) s, HEALTHCHECK kept"
t0=$SECONDS
"${compose[@]}" up -d prometheus >> "$WORK/compose.log" 2>&1 || fail "podman-compose up"
say "podman-compose up -d prometheus (with init-repos and gitspout; grafana left out): $((SECONDS - t0)) s"

"${PROBE[@]}" wait-http "http://127.0.0.1:$gp/healthz" "$DEADLINE" >/dev/null || fail "compose gitspout not up"
deadline=$((SECONDS + DEADLINE))
until git ls-remote "http://127.0.0.1:$gp/example.git" >/dev/null 2>&1; do
  [ "$SECONDS" -lt "$deadline" ] || fail "example.git never appeared"
  sleep 1
done
init="$(podman ps -a --filter "label=io.podman.compose.project=$PROJECT" --format '{{.Names}}' | grep init-repos)"
[ "$(podman inspect --format '{{.State.ExitCode}}' "$init")" = 0 ] || fail "init-repos failed"
git clone -q "http://127.0.0.1:$gp/example.git" "$WORK/example"
git -C "$WORK/example" fsck --strict --no-dangling || fail "git fsck of example.git"
grep -q "Served by gitspout" "$WORK/example/README.md" || fail "example.git has not the expected README"
pass "init-repos created example.git; cloned from the stack, fsck --strict clean"
gs="$(podman ps --filter "label=io.podman.compose.project=$PROJECT" --format '{{.Names}}' | grep _gitspout_)"
podman healthcheck run "$gs" || fail "podman healthcheck run in the stack"
for c in $(podman ps -a --filter "label=io.podman.compose.project=$PROJECT" --format '{{.Names}}'); do
  log="$(podman inspect --format '{{.HostConfig.LogConfig.Type}} {{.HostConfig.LogConfig.Size}}' "$c")"
  [ "$log" = "json-file 10MB" ] || fail "$c logs with '$log', not json-file capped at 10MB"
done
for c in $(podman ps --filter "label=io.podman.compose.project=$PROJECT" --format '{{.Names}}'); do
  for p in $(podman port "$c" | sed 's/.*-> //'); do
    [[ "$p" == 127.0.0.1:* ]] || fail "$c publishes $p, not on 127.0.0.1"
  done
done
pass "compose: healthcheck passes; every container's log capped (json-file 10MB); ports on 127.0.0.1 only"
"${PROBE[@]}" prom-target "http://127.0.0.1:$pp" gitspout "$DEADLINE" || fail "Prometheus's gitspout target"
pass "Prometheus's gitspout target is up"
"${PROBE[@]}" prom-rules "http://127.0.0.1:$pp" "$ROOT/deploy/prometheus/rules.yml" "$DEADLINE" \
  || fail "Prometheus's rules"
pass "Prometheus loaded and evaluated every rule of deploy/prometheus/rules.yml"
"${compose[@]}" down -v >> "$WORK/compose.log" 2>&1 || fail "podman-compose down"
[ -z "$(podman ps -a -q)" ] || fail "containers left after podman-compose down"
pass "podman-compose down -v"
