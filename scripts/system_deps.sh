#!/usr/bin/env bash
# System packages the end-to-end tests need, installed only when missing (Debian/Ubuntu, as root):
# Chromium for the browser tests (timeline widget, course hub), Slurm and munge for the cluster-grading test,
# bubblewrap for the sandbox every grading launch runs in (lab_src/harness/sandbox.py),
# npm (with node) for the course hub's configurable-http-proxy.
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v slurmctld >/dev/null 2>&1 || need+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || need+=(slurmd)
command -v sbatch >/dev/null 2>&1 || need+=(slurm-client)
command -v munged >/dev/null 2>&1 || need+=(munge)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v npm >/dev/null 2>&1 || need+=(npm)          # configurable-http-proxy of the local hub (hub/)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "Not installing ${need[*]} (needs root and apt-get); the tests that need them will skip." >&2
  exit 0
fi
echo "Installing system packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
