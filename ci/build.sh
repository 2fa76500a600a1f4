#!/usr/bin/env bash
# Configures (once) and builds clattn in ${CLATTN_BUILD_DIR:-build}.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${CLATTN_BUILD_DIR:-build}
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" --buildtype=release
fi
ninja -C "$build"
