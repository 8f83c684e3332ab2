#!/usr/bin/env bash
# The local course hub's software, built once and cached (re-running is cheap):
#   $HUB_HOME/venv   the single-user environment: the system Python, the pins of pyproject.toml
#                    (runtime + instructor + hub extras: torch, JupyterLab, nbgrader, JupyterHub) and
#                    lab_src installed as a package (not editable: students never need this checkout)
#   $HUB_HOME/node   configurable-http-proxy 5.3.0 from the npm registry
# Every student's server runs this Python as that student, so it must be readable and executable by
# every user: it is built from the system Python (not pyenv's, which lives under root's mode-700 home)
# in a folder whose every parent is traversable. HUB_HOME is printed on the last line.
#   HUB_HOME: $PP_LAB_HUB_HOME, else out/hub in this checkout when every parent folder of it is
#   traversable by others, else /var/tmp/pp-lab-hub.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

traversable() {   # every folder from / to $1 lets others in
  local d=$1
  while [ "$d" != / ]; do
    local mode
    mode=$(stat -c %A "$d" 2>/dev/null) || return 1
    case "${mode:9:1}" in x|t) ;; *) return 1 ;; esac
    d=$(dirname "$d")
  done
}

if [ -n "${PP_LAB_HUB_HOME:-}" ]; then
  HUB_HOME=$PP_LAB_HUB_HOME
elif traversable "$ROOT"; then
  HUB_HOME=$ROOT/out/hub
else
  HUB_HOME=/var/tmp/pp-lab-hub
fi
mkdir -p "$HUB_HOME"
chmod 755 "$HUB_HOME"
traversable "$HUB_HOME" || { echo "hub/setup.sh: $HUB_HOME is not traversable by other users; set PP_LAB_HUB_HOME" >&2; exit 1; }

# A Python every user can run: the system one (python3.11 or newer on Debian 12).
PY=${PP_LAB_HUB_PYTHON:-/usr/bin/python3}
"$PY" -c 'import sys, venv; assert sys.version_info >= (3, 10), sys.version' \
  || { echo "hub/setup.sh: $PY is not a Python >= 3.10 with venv (apt-get install python3-venv)" >&2; exit 1; }
case "$(readlink -f "$PY")" in /root/*|/home/*) echo "hub/setup.sh: $PY lives in a home folder; students cannot run it" >&2; exit 1 ;; esac

deps=$(cat pyproject.toml | sha1sum | cut -c1-12)
pkg=$(git ls-files -s lab_src pyproject.toml 2>/dev/null | sha1sum | cut -c1-12)
[ -n "$(git status --porcelain lab_src 2>/dev/null)" ] && pkg=$(find lab_src -name '*.py' -type f | sort | xargs cat | sha1sum | cut -c1-12)
VENV=$HUB_HOME/venv
if [ ! -f "$VENV/.deps-$deps" ]; then
  echo "hub/setup.sh: building the single-user environment in $VENV (a few minutes the first time) ..." >&2
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "$ROOT[instructor,hub]" 2>&1 | grep -v "^WARNING: Location" >&2 || true
  "$VENV/bin/python" -c "import torch, nbgrader, jupyterhub, lab_src" >&2
  rm -f "$VENV"/.deps-* "$VENV"/.pkg-*
  touch "$VENV/.deps-$deps" "$VENV/.pkg-$pkg"
fi
if [ ! -f "$VENV/.pkg-$pkg" ]; then   # lab_src changed: reinstall the package only
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --force-reinstall "$ROOT" >&2
  rm -f "$VENV"/.pkg-*
  touch "$VENV/.pkg-$pkg"
fi
rm -rf "$ROOT/build"   # what pip left of building the package

# JupyterLab without news or update pop-ups for everybody on this environment
mkdir -p "$VENV/share/jupyter/lab/settings"
cat > "$VENV/share/jupyter/lab/settings/overrides.json" <<'EOF'
{"@jupyterlab/apputils-extension:notification": {"checkForUpdates": false, "fetchNews": "false"}}
EOF

CHP=$HUB_HOME/node/node_modules/.bin/configurable-http-proxy
if [ ! -x "$CHP" ] || [ "$("$CHP" --version 2>/dev/null)" != 5.3.0 ]; then
  command -v npm >/dev/null || { echo "hub/setup.sh: npm is missing (apt-get install nodejs npm)" >&2; exit 1; }
  echo "hub/setup.sh: installing configurable-http-proxy 5.3.0 into $HUB_HOME/node ..." >&2
  npm install --silent --no-audit --no-fund --prefix "$HUB_HOME/node" configurable-http-proxy@5.3.0 >&2
fi
chmod -R go+rX "$VENV" "$HUB_HOME/node"
echo "$HUB_HOME"
