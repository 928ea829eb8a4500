#!/usr/bin/env bash
# Build the Docker sandbox image without a registry: debootstrap a minimal Debian with
# Python 3, then `docker import` it. Reuses the image when present (pass --force to rebuild).
# Users who can reach a registry may build sandboxes/docker/Dockerfile instead.
set -euo pipefail
IMAGE="${PARITY_SANDBOX_IMAGE:-parity-sandbox:bookworm}"
MIRROR="$(bash "$(dirname "$0")/debian_mirror.sh")"
if [[ "${1:-}" != "--force" ]] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "sandbox image $IMAGE already present"
  exit 0
fi
ROOT="$(mktemp -d /tmp/parity-sandbox-rootfs.XXXXXX)"
trap 'rm -rf "$ROOT"' EXIT
debootstrap --variant=minbase --include=python3 bookworm "$ROOT" "$MIRROR" >/tmp/parity-debootstrap.log 2>&1 \
  || { echo "debootstrap failed; see /tmp/parity-debootstrap.log" >&2; exit 1; }
# Nothing in the sandbox needs package tooling caches or documentation.
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/* \
  "$ROOT"/usr/share/doc "$ROOT"/usr/share/man "$ROOT"/usr/share/info "$ROOT"/usr/share/locale
mkdir -p "$ROOT/work"
chmod 1777 "$ROOT/work"
tar -C "$ROOT" -c . | docker import \
  -c 'USER 65534:65534' -c 'WORKDIR /work' -c 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
  -c 'ENV LANG=C.UTF-8' -c 'LABEL parity.sandbox.image=1' - "$IMAGE" >/dev/null
echo "built sandbox image $IMAGE"
