# Sourced by editors/nvim/scripts/install-nvim.sh and editors/emacs/scripts/install-emacs.sh: .deb
# packages from Debian testing, fetched from the machine's own Debian mirror under a private apt
# config, without touching /etc/apt, the system's apt state or what is installed.
# Needs: apt-get; the calling script's `log` function.

# The machine's Debian mirror, as its apt sources name it: the first source (deb822 .sources files,
# then the one-line sources.list format) whose suite is this release's codename (/etc/os-release),
# e.g. bookworm, so neither a security archive nor a third party's repository (suite `nodistro`, ...).
# $DGEMMA_DEBIAN_MIRROR overrides it (a machine that is not Debian, or whose sources name no mirror).
debian_mirror() {
  if [ -n "${DGEMMA_DEBIAN_MIRROR:-}" ]; then
    echo "$DGEMMA_DEBIAN_MIRROR"
    return
  fi
  local codename uri="" file
  codename="$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")"
  if [ -z "$codename" ]; then
    log "no release codename in /etc/os-release: set DGEMMA_DEBIAN_MIRROR to a Debian mirror's URL"
    return 1
  fi
  for file in /etc/apt/sources.list.d/*.sources; do
    [ -f "$file" ] || continue
    # Paragraph mode: one deb822 stanza a record; comment lines are not fields.
    uri="$(awk -v codename="$codename" 'BEGIN { RS = ""; FS = "\n" }
      {
        types = ""; uris = ""; suites = ""; enabled = "yes"
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^#/) continue
          split($i, kv, ":[ \t]*")
          key = tolower(kv[1]); value = substr($i, length(kv[1]) + 2); sub(/^[ \t]+/, "", value)
          if (key == "types") types = value
          else if (key == "uris") uris = value
          else if (key == "suites") suites = value
          else if (key == "enabled") enabled = tolower(value)
        }
        if (enabled == "no" || (" " types " ") !~ / deb /) next
        if ((" " suites " ") ~ (" " codename " ")) { split(uris, u, /[ \t]+/); print u[1]; exit }
      }' "$file")"
    [ -z "$uri" ] || break
  done
  if [ -z "$uri" ]; then
    for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [ -f "$file" ] || continue
      # deb [options] URI suite components...: the options may hold spaces, so the URI is the
      # first field after them.
      uri="$(awk -v codename="$codename" '$1 == "deb" {
          line = $0; sub(/^deb[ \t]+(\[[^]]*\][ \t]+)?/, "", line); split(line, f, /[ \t]+/)
          if (f[2] == codename) { print f[1]; exit }
        }' "$file")"
      [ -z "$uri" ] || break
    done
  fi
  if [ -z "$uri" ]; then
    log "no Debian $codename source in /etc/apt/sources.list(.d): set DGEMMA_DEBIAN_MIRROR to a Debian mirror's URL"
    return 1
  fi
  echo "$uri"
}

# download_testing_debs APT_DIR DEST PACKAGE...: the packages' .debs (no dependencies resolved) from
# Debian testing on the machine's mirror, into DEST. APT_DIR holds the private apt state (lists,
# cache); the caller removes it when done.
download_testing_debs() {
  local apt="$1" dest="$2" mirror
  shift 2
  mirror="$(debian_mirror)"
  log "from Debian testing on $mirror: $*"
  rm -rf "$apt" && mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/parts" "$apt/prefs" "$dest"
  echo "deb [arch=amd64] $mirror testing main" > "$apt/sources.list"
  # Every path apt reads or writes points into $apt; the sandbox user is the caller itself, so the
  # private dirs need no chown when run as root in CI.
  local opts=(
    -o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=$apt/parts"
    -o "Dir::Etc::Preferences=$apt/prefs/none" -o "Dir::Etc::PreferencesParts=$apt/prefs"
    -o "Dir::State=$apt" -o "Dir::State::Lists=$apt/lists" -o "Dir::State::status=/dev/null"
    -o "Dir::Cache=$apt/cache" -o "Dir::Cache::archives=$apt/cache/archives"
    -o "APT::Architecture=amd64" -o "APT::Architectures=amd64" -o "APT::Sandbox::User=$(id -un)"
    -o "Acquire::Languages=none" -o "Debug::NoLocking=1"
  )
  apt-get "${opts[@]}" -q update >&2
  (cd "$dest" && apt-get "${opts[@]}" -q download "$@" >&2)
}
