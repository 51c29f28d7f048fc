#!/usr/bin/env bash
# Install the system packages gpuyard needs (as root, via apt) and make Podman usable on
# hosts with hybrid cgroup mounts and low open-file limits. Safe to run repeatedly:
# does nothing when everything is present, and never overwrites an existing
# /etc/containers/containers.conf.
set -euo pipefail

want=(podman runc busybox-static debootstrap openssh-client restic zstd caddy)
# Sized volumes: an ext4 image per volume, loop-mounted (docs/decisions.md "Disk sizes").
want+=(e2fsprogs util-linux)
# Training clusters that span hosts: the VXLAN overlay and its guards (runtimes/slurm/overlay.py)
# use ip/bridge, iptables and nft on every host, this one included.
want+=(iproute2 iptables nftables)
# SkyPilot's client (tests/e2e/test_skypilot_e2e.py) copies files to its pods with rsync.
want+=(rsync)
# PostgreSQL for the tests; Patroni and etcd for the failover test
# (tests/e2e/test_database_failover.py starts its own, by hand, on loopback).
[ "${WITH_POSTGRES:-0}" = 1 ] && want+=(postgresql patroni etcd-server)
# Simulated fleet hosts for tests and benchmarks: an sshd in each host's namespace
# (never started as a service here), ip for the namespaces, socat for bench_volume_move.
[ "${WITH_TEST_HOSTS:-0}" = 1 ] && want+=(openssh-server iproute2 socat)
# A private registry on loopback for the pull-with-credentials tests (docker-registry,
# htpasswd from apache2-utils); rsync for SkyPilot's client in its end-to-end test.
[ "${WITH_TEST_HOSTS:-0}" = 1 ] && want+=(docker-registry apache2-utils rsync)
# Benchmarks: wrk drives the HTTP proxy benchmark.
[ "${WITH_BENCH:-0}" = 1 ] && want+=(wrk)
# The web console's browser tests: Playwright drives Debian's chromium (its own browser
# download is not used). WITH_BROWSER=0 leaves it out.
[ "${WITH_BROWSER:-1}" = 1 ] && want+=(chromium)
missing=()
for pkg in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
    # The packages enable (and may start) machine-wide etcd and Patroni services; the
    # tests run their own. Services this run just installed are turned off again.
    if [ -d /run/systemd/system ]; then
      for pkg in etcd-server patroni; do
        case " ${missing[*]} " in
          *" $pkg "*) systemctl disable --now "${pkg%-server}" >/dev/null 2>&1 || true ;;
        esac
      done
    fi
  else
    echo "setup: missing ${missing[*]}; install them (apt-get install ${missing[*]}) or run as root" >&2
  fi
fi

conf=/etc/containers/containers.conf
if [ "$(id -u)" = 0 ] && command -v podman >/dev/null && [ ! -e "$conf" ]; then
  # Hybrid cgroup v1/v2 mounts break crun/systemd defaults; a low hard nofile limit
  # breaks podman's default ulimits. Only then is the file needed.
  hybrid=0; [ -d /sys/fs/cgroup/memory ] && [ ! -f /sys/fs/cgroup/cgroup.controllers ] && hybrid=1
  lowfiles=0; [ "$(ulimit -Hn)" != unlimited ] && [ "$(ulimit -Hn)" -lt 1048576 ] && lowfiles=1
  if [ $hybrid = 1 ] || [ $lowfiles = 1 ]; then
    echo "setup: writing $conf (runc, cgroupfs, lower ulimits)"
    mkdir -p /etc/containers
    cat > "$conf" <<'CONF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
CONF
  fi
fi
