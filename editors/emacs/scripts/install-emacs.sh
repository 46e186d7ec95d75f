#!/usr/bin/env bash
# Installs what the Emacs test drives: GNU Emacs (28 or later) and lsp-mode 10 with its elisp
# dependencies, the latter into .tools/emacs/elpa/ (gitignored).
#   Emacs     the one on PATH when it is 28 or later; else, as root, the machine's own Debian
#             `emacs-nox` (apt-get install --no-install-recommends: Emacs and its libraries only).
#             Debian's Emacs is built with native compilation and its dump file points into /usr,
#             so unlike Neovim 0.12 it cannot run unpacked from a private folder.
#   lsp-mode  Debian testing's elpa-lsp-mode 10.0.0 (stable's 8.0.0 has no inline completion) and
#             the elpa packages it needs: architecture-independent .el files, fetched with
#             `apt-get download` under a private apt config in .tools/apt/ (the machine's mirror,
#             suite `testing`) and unpacked with dpkg-deb -x. Never touches /etc/apt for these.
# Idempotent: what is already there is left alone (delete .tools/emacs to refetch lsp-mode).
# Needs: apt-get, dpkg-deb; network access to the machine's Debian mirror (editors/scripts/debian-testing.sh).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
TOOLS="${DGEMMA_TOOLS_DIR:-$ROOT/.tools}"
ELPA="$TOOLS/emacs/elpa"
LSP_MODE_VERSION=10.0.0
DEBS=(elpa-lsp-mode elpa-dash elpa-f elpa-ht elpa-lv elpa-markdown-mode elpa-s elpa-spinner)

log() { echo "install-emacs: $*" >&2; }
# debian_mirror, download_testing_debs
source "$ROOT/editors/scripts/debian-testing.sh"

emacs_major() { emacs --batch -Q --eval '(princ emacs-major-version)' 2>/dev/null || echo 0; }

install_emacs() {
  if command -v emacs >/dev/null && [ "$(emacs_major)" -ge 28 ]; then
    emacs --version | head -1 >&2
    return
  fi
  if [ "$(id -u)" != 0 ]; then
    log "no Emacs 28+ on PATH: install one (Debian: sudo apt-get install --no-install-recommends emacs-nox)"
    exit 1
  fi
  log "Emacs from the machine's Debian (emacs-nox)"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -q --no-install-recommends emacs-nox >&2; then
    apt-get update -q >&2  # a fresh machine may have no package lists yet
    apt-get install -y -q --no-install-recommends emacs-nox >&2
  fi
  emacs --version | head -1 >&2
}

install_lsp_mode() {
  if [ -f "$ELPA/lsp-mode-$LSP_MODE_VERSION/lsp-inline-completion.el" ]; then
    log "lsp-mode $LSP_MODE_VERSION already in $ELPA"
    return
  fi
  local apt="$TOOLS/apt-emacs"
  log "lsp-mode $LSP_MODE_VERSION and its dependencies from Debian testing"
  download_testing_debs "$apt" "$apt/debs" "${DEBS[@]}"
  local unpacked="$apt/root" deb
  mkdir -p "$unpacked"
  for deb in "$apt/debs"/*.deb; do dpkg-deb -x "$deb" "$unpacked"; done
  # Debian keeps each package's sources in elpa-src/<name>-<version>/ (byte-compiled at install
  # time by emacsen-common, which we skip: Emacs loads the .el files in a few seconds).
  rm -rf "$ELPA.tmp" && mkdir -p "$ELPA.tmp"
  cp -r "$unpacked/usr/share/emacs/site-lisp/elpa-src/." "$ELPA.tmp/"
  [ -f "$ELPA.tmp/lsp-mode-$LSP_MODE_VERSION/lsp-inline-completion.el" ] \
    || { log "Debian testing no longer has lsp-mode $LSP_MODE_VERSION: $(ls "$ELPA.tmp" | tr '\n' ' ')"; exit 1; }
  rm -rf "$ELPA" && mv "$ELPA.tmp" "$ELPA"
  rm -rf "$apt"
  log "lsp-mode in $ELPA: $(ls "$ELPA" | tr '\n' ' ')"
}

install_emacs
install_lsp_mode
