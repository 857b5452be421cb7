# `make demo` and `make test` work on a fresh machine: they create .venv and install into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is installed first, pinned, so that pip never resolves an unpinned `torch` on its own
# (here that would pull a multi-GB CUDA build; the pinned CPU file is local). On a GPU machine
# the same pin installs PyPI's CUDA build. Override for another build:
#   make test TORCH_SPEC="torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124"
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: install test test-slow test-gpu lint docs demo distill bench clean help

help:
	@echo "make demo       # prepare Multi30k en-de, train, average, translate, score"
	@echo "make distill    # after make demo: distill its model into a 6+1-layer student of width 160, score both"
	@echo "make test       # install and run the test suite (about 5 minutes on 2 cores)"
	@echo "make test-slow  # the long system tests (learning tasks, demo pipeline, fault injection)"
	@echo "make test-gpu   # the CUDA tests (pytest -m gpu); they fail without a GPU"
	@echo "make lint       # ruff check, ruff format --check, mypy"
	@echo "make docs       # the documentation site, built offline with mkdocs --strict into site/"

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

install: $(BIN)/.installed

test: install
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-slow: install
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

test-gpu: install
	$(BIN)/python -m pytest -q -m gpu tests/test_gpu.py tests/test_loss.py $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check nmt tests benchmarks scripts
	$(BIN)/ruff format --check nmt tests benchmarks scripts
	$(BIN)/mypy nmt

# the site: every page in the navigation, every link and anchor checked (--strict); offline
docs: install
	$(BIN)/python scripts/update_docs.py --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

demo: install
	PATH="$(abspath $(BIN)):$$PATH" bash scripts/demo.sh

distill: install
	PATH="$(abspath $(BIN)):$$PATH" bash scripts/distill.sh

# the CPU suites; translate, engines and startup time `make demo`'s model (every suite:
# `python -m benchmarks`, docs/development.md)
DEMO_MODEL ?= runs/m30k_en_de/checkpoint_avg.pt
bench: install
	$(BIN)/python -m benchmarks prepare
	$(BIN)/python -m benchmarks train
	$(BIN)/python -m benchmarks translate --checkpoint $(DEMO_MODEL)
	$(BIN)/python -m benchmarks engines --checkpoint $(DEMO_MODEL) --precision fp32,int8
	$(BIN)/python -m benchmarks startup --checkpoint $(DEMO_MODEL)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
