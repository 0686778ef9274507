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

# qemu_install: QEMU 10 or later (qemu-system-x86, qemu-utils). Under QEMU 7.2's
# multi-threaded TCG, guests die of run-time kernel code patching (Linux 6.1
# froze after about 1,000 switches of a static key, QEMU 10.0 after 9,000) and
# run cgroup-heavy work 2.5x slower (docs/development.md, "Guest kernels under
# emulation"). Debian bookworm ships 7.2, so there it comes from
# bookworm-backports, on this machine's mirror.
qemu_install() {
  local have
  have=$(qemu_major)
  [ "$have" -ge 10 ] && command -v qemu-img >/dev/null && return 0
  if grep -q '^VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then
    local list=/etc/apt/sources.list.d/headroom-bookworm-backports.list
    if [ ! -f "$list" ]; then
      echo "deb $(apt_mirror) bookworm-backports main" | as_root tee "$list" >/dev/null
      as_root apt-get -o DPkg::Lock::Timeout=900 update -q >/dev/null
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -q \
      --no-install-recommends -t bookworm-backports qemu-system-x86 qemu-utils >/dev/null
  else
    apt_install qemu-system-x86 qemu-utils
  fi
  have=$(qemu_major)
  if [ "$have" -lt 10 ]; then
    echo "need QEMU 10 or later for the node VMs, have major version $have (docs/development.md, \"Guest kernels under emulation\")" >&2
    return 1
  fi
}

# qemu_major: the installed qemu-system-x86_64's major version, 0 when none.
qemu_major() {
  local v=
  command -v qemu-system-x86_64 >/dev/null \
    && v=$(qemu-system-x86_64 --version | sed -nE '1s/.*version ([0-9]+)\..*/\1/p')
  echo "${v:-0}"
}
