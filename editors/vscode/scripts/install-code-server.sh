#!/usr/bin/env bash
# Installs what the VS Code e2e drives: code-server (VS Code in a browser) into
# <repo>/.tools/code-server, and, through apt when missing, Debian's chromium and
# libkrb5-dev (code-server's native kerberos module builds against it).
# Why code-server: @vscode/test-electron downloads VS Code at run time, which an
# offline CI cannot; code-server comes from npm and is the same workbench.
# Idempotent: a second run checks versions and returns. Prints nothing on stdout.
set -euo pipefail

CODE_SERVER_VERSION=4.139.1
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
DEST="$ROOT/.tools/code-server"
BIN="$DEST/node_modules/.bin/code-server"
# code-server writes a default config and logs under XDG dirs on any start, --version too: keep them in the repo.
export XDG_CONFIG_HOME="$DEST/xdg/config" XDG_DATA_HOME="$DEST/xdg/data"

missing=()
command -v chromium >/dev/null || missing+=(chromium)
dpkg -s libkrb5-dev >/dev/null 2>&1 || [[ -x "$BIN" ]] || missing+=(libkrb5-dev)
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-code-server: run as root or install first: apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "install-code-server: apt-get install ${missing[*]}" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

NODE_BIN="$(bash "$ROOT/editors/vscode/scripts/install-node.sh")"
export PATH="$NODE_BIN:$PATH"
# Native modules (kerberos, node-pty, ...) must build against Node 24's headers,
# whatever nodedir the user's npmrc names.
export npm_config_nodedir="$(dirname "$NODE_BIN")"

if [[ -x "$BIN" ]] && "$BIN" --version 2>/dev/null | grep -q "^$CODE_SERVER_VERSION "; then
  exit 0
fi

echo "install-code-server: npm install code-server@$CODE_SERVER_VERSION (builds native modules, several minutes)" >&2
mkdir -p "$DEST"
[[ -f "$DEST/package.json" ]] || echo '{"private": true}' > "$DEST/package.json"
npm install --prefix "$DEST" --no-fund --no-audit --loglevel=error \
  "code-server@$CODE_SERVER_VERSION" >&2
"$BIN" --version >&2
