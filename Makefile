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

test: $(STAMP)
	$(BIN)/ruff check protocol server tests bench
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check protocol server tests bench
	$(BIN)/mypy

clean:
	rm -rf $(VENV)
