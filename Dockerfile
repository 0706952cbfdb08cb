# syntax=docker/dockerfile:1
# gitspout container image (README.md "Deployment").
#
#   docker build -t gitspout .
#   docker run --rm -p 8080:8080 --read-only --tmpfs /tmp \
#       -v /path/to/repos:/srv/git:ro gitspout
#
# Stage 1 builds wheels for gitspout and its dependencies (a compiler is there in case a
# dependency has no wheel for the platform); stage 2 installs them into a slim Python with
# no compiler, no git and no build files. The process runs as uid 10001, works with a
# read-only root filesystem, and writes only to /tmp and the pack cache directory.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY server ./server
RUN pip wheel --wheel-dir /wheels .

FROM python:${PYTHON_VERSION}-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The wheels are bind-mounted from stage 1, so they are never part of a layer.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels /wheels/gitspout-*.whl \
    && groupadd --system --gid 10001 gitspout \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin gitspout \
    && mkdir -p /srv/git /var/cache/gitspout \
    && chown 10001:10001 /var/cache/gitspout

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
VOLUME ["/var/cache/gitspout"]
STOPSIGNAL SIGTERM
# The image has no curl: the check is Python's urllib. A non-200 /healthz raises, so the
# command exits non-zero.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('GITSPOUT_PORT', '8080'), timeout=4)"]
ENTRYPOINT ["gitspout", "serve"]
