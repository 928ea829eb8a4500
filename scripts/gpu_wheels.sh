#!/usr/bin/env bash
# The Python packages parity's model package needs that the GPU machine's image lacks
# (pydantic and its own needs, at the versions pinned in pyproject.toml), as wheels for its
# Python 3.12 in .whl/ (git-ignored), to carry to it; docs/gpu.md shows the run command.
set -euo pipefail
cd "$(dirname "$0")/.."
pin() { grep -o "\"$1==[^\"]*\"" pyproject.toml | tr -d '"'; }
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl \
    "$(pin pydantic)" "$(pin pydantic-core)" "$(pin annotated-types)" "$(pin typing-inspection)" "$(pin typing-extensions)"
ls .whl
