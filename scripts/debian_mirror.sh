#!/usr/bin/env bash
# Print the Debian mirror debootstrap should use: $DEBIAN_MIRROR, else the main (non-security)
# archive this machine's apt is configured with. No mirror address is written in the repo.
set -euo pipefail
if [[ -n "${DEBIAN_MIRROR:-}" ]]; then
  echo "$DEBIAN_MIRROR"
  exit 0
fi
mirror=$( { grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}';
            grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}'; } \
          | grep -E '/debian/?$' | head -n 1 || true)
if [[ -z "$mirror" ]]; then
  echo "no Debian mirror found in /etc/apt; set DEBIAN_MIRROR" >&2
  exit 1
fi
echo "$mirror"
