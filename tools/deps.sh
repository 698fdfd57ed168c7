#!/usr/bin/env bash
# Installs the Debian 12 packages given as arguments that are missing (apt-get, via sudo when not
# root). Nothing is installed when every package is present. When the package index cannot be
# refreshed or a package cannot be installed (no network), it warns and carries on: the build then
# reports what is really missing.
# Usage: tools/deps.sh package...
set -uo pipefail
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]})) || exit 0
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
echo "tools/deps.sh: installing ${missing[*]}" >&2
if ! "${sudo[@]}" apt-get update; then
  echo "tools/deps.sh: warning: apt-get update failed; trying the packages from the current index" >&2
fi
if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"; then
  echo "tools/deps.sh: warning: could not install ${missing[*]}; continuing with what is present" >&2
fi
exit 0
