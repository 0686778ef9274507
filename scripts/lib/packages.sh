# Sourced by the build scripts (scripts/static-build.sh, scripts/build-image.sh,
# tests/node-vm/build.sh): root, and the Debian packages they install on first use.

# Runs "$@" as root: directly, or through sudo.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    printf 'need root to run: %s\n' "$*" >&2; exit 1
  fi
}

# apt_install PKG...: installs the packages, refreshing the package lists once
# if the first try fails (a fresh machine may have none). Waits for another
# apt run's lock instead of failing (parallel builds share one machine).
apt_install() {
  as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -q --no-install-recommends "$@" >/dev/null \
    || { as_root apt-get -o DPkg::Lock::Timeout=900 update -q >/dev/null \
         && as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -q --no-install-recommends "$@" >/dev/null; }
}

# apt_mirror: the Debian mirror this machine's apt sources name (deb822 or
# one-line sources), for debootstrap; deb.debian.org when none is named.
apt_mirror() {
  local m
  m=$(grep -hoE '^URIs: *\S+' /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | awk '{print $2}' | grep -v security | head -n1 || true)
  [ -n "$m" ] || m=$(grep -hoE '^deb +\S+' /etc/apt/sources.list 2>/dev/null \
        | awk '{print $2}' | head -n1 || true)
  echo "${m:-http://deb.debian.org/debian}"
}
