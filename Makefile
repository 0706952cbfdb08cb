# gitspout: `make serve` sets up and serves; `make test` sets up and runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SERVE_STAMP := $(VENV)/.installed-serve

.PHONY: serve test test-tiny-budgets test-min-deps test-git-suite test-image lock lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	-$(BIN)/pip install -q -e '.[nfs]'
	touch $(STAMP)

# Only what serving needs; PORT=8081 (or GITSPOUT_PORT, read by gitspout itself) picks the port.
$(SERVE_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $(SERVE_STAMP)

serve: $(SERVE_STAMP)
	$(BIN)/gitspout serve $(if $(PORT),--port $(PORT))

# mypy resolves gitspout.server / gitspout.protocol through symlinks to the two folders.
TYPECHECK := .build/typecheck/gitspout

$(TYPECHECK):
	mkdir -p $(TYPECHECK)
	ln -sfn ../../../server $(TYPECHECK)/server
	ln -sfn ../../../protocol $(TYPECHECK)/protocol

test: $(STAMP) $(TYPECHECK)
	$(BIN)/ruff check protocol server tests bench
	$(BIN)/mypy
	$(BIN)/python -m pytest -q
	$(MAKE) test-tiny-budgets

# Same answers under pressure: clones and fetches of tests/compat against a server with
# tiny budgets (every test-started server gets GITSPOUT_TEST_SERVER_ARGS, tests/gitutil.py).
TINY_BUDGETS := --max-open-packs 8 --cache-memory 8MiB

test-tiny-budgets: $(STAMP)
	GITSPOUT_TEST_SERVER_ARGS="$(TINY_BUDGETS)" $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/compat/test_clone.py tests/compat/test_fetch.py

# The compat suite against the oldest dulwich that pyproject.toml admits, in its own venv.
MIN_VENV := .venv-min
DULWICH_MIN := $(shell sed -n 's/.*"dulwich>=\([0-9.]*\)".*/\1/p' pyproject.toml)

$(MIN_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(MIN_VENV)
	$(MIN_VENV)/bin/pip install -q --upgrade pip
	$(MIN_VENV)/bin/pip install -q -e '.[test]' 'dulwich==$(DULWICH_MIN)'
	touch $@

test-min-deps: $(MIN_VENV)/.installed
	$(MIN_VENV)/bin/python -c 'import dulwich; v = ".".join(map(str, dulwich.__version__)); assert v == "$(DULWICH_MIN)", v; print("dulwich", v)'
	$(MIN_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/compat

# C git's own HTTP fetch tests, with stock git-http-backend and with upload-pack proxied to
# gitspout (docs/git-test-suite.md). Not part of `test`: it needs git's source tree, e.g.
#   make test-git-suite GIT_SRC=/path/to/git-2.55.0 [GITSUITE_ARGS='--protocol-version 0']
test-git-suite: $(STAMP)
	@test -n "$(GIT_SRC)" || { echo "usage: make test-git-suite GIT_SRC=DIR [GITSUITE_ARGS=...]"; exit 2; }
	$(BIN)/python tests/gitsuite/gitsuite_run.py --git-src "$(GIT_SRC)" $(GITSUITE_ARGS)

# The image's lock files (Dockerfile): the runtime dependencies of pyproject.toml with the
# auth extra, and the build tools, pinned with the hashes of every file of each release.
# tests/deploy/test_image_files.py checks (offline, in `make test`) that they satisfy
# pyproject.toml. Run after changing a dependency; needs PyPI.
LOCK_VENV := .venv-lock
UV_VERSION := 0.13.9
LOCK_PY := 3.11

$(LOCK_VENV)/.installed:
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -q 'uv==$(UV_VERSION)'
	touch $@

lock: $(LOCK_VENV)/.installed
	$(LOCK_VENV)/bin/uv pip compile --quiet --system-certs --python-version $(LOCK_PY) \
		--generate-hashes --extra auth --custom-compile-command 'make lock' \
		-o requirements.lock pyproject.toml
	$(PYTHON) -c 'import tomllib; print("pip", *tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")' \
		| $(LOCK_VENV)/bin/uv pip compile --quiet --system-certs --python-version $(LOCK_PY) \
		--generate-hashes --custom-compile-command 'make lock' -o requirements-build.lock -

# Builds the image with podman from a base bootstrapped from Debian packages, runs it and
# the compose stack, and checks them (tests/image/run.sh; needs podman, podman-compose,
# mmdebstrap, and Debian's and PyPI's registries). `.ci/run` runs it after `make test`.
test-image:
	bash tests/image/run.sh

lint: $(STAMP) $(TYPECHECK)
	$(BIN)/ruff check protocol server tests bench
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(MIN_VENV) $(LOCK_VENV) .build
