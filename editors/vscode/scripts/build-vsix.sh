#!/usr/bin/env bash
# Builds the installable extension: editors/vscode/dgemma-lsp.vsix (what `make vsix` runs).
# Installs the locked npm dependencies (npm ci), type-checks, bundles the client
# into one file with esbuild (so the .vsix carries no node_modules) and packages
# it with @vscode/vsce, which needs Node >= 22: Node 24 comes from install-node.sh.
# Prints the path of the .vsix as its last line.
set -euo pipefail

HERE="$(cd "$(dirname "$0")/.." && pwd)"
NODE_BIN="$(bash "$HERE/scripts/install-node.sh")"
export PATH="$NODE_BIN:$PATH"
cd "$HERE"

# npm ci wipes node_modules: skip it while the lock file is older than the last install.
if ! [[ node_modules/.installed-from -nt package-lock.json ]]; then
  npm ci --no-fund --no-audit --loglevel=error
  touch node_modules/.installed-from
fi
npx --no-install tsc -p . --noEmit
npm run --silent bundle
rm -f dgemma-lsp.vsix
npm run --silent package >&2
echo "$HERE/dgemma-lsp.vsix"
