# gitspout: `make serve` sets up and serves; `make test` sets up and runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: serve test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	-$(BIN)/pip install -q -e '.[nfs]'
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/gitspout serve

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

lint: $(STAMP) $(TYPECHECK)
	$(BIN)/ruff check protocol server tests bench
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .build
