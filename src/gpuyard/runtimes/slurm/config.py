"""Render the files a Slurm node container needs. Pure: no I/O, no engine.

The control plane writes these files into ``/etc/gpuyard/`` of each node container
(see :class:`gpuyard.runtimes.slurm.nodes.SlurmNodeRuntime`); the node's PID-1 script
(:func:`entrypoint_script`) installs them with the right owners and starts the daemons.

Targets Slurm 22.05 (Debian bookworm's ``slurm-wlm``) in containers on hosts that may
mount cgroup v1 and v2 side by side, which is why nothing here uses a cgroup plugin.
Workers are Slurm *dynamic nodes* (``slurmd -Z``): the controller's configuration never
lists them, so adding a worker needs no reconfiguration of the controller.
"""

from __future__ import annotations

import re

from gpuyard.core.training.clusters import LIFECYCLE_LOG, LIFECYCLE_RC

# Debian's slurm packages create these directories owned by the ``slurm`` user; the
# controller's state volume is mounted on STATE_DIR, so a new (empty) volume starts
# with the image's ownership and a restarted controller finds its saved state there.
STATE_DIR = "/var/lib/slurm/slurmctld"
SLURMD_SPOOL_DIR = "/var/lib/slurm/slurmd"
PARTITION = "gpu"
CONFIG_DIR = "/etc/gpuyard"
IMAGE_VERSION_FILE = "/etc/gpuyard-image-version"
# Under /dev (a tmpfs the engine recreates on every start), so the entrypoint remakes
# the links each start and a stale link can never survive a device change.
GPU_DEVICE_DIR = "/dev/gpuyard"
SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818

# A Slurm node name, container name and DNS label at once: lowercase letters, digits and
# inner hyphens, at most 63 characters (a hostname label). Slurm's hostlist syntax gives
# "[", "]" and "," meaning, and "_" is not valid in a DNS name.
_NODE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def valid_node_name(name: str) -> bool:
    """True when ``name`` can be a container name, hostname and Slurm NodeName."""
    return _NODE_NAME.fullmatch(name) is not None


def _check_name(what: str, name: str) -> None:
    if not valid_node_name(name):
        raise ValueError(
            f"{what} {name!r} must be lowercase letters, digits and inner hyphens "
            "(at most 63 characters)"
        )


def slurm_conf(cluster_name: str, controller: str, max_nodes: int) -> str:
    """``slurm.conf`` shared by the controller and every worker.

    ``controller`` is the controller's hostname (its container name, resolvable through
    the cluster network's DNS). ``max_nodes`` bounds the number of dynamic nodes the
    controller accepts (Slurm's ``MaxNodeCount``); it may exceed the current size so
    workers can be added without rewriting this file. Raises ValueError on a name that
    is not a valid node/cluster name or on ``max_nodes < 1``.
    """
    _check_name("cluster name", cluster_name)
    _check_name("controller name", controller)
    if max_nodes < 1:
        raise ValueError(f"max_nodes must be at least 1, got {max_nodes}")
    lines = [
        "# Written by gpuyard; the controller and every worker share this file.",
        f"ClusterName={cluster_name}",
        f"SlurmctldHost={controller}",
        "SlurmUser=slurm",
        "SlurmdUser=root",
        f"SlurmctldPort={SLURMCTLD_PORT}",
        f"SlurmdPort={SLURMD_PORT}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"StateSaveLocation={STATE_DIR}",
        f"SlurmdSpoolDir={SLURMD_SPOOL_DIR}",
        # In a directory the slurm user owns, so slurmctld can remove its pid file.
        "SlurmctldPidFile=/run/slurm/slurmctld.pid",
        "SlurmdPidFile=/run/slurm/slurmd.pid",
        # Workers join as dynamic nodes (slurmd -Z); none is listed here.
        f"MaxNodeCount={max_nodes}",
        # Dynamic node names are only known to the controller, so slurmds cannot
        # forward messages to each other: the controller talks to every node directly.
        "TreeWidth=65533",
        # Containers on a possibly hybrid cgroup v1/v2 host: no cgroup plugins.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        # The image has no mail transport; the default MailProg logs an error each start.
        "MailProg=/bin/true",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        # Memory is not a consumable: a job without --mem would otherwise claim a
        # whole node's memory and serialize small jobs.
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        # slurmd detects the host's CPUs and memory, not the container's limits, so
        # the sizes the control plane configured are authoritative.
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=60",
        "InactiveLimit=0",
        "KillWait=10",
        "MinJobAge=300",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def gres_conf(gpu_count: int) -> str:
    """``gres.conf`` for a worker with ``gpu_count`` GPUs (0: none).

    Slurm 22.05's gpu plugin silently drops a count-only line (``Name=gpu Count=N``, no
    ``File=``) and then marks the node INVALID ("gres/gpu count reported lower than
    configured"), and it wants each ``File`` to be a character device. So each GPU is a
    path ``GPU_DEVICE_DIR/gpu<i>`` that the entrypoint links, on every start, to the
    container's i-th ``/dev/nvidia<n>`` when there is one and to ``/dev/null`` when there
    is none (hosts without real GPUs). Slurm numbers ``CUDA_VISIBLE_DEVICES`` for a step
    by position in this list, which is how CUDA numbers the container's GPUs too.
    """
    if gpu_count < 0:
        raise ValueError(f"gpu_count must not be negative, got {gpu_count}")
    lines = ["# Written by gpuyard.", "AutoDetect=off"]
    if gpu_count == 1:
        lines.append(f"Name=gpu File={GPU_DEVICE_DIR}/gpu0")
    elif gpu_count > 1:
        lines.append(f"Name=gpu File={GPU_DEVICE_DIR}/gpu[0-{gpu_count - 1}]")
    return "\n".join(lines) + "\n"


def worker_conf_arg(cpus: int, memory_mb: int, gpu_count: int) -> str:
    """The node line a worker registers with: ``slurmd -Z --conf "<this>"``."""
    if cpus < 1:
        raise ValueError(f"cpus must be at least 1, got {cpus}")
    if memory_mb < 1:
        raise ValueError(f"memory_mb must be at least 1, got {memory_mb}")
    if gpu_count < 0:
        raise ValueError(f"gpu_count must not be negative, got {gpu_count}")
    parts = [f"CPUs={cpus}", f"RealMemory={memory_mb}"]
    if gpu_count:
        parts.append(f"Gres=gpu:{gpu_count}")
    return " ".join(parts)


# The node's PID 1. Kept free of `set -x` and of any echo of file contents: the munge
# key passes through here and must never reach the container log.
_ENTRYPOINT = r"""#!/bin/bash
# gpuyard Slurm node entrypoint (PID 1). Installs what the control plane put into
# __CONF__/, starts munged, sshd and slurmctld (controller) or slurmd -Z (worker),
# runs __CONF__/lifecycle.sh once per container, and stops everything on SIGTERM.
set -u
CONF=__CONF__
ROLE="${GPUYARD_ROLE:-worker}"
NODE="${GPUYARD_NODE_NAME:-$(hostname)}"
log() { echo "gpuyard-node[$NODE]: $*"; }
die() { log "$*"; exit 1; }

PIDS=()
HELPERS=()
SLURM_PID=""
# Slurm first, munged last: slurmctld still signs messages while it shuts down, and
# without munged it waits 3 s on each one it cannot send.
stop_daemons() {
  [ ${#HELPERS[@]} -gt 0 ] && kill -TERM "${HELPERS[@]}" 2>/dev/null
  if [ -n "$SLURM_PID" ]; then
    kill -TERM "$SLURM_PID" 2>/dev/null
    wait "$SLURM_PID" 2>/dev/null
  fi
  [ ${#PIDS[@]} -gt 0 ] && kill -TERM "${PIDS[@]}" 2>/dev/null
  wait "${PIDS[@]}" 2>/dev/null
}
stop_all() {
  log "stopping"
  stop_daemons
  exit 0
}
trap stop_all TERM INT

# install SRC DEST MODE OWNER: copy one control-plane file into place, if present.
put() {
  [ -f "$CONF/$1" ] || return 1
  install -D -m "$3" -o "${4%%:*}" -g "${4##*:}" "$CONF/$1" "$2"
}

# Runtime directories: /run and the pid files in it survive `restart` in the
# container's layer, so stale ones are cleared rather than trusted.
rm -rf /run/slurm /run/sshd.pid
mkdir -p /run/munge /run/sshd /run/slurm \
  "$(dirname __LIFECYCLE_RC__)" "$(dirname __LIFECYCLE_LOG__)"
chown slurm:slurm /run/slurm
chown munge:munge /run/munge /var/lib/munge /var/log/munge /etc/munge
chmod 0755 /run/munge
chmod 0700 /etc/munge

put munge.key /etc/munge/munge.key 0400 munge:munge || die "missing $CONF/munge.key"
put slurm.conf /etc/slurm/slurm.conf 0644 root:root || die "missing $CONF/slurm.conf"
put gres.conf /etc/slurm/gres.conf 0644 root:root || true
install -d -m 0700 -o root -g root /root/.ssh
put authorized_keys /root/.ssh/authorized_keys 0600 root:root || true

# Host keys are made per container (the image ships none), once: restarts keep them.
ssh-keygen -A >/dev/null

setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged --foreground --force &
PIDS+=($!)
for _ in $(seq 50); do [ -S /run/munge/munge.socket.2 ] && break; sleep 0.1; done

/usr/sbin/sshd -D -e &
PIDS+=($!)

case "$ROLE" in
  controller)
    chown slurm:slurm __STATE_DIR__
    chmod 0700 __STATE_DIR__
    # Default start mode recovers jobs and nodes from the state dir.
    /usr/sbin/slurmctld -D &
    SLURM_PID=$!
    ;;
  worker)
    SLURMD_CONF="${GPUYARD_SLURMD_CONF:-}"
    if [ -z "$SLURMD_CONF" ]; then
      SLURMD_CONF="CPUs=${GPUYARD_CPUS:-1} RealMemory=${GPUYARD_MEMORY_MB:-1024}"
      [ "${GPUYARD_GPUS:-0}" -gt 0 ] && SLURMD_CONF="$SLURMD_CONF Gres=gpu:${GPUYARD_GPUS}"
    fi
    # Slurm 22.05 keeps a dynamic node's NodeAddr from its first registration and does
    # not update it when the node registers again, but the engine gives a restarted
    # container a new IP. So a node the controller already knows is re-addressed
    # (root is a Slurm admin through munge); "Invalid node name" means it is new.
    CTL=$(sed -n 's/^SlurmctldHost=//p' /etc/slurm/slurm.conf | head -n1)
    readdress() {
      local ctl_ip my_ip out
      ctl_ip=$(getent ahostsv4 "$CTL" | awk 'NR == 1 { print $1 }')
      my_ip=$(ip -o -4 route get "${ctl_ip:-0.0.0.0}" 2>/dev/null \
        | sed -n 's/.* src \([0-9.]*\).*/\1/p')
      [ -n "$my_ip" ] || return 1
      out=$(timeout 5 scontrol update NodeName="$NODE" NodeAddr="$my_ip" \
        NodeHostname="$NODE" 2>&1) && { log "re-addressed $NODE to $my_ip"; return 0; }
      case "$out" in *"Invalid node name"*) return 0 ;; esac
      return 1
    }
    # Until it succeeds, in the background: a controller that is down must not keep
    # slurmd from starting, nor the trap from running. slurmd waits for it up to 5 s,
    # so with the controller up the node registers at its new address at once.
    ( until readdress; do sleep 2; done ) &
    HELPERS+=($!)
    for _ in $(seq 50); do kill -0 "${HELPERS[-1]}" 2>/dev/null || break; sleep 0.1; done
    mkdir -p __SPOOL_DIR__ __GPU_DIR__
    # gres.conf names __GPU_DIR__/gpu<i>: the i-th real GPU when present, else /dev/null.
    mapfile -t REAL < <(ls /dev/nvidia[0-9]* 2>/dev/null | sort -V)
    for ((i = 0; i < ${GPUYARD_GPUS:-0}; i++)); do
      ln -sfn "${REAL[$i]:-/dev/null}" "__GPU_DIR__/gpu$i"
    done
    /usr/sbin/slurmd -D -Z -N "$NODE" --conf "$SLURMD_CONF" &
    SLURM_PID=$!
    ;;
  *) die "GPUYARD_ROLE must be controller or worker, got '$ROLE'" ;;
esac
log "started role=$ROLE"

if [ -e __LIFECYCLE_RC__.started ] && [ ! -e __LIFECYCLE_RC__ ]; then
  # Started in an earlier life of this container and cut short by its stop before its
  # shell could write a code: it is not run again, and it did not succeed (143: ended
  # by SIGTERM).
  echo "gpuyard: the lifecycle script was interrupted by a restart" >>__LIFECYCLE_LOG__
  echo 143 >__LIFECYCLE_RC__
fi
if [ -f "$CONF/lifecycle.sh" ] && [ ! -e __LIFECYCLE_RC__.started ]; then
  # At most once per container, also across restarts. The exit code is written to a
  # temporary file and renamed, so a reader never sees it half-written.
  touch __LIFECYCLE_RC__.started
  ( bash "$CONF/lifecycle.sh" >__LIFECYCLE_LOG__ 2>&1
    echo $? >__LIFECYCLE_RC__.tmp && mv __LIFECYCLE_RC__.tmp __LIFECYCLE_RC__ ) </dev/null &
fi

# A daemon that dies ends the container, so the engine reports it exited instead of
# the node lingering half-alive. `wait -n` returns early when the trap fires.
wait -n "$SLURM_PID" "${PIDS[@]}"
rc=$?
log "a daemon exited with code $rc"
stop_daemons
exit "$rc"
"""


def entrypoint_script() -> str:
    """The node's PID-1 script (bash), installed in the image as ``/usr/local/bin/
    gpuyard-node``. Reads ``GPUYARD_ROLE`` (``controller``/``worker``),
    ``GPUYARD_NODE_NAME``, ``GPUYARD_CPUS``, ``GPUYARD_MEMORY_MB``, ``GPUYARD_GPUS`` and,
    when set, ``GPUYARD_SLURMD_CONF`` (a :func:`worker_conf_arg` string that wins over
    the three sizes). Never prints file contents."""
    return (
        _ENTRYPOINT.replace("__CONF__", CONFIG_DIR)
        .replace("__STATE_DIR__", STATE_DIR)
        .replace("__SPOOL_DIR__", SLURMD_SPOOL_DIR)
        .replace("__GPU_DIR__", GPU_DEVICE_DIR)
        .replace("__LIFECYCLE_RC__", LIFECYCLE_RC)
        .replace("__LIFECYCLE_LOG__", LIFECYCLE_LOG)
    )
