#!/usr/bin/env bash
# The system packages each README command uses, installed when missing (Debian/Ubuntu, as root with apt-get):
#
#   scripts/system_deps.sh demo|test|hub|train|benchmark|grade   # what that command's path needs
#   scripts/system_deps.sh --list COMMAND          # the tools it needs, one a line (tests/test_setup.py reads it)
#
# The table below is the one place that says which command uses which tool; every Makefile target that README
# names runs this script with its own name first (tests/test_setup.py holds both). Where a tool is missing and
# cannot be installed (not root, or no apt-get), the command stops here, before any work, with one message that
# names what is missing and the command that installs it; only `make test` goes on, and its tests that need the
# tool skip.
set -euo pipefail

# tool         package        needed by (README commands)   what for
TABLE='
bwrap          bubblewrap     demo test hub grade benchmark        the sandbox every grading launch runs students'"'"' code in (lab_src/harness/sandbox.py)
chromium       chromium       test                          the browser tests (timeline widget, feedback, formgrader, course hub)
slurmctld      slurmctld      test                          the cluster-grading test (a real single-node Slurm)
slurmd         slurmd         test                          the cluster-grading test
sbatch         slurm-client   test                          the cluster-grading test
munged         munge          test                          Slurm'"'"'s authentication
npm            npm            test hub                      the course hub'"'"'s configurable-http-proxy (hub/setup.sh)
'

usage() { echo "usage: scripts/system_deps.sh [--list] demo|test|hub|train|benchmark|grade" >&2; exit 2; }
list=0
[ "${1:-}" = --list ] && { list=1; shift; }
cmd=${1:-}
case "$cmd" in demo|test|hub|train|benchmark|grade) ;; *) usage ;; esac

tools=(); pkgs=(); whys=()
while read -r tool pkg rest; do
  [ -n "$tool" ] || continue
  users=${rest%%  *}                       # the commands: up to the first double space
  why=$(echo "${rest#"$users"}" | sed 's/^ *//')
  for u in $users; do
    if [ "$u" = "$cmd" ]; then tools+=("$tool"); pkgs+=("$pkg"); whys+=("$why"); fi
  done
done <<<"$TABLE"

if [ "$list" = 1 ]; then
  printf '%s\n' "${tools[@]}"
  exit 0
fi

need=(); said=()
for i in "${!tools[@]}"; do
  if ! command -v "${tools[$i]}" >/dev/null 2>&1; then
    need+=("${pkgs[$i]}"); said+=("  ${pkgs[$i]} (${tools[$i]}): ${whys[$i]}")
  fi
done
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "make $cmd: installing system packages it needs: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  started=$SECONDS
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  echo "make $cmd: installed ${need[*]} in $((SECONDS - started)) s"
  exit 0
fi

why="not root"
[ "$(id -u)" = 0 ] && why="no apt-get here"
if [ "$cmd" = test ]; then
  echo "make test: not installing ${need[*]} ($why); the tests that need them will skip:" >&2
  printf '%s\n' "${said[@]}" >&2
  exit 0
fi
{
  echo "make $cmd cannot run here: it needs these system packages, which are not installed ($why):"
  printf '%s\n' "${said[@]}"
  echo "Install them once as root, then run make $cmd again:"
  echo "  sudo apt-get install --no-install-recommends ${need[*]}"
  [ "$(id -u)" = 0 ] || echo "(or run it as root: sudo make $cmd installs them itself)"
} >&2
exit 2
