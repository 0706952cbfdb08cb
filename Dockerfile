# syntax=docker/dockerfile:1
# gitspout container image (docs/container.md). The tag is the package's version
# (pyproject.toml), the same in docker-compose.yml and deploy/kubernetes/kustomization.yaml:
#
#   podman build --format docker -t gitspout:0.1.0 .      # or: docker build -t gitspout:0.1.0 .
#   podman run --rm -p 127.0.0.1:8080:8080 --read-only --tmpfs /tmp --cap-drop ALL \
#       -v /path/to/repos:/srv/git:ro -v gitspout-cache:/var/cache/gitspout gitspout:0.1.0
#
# Three stages, so that each change rebuilds only what it must:
# - deps: a virtual environment with the runtime dependencies, installed from
#   requirements.lock (pinned, with hashes, wheels only) before any source is copied: a
#   change to a source file or README.md does not download them again;
# - app: gitspout's own wheel, built without network and installed under /staging;
# - the image: the base, the user, the dependencies' venv and gitspout copied in as two
#   layers (COPY --from, never a bind mount from a stage, which buildah caches stale).
# No compiler anywhere: every dependency comes as a wheel (--only-binary=:all: fails the
# build rather than compile; see docs/container.md for a platform without wheels).
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS deps
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# binutils for `strip` only (below); it stays in this stage.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends binutils \
    && rm -rf /var/lib/apt/lists/*
COPY requirements-build.lock requirements.lock /tmp/lock/
# /opt/build: pip and setuptools from the build lock, to build and install. /opt/gitspout:
# the runtime venv, without pip, filled by /opt/build's pip (--python).
RUN python3 -m venv /opt/build \
    && /opt/build/bin/pip install --no-deps --require-hashes --only-binary=:all: \
       -r /tmp/lock/requirements-build.lock \
    && python3 -m venv --without-pip /opt/gitspout \
    && /opt/build/bin/pip --python /opt/gitspout/bin/python install --no-deps \
       --require-hashes --only-binary=:all: -r /tmp/lock/requirements.lock
# What serving never loads: numpy's test suites, f2py and distutils (about 20 MB with their
# bytecode); and the symbol tables of the extension modules (uvloop's loop module is
# 13.6 MB with them, 1.6 MB without). The vendored libraries under *.libs are left alone
# (auditwheel patched them). The import below fails the build if this removed too much.
RUN sp="$(/opt/gitspout/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
    && rm -rf "$sp/numpy/f2py" "$sp/numpy/distutils" "$sp/numpy/_pyinstaller" \
    && find "$sp/numpy" -depth -type d -name tests -exec rm -rf {} + \
    && find "$sp" -name '*.cpython-*.so' -exec strip --strip-unneeded {} + \
    && /opt/gitspout/bin/python -c 'import aiohttp, bcrypt, dulwich, numpy, prometheus_client, uvloop; assert numpy.argsort(numpy.arange(3))[0] == 0'

FROM deps AS app
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY server ./server
# No network here: setuptools comes from /opt/build, the dependencies are already in
# /opt/gitspout (--no-deps). --root puts only gitspout's own files under /staging.
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --no-index --wheel-dir /tmp/wheel . \
    && /opt/build/bin/pip --python /opt/gitspout/bin/python install --no-deps --no-index \
       --no-warn-script-location --root /staging /tmp/wheel/gitspout-*.whl

FROM python:${PYTHON_VERSION}-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/gitspout/bin:$PATH
# The pack cache directory is not a VOLUME (that leaves an anonymous volume behind per
# run): mount one there, or a tmpfs (docs/container.md).
RUN groupadd --system --gid 10001 gitspout \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin gitspout \
    && mkdir -p /srv/git /var/cache/gitspout \
    && chown 10001:10001 /var/cache/gitspout
COPY --from=deps /opt/gitspout /opt/gitspout
COPY --from=app /staging/ /

# Every setting is a GITSPOUT_* variable (README.md "Configuration"); these are the image's
# defaults, and `docker run -e GITSPOUT_...` or flags after the image name override them.
ENV GITSPOUT_ROOT=/srv/git \
    GITSPOUT_HOST=0.0.0.0 \
    GITSPOUT_PORT=8080 \
    GITSPOUT_PACK_CACHE_DIR=/var/cache/gitspout \
    TMPDIR=/tmp

USER 10001:10001
WORKDIR /srv/git
EXPOSE 8080
STOPSIGNAL SIGTERM
# The image has no curl: the check is Python's urllib. A non-200 /healthz raises, so the
# command exits non-zero. (podman keeps a HEALTHCHECK only in docker format: build with
# --format docker, or BUILDAH_FORMAT=docker for podman-compose.)
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('GITSPOUT_PORT', '8080'), timeout=4)"]
ENTRYPOINT ["gitspout", "serve"]
