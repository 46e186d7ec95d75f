#!/usr/bin/env bash
# `make e2e`: the extension in a real VS Code (code-server 4.139 in headless
# Chromium, driven by playwright-core) against `dgemma-lsp --stdio --model tiny-random`
# (E2E_MODEL=tiny: the trained model, for the README's picture; its checks are about behaviour either way).
# Installs the tools (idempotent, into .tools/), builds and installs the .vsix
# into a fresh profile, runs e2e/run.mjs. Screenshots and logs land in
# artifacts/vscode/. Exits non-zero on failure; the last line reads
# `N passed, M failed`.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
HERE="$ROOT/editors/vscode"
SERVER="${DGEMMA_LSP:-$ROOT/.venv/bin/dgemma-lsp}"
ARTIFACTS="$ROOT/artifacts/vscode"
RUN_DIR="$ROOT/.tools/vscode-e2e-run"
started=$(date +%s)

fail() { echo "e2e: $*" >&2; echo "0 passed, 1 failed"; exit 1; }
[[ -x "$SERVER" ]] || fail "no server at $SERVER (run make first, or set DGEMMA_LSP)"

phase() { echo "e2e: $1 ($(( $(date +%s) - started )) s)" >&2; }
bash "$HERE/scripts/install-code-server.sh" || fail "installing code-server/chromium failed"
phase "tools ready"
VSIX="$(bash "$HERE/scripts/build-vsix.sh" | tail -1)" || fail "building the .vsix failed"
phase "built $VSIX"
NODE_BIN="$(bash "$HERE/scripts/install-node.sh")"
export PATH="$NODE_BIN:$PATH"
CODE_SERVER="$ROOT/.tools/code-server/node_modules/.bin/code-server"
export XDG_CONFIG_HOME="$ROOT/.tools/code-server/xdg/config" XDG_DATA_HOME="$ROOT/.tools/code-server/xdg/data"

# A fresh profile per run: VS Code remembers editors, dismissed prompts and extension state.
rm -rf "$RUN_DIR" "$ARTIFACTS"
mkdir -p "$RUN_DIR/user-data/User" "$RUN_DIR/extensions" "$RUN_DIR/workspace" "$ARTIFACTS"
printf 'auth: none\ncert: false\n' > "$RUN_DIR/config.yaml"
"$CODE_SERVER" --extensions-dir "$RUN_DIR/extensions" --user-data-dir "$RUN_DIR/user-data" \
  --config "$RUN_DIR/config.yaml" --install-extension "$VSIX" > "$ARTIFACTS/install-extension.log" 2>&1 \
  || fail "code-server --install-extension failed; see $ARTIFACTS/install-extension.log"

# Suggest widgets, hovers and the built-in AI features off: Tab must reach the inline suggestion.
cat > "$RUN_DIR/user-data/User/settings.json" <<JSON
{
  "dgemma.server.path": "$SERVER",
  "dgemma.server.args": ["--model", "${E2E_MODEL:-tiny-random}", "--engine", "inprocess",
                         "--log-file", "$ARTIFACTS/dgemma-lsp.log", "--log-level", "INFO"],
  "dgemma.steps": 8,
  "dgemma.maxTokens": 32,
  "dgemma.drafts": true,
  "dgemma.nextEditDebounceMs": 0,
  "dgemma.nextEditStrength": 0.6,
  "dgemma.trace.server": "messages",
  "editor.inlineSuggest.enabled": true,
  "editor.quickSuggestions": { "other": "off", "comments": "off", "strings": "off" },
  "editor.suggestOnTriggerCharacters": false,
  "editor.wordBasedSuggestions": "off",
  "editor.parameterHints.enabled": false,
  "editor.hover.enabled": false,
  "editor.minimap.enabled": false,
  "editor.fontSize": 16,
  "files.autoSave": "off",
  "chat.disableAIFeatures": true,
  "security.workspace.trust.enabled": false,
  "workbench.startupEditor": "none",
  "workbench.tips.enabled": false,
  "workbench.enableExperiments": false,
  "extensions.autoCheckUpdates": false,
  "extensions.autoUpdate": false,
  "update.mode": "none",
  "telemetry.telemetryLevel": "off"
}
JSON

phase "extension installed"
status=0
E2E_CODE_SERVER="$CODE_SERVER" E2E_RUN_DIR="$RUN_DIR" E2E_ARTIFACTS="$ARTIFACTS" \
  node "$HERE/e2e/run.mjs" || status=$?
echo "e2e: $(( $(date +%s) - started )) s; artifacts in $ARTIFACTS" >&2
exit "$status"
