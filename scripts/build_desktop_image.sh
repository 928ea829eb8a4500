#!/usr/bin/env bash
# Build the desktop sandbox image without a registry: debootstrap a minimal Debian with Xvfb,
# openbox, xterm, xdotool, x11-utils and python3-tk, then LibreOffice Calc, Writer and Impress
# (with its GTK 3 plugin, for an AT-SPI tree), the PCManFM file manager, the Firefox ESR web
# browser, Mousepad, GIMP, VLC, Thunderbird and Chromium, and AT-SPI (D-Bus, at-spi2-core, the
# GTK bridge, python3-pyatspi) for their accessibility trees, all without recommended packages
# (no Java, no help), then
# `docker import` it. The guest code is not in the image (it is bind-mounted read-only at run
# time). Reuses the image when it was built by this very script (its hash is the image's
# label parity.desktop.spec), else rebuilds it; --force rebuilds anyway.
set -euo pipefail
IMAGE="${PARITY_DESKTOP_IMAGE:-parity-desktop:latest}"
SPEC="$(sha256sum "$0" | cut -c1-16)"
MIRROR="$(bash "$(dirname "$0")/debian_mirror.sh")"
PACKAGES=python3,python3-tk,xvfb,xdotool,x11-utils,openbox,xterm,fonts-dejavu-core
# Installed with apt in the new root: debootstrap cannot order their maintainer scripts.
APPS="libreoffice-calc libreoffice-writer libreoffice-impress libreoffice-gtk3 pcmanfm firefox-esr mousepad gimp vlc thunderbird chromium dbus-daemon at-spi2-core libatk-adaptor libgail-common python3-pyatspi"
built="$(docker image inspect -f '{{ index .Config.Labels "parity.desktop.spec" }}' "$IMAGE" 2>/dev/null || true)"
if [[ "${1:-}" != "--force" && "$built" == "$SPEC" ]]; then
  echo "desktop image $IMAGE already present"
  exit 0
fi
ROOT="$(mktemp -d /tmp/parity-desktop-rootfs.XXXXXX)"
trap 'rm -rf "$ROOT"' EXIT
debootstrap --variant=minbase --include="$PACKAGES" bookworm "$ROOT" "$MIRROR" \
  >/tmp/parity-desktop-debootstrap.log 2>&1 \
  || { echo "debootstrap failed; see /tmp/parity-desktop-debootstrap.log" >&2; exit 1; }
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
# shellcheck disable=SC2086 # APPS is a list of package names
chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive sh -c \
  "apt-get update -qq && apt-get install -y -qq --no-install-recommends $APPS" \
  >>/tmp/parity-desktop-debootstrap.log 2>&1 \
  || { echo "installing $APPS failed; see /tmp/parity-desktop-debootstrap.log" >&2; exit 1; }
: >"$ROOT/etc/resolv.conf"
# Package caches, docs and translations are not needed to run the desktop, nor Mesa's OpenGL
# drivers and LLVM (about 160 MB): Xvfb runs without GLX acceleration when they are missing.
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/* \
  "$ROOT"/usr/share/doc "$ROOT"/usr/share/man "$ROOT"/usr/share/info "$ROOT"/usr/share/locale \
  "$ROOT"/usr/lib/*/dri "$ROOT"/usr/lib/*/libLLVM-*.so* "$ROOT"/usr/lib/*/libz3.so*
echo "user:x:1000:1000:user:/home/user:/bin/sh" >>"$ROOT/etc/passwd"
echo "user:x:1000:" >>"$ROOT/etc/group"
mkdir -p "$ROOT/home/user" "$ROOT/run/parity" "$ROOT/opt/parity/guest"
tar -C "$ROOT" -c . | docker import \
  -c 'USER 1000:1000' -c 'WORKDIR /home/user' -c 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
  -c 'ENV LANG=C.UTF-8' -c 'ENV HOME=/home/user' -c 'LABEL parity.desktop.image=1' -c "LABEL parity.desktop.spec=$SPEC" - "$IMAGE" >/dev/null
echo "built desktop image $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
