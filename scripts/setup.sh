#!/usr/bin/env bash
# Create (or reuse) the project virtualenv .venv with every pinned dependency, lab_src installed editable.
# Re-running is cheap: nothing is reinstalled unless pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
stamp=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ -f "$stamp" ]; then
  exit 0
fi
echo "Setting up .venv with $($PY --version) (a few minutes the first time) ..."
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# torch==2.13.0 is pinned: pip takes the local CPU wheel where there is one, and never pulls a newer torch.
.venv/bin/pip install --quiet --disable-pip-version-check -e ".[instructor,dev]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import torch, nbgrader, lab_src; print('torch', torch.__version__, '| nbgrader', nbgrader.__version__)"
rm -f .venv/.installed-*
touch "$stamp"
