# The Docker VM of the local kind run, sourced by tests/kind/build.sh and
# tests/kind/local.sh. QEMU software emulation (TCG; this machine's /dev/kvm
# cannot boot a stock kernel), user-mode networking with restrict=on and
# explicit forwards only (ssh, dockerd's TCP socket, the kind API server's
# port), as tests/src/node_vm/qemu.rs boots the node VMs: nothing leaves the
# machine. The VM dies with the shell that started it (PDEATHSIG) and with
# vm_stop.
#
#   vm_start DISK_ARG KERNEL INITRD     DISK_ARG: qemu's -drive value
#   vm_wait_docker SECONDS              until `docker info` answers over the forward
#   vm_ssh 'shell line'
#   vm_stop                             poweroff (bounded), then kill
#
# Sets VM_DIR, VM_PID, VM_SSH_PORT, VM_API_PORT and exports DOCKER_HOST.

vm_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

vm_start() {
  local drive=$1 kernel=$2 initrd=$3
  VM_DIR=$(mktemp -d /tmp/headroom-kind-vm.XXXXXX)
  VM_SSH_PORT=$(vm_free_port)
  VM_DOCKER_PORT=$(vm_free_port)
  VM_API_PORT=${VM_API_PORT:-$(vm_free_port)}
  export DOCKER_HOST=tcp://127.0.0.1:$VM_DOCKER_PORT
  # The kind API server publishes 127.0.0.1:$VM_API_PORT in the VM; the same
  # port on the host's loopback forwards to it, so kind's kubeconfig works as written.
  setpriv --pdeathsig KILL qemu-system-x86_64 \
    -name headroom-kind-vm -nodefaults -no-user-config \
    -accel tcg,thread=multi,tb-size=512 -cpu max -smp "${HEADROOM_KIND_VM_CPUS:-2}" \
    -m "${HEADROOM_KIND_VM_MEMORY_MIB:-8192}" \
    -kernel "$kernel" -initrd "$initrd" \
    -append "root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 psi=1 mitigations=off no_timer_check panic=5 quiet systemd.show_status=false" \
    -drive "$drive" \
    -netdev "user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:$VM_SSH_PORT-:22,hostfwd=tcp:127.0.0.1:$VM_DOCKER_PORT-:2375,hostfwd=tcp:127.0.0.1:$VM_API_PORT-:$VM_API_PORT" \
    -device virtio-net-pci,netdev=n0 -device virtio-rng-pci \
    -display none -serial "file:$VM_DIR/console.log" -no-reboot &
  VM_PID=$!
  echo "$VM_PID" > "$VM_DIR/pid"
}

vm_ssh() {
  ssh -q -i "$VM_KEY" -p "$VM_SSH_PORT" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
    -o ConnectTimeout=10 -o BatchMode=yes root@127.0.0.1 "$@"
}

vm_wait_docker() {
  local deadline=$(( $(date +%s) + $1 ))
  until timeout 20 docker info >/dev/null 2>&1; do
    if ! kill -0 "$VM_PID" 2>/dev/null; then
      echo "kind VM: qemu exited; console:" >&2; tail -n 40 "$VM_DIR/console.log" >&2; return 1
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "kind VM: docker not answering after $1 s; console:" >&2; tail -n 40 "$VM_DIR/console.log" >&2
      vm_ssh 'systemctl --failed --no-pager; journalctl -u docker --no-pager | tail -n 30' >&2 || true
      return 1
    fi
    sleep 5
  done
}

vm_stop() {
  [ -n "${VM_PID:-}" ] || return 0
  if kill -0 "$VM_PID" 2>/dev/null; then
    vm_ssh 'systemctl poweroff' >/dev/null 2>&1 || true
    local i
    for i in $(seq 1 "${1:-90}"); do kill -0 "$VM_PID" 2>/dev/null || break; sleep 1; done
    kill -KILL "$VM_PID" 2>/dev/null || true
  fi
  wait "$VM_PID" 2>/dev/null || true
  VM_PID=
  rm -rf "$VM_DIR"
}
