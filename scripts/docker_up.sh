#!/usr/bin/env bash
# Start a Docker engine without a bridge network (if none answers) and build the sandbox image.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! docker info >/dev/null 2>&1; then
  nohup dockerd --bridge=none >/tmp/dockerd.log 2>&1 &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /tmp/dockerd.log" >&2; exit 1; }
fi
bash scripts/build_sandbox_image.sh
