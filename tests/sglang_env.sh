#!/usr/bin/env bash
# Build the second test environment, the one with SGLang, for tests/test_sglang.py:
#
#     bash tests/sglang_env.sh [VENV_DIR]        (default .venv-sglang, git-ignored)
#
# SGLang 0.5.23 pins transformers==5.19.0 and a CUDA torch (6 GB with the nvidia-* wheels), so it can't
# share the project venv. This env has CPU torch 2.13.0 + `sglang==0.5.23 --no-deps` + only the
# pure-Python packages that its quantization / layer / server-args / model-loader modules import
# (shared/research/integration-apis.md §2.9), transformers 5.19.0, and w12 itself (editable, --no-deps).
# The one GPU-only import, torchvision, is a stand-in package in tests/stubs/ (put on sys.path by a .pth
# file in this env only). Idempotent: a stamp file records a finished build; delete the folder to redo it.
set -euo pipefail

# (a function, so that bash parses the whole script before running any of it)
main() {
  cd "$(dirname "$0")/.."
  VENV=${1:-.venv-sglang}
  PYTHON=${PYTHON:-python3}
  STAMP="$VENV/.w12-sglang-installed"
  if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ] && [ "$STAMP" -nt tests/sglang_env.sh ]; then
    return 0
  fi
  start=$(date +%s)
  "$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), "sglang 0.5.23 is cp311-only: set PYTHON=python3.11"'
  if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ]; then
    echo "$VENV exists and is not a virtual environment: not touching it" >&2
    return 1
  fi
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  PIP="$VENV/bin/pip"
  "$PIP" install -q --upgrade pip
  # 1. the same CPU torch / triton / numpy as the project venv (an unpinned torch pulls a multi-GB CUDA build)
  "$PIP" install -q torch==2.13.0 triton==3.6.0 "numpy<2.4"
  # 2. what the sglang modules the tests import need (layers, quantization, server_args, model_config,
  #    model_loader, plugins), resolved normally but with torch held at the CPU build, at sglang's pins
  #    where it pins; w12's own runtime deps (numba, click, ...) and pytest
  "$PIP" install -q torch==2.13.0 triton==3.6.0 "numpy<2.4" \
    transformers==5.19.0 tokenizers==0.23.2 compressed-tensors==0.18.0 apache-tvm-ffi==0.1.11 \
    sentencepiece==0.2.1 openai==2.8.0 numba==0.65.1 \
    orjson psutil pybase64 requests packaging pillow starlette anyio msgspec pydantic pyzmq tqdm \
    ipython aiohttp regex huggingface-hub safetensors dill loguru gguf einops partial_json_parser \
    click "pytest>=8"
  # 3. sglang itself without its ~80 CUDA-side dependencies, then w12 (editable, deps already present)
  "$PIP" install -q --no-deps sglang==0.5.23
  "$PIP" install -q --no-deps -e .
  # 4. tests/stubs (the torchvision stand-in) on sys.path of this env only
  SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$(pwd)/tests/stubs" > "$SITE/w12-test-stubs.pth"
  # 5. smoke check: the modules the tests use import, and the plugin entry point is installed
  "$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import sglang.srt.layers.linear, sglang.srt.layers.quantization, sglang.srt.server_args  # noqa: F401
import sglang.srt.model_loader.auto_loader, sglang.srt.configs.model_config, sglang.test.parallel_groups  # noqa: F401
eps = [e.value for e in md.entry_points(group="sglang.srt.plugins") if e.name == "w12"]
assert eps == ["w12.runtime.sglang_plugin:register"], f"w12 plugin entry point not installed: {eps}"
EOF
  touch "$STAMP"
  echo "sglang test env $VENV built in $(( $(date +%s) - start )) s"
}

main "$@"
