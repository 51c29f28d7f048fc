"""The pure renderers of the files a Slurm node container needs."""

from __future__ import annotations

import re
import subprocess

import pytest

from gpuyard.core.training.clusters import LIFECYCLE_LOG, LIFECYCLE_RC
from gpuyard.runtimes.slurm.config import (
    CONFIG_DIR,
    GPU_DEVICE_DIR,
    PARTITION,
    STATE_DIR,
    entrypoint_script,
    gres_conf,
    slurm_conf,
    valid_node_name,
    worker_conf_arg,
)
from tests.required_parts import needs_tools


def settings(text: str) -> dict[str, str]:
    """``Key=Value`` lines of a Slurm config (the first word of the line for
    multi-field lines such as PartitionName)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        assert key not in out, f"duplicate {key}"
        out[key] = value
    return out


def test_slurm_conf_dynamic_nodes_and_container_friendly_plugins() -> None:
    conf = settings(slurm_conf("tc12", "gy-tc12-ctl", 9))
    assert conf["ClusterName"] == "tc12"
    assert conf["SlurmctldHost"] == "gy-tc12-ctl"
    assert conf["MaxNodeCount"] == "9"
    assert conf["TreeWidth"] == "65533"
    assert conf["StateSaveLocation"] == STATE_DIR
    assert conf["SelectType"] == "select/cons_tres"
    assert conf["GresTypes"] == "gpu"
    assert conf["ProctrackType"] == "proctrack/linuxproc"
    assert conf["TaskPlugin"] == "task/none"
    assert conf["ReturnToService"] == "2"
    assert conf["AuthType"] == "auth/munge"
    assert int(conf["SlurmdTimeout"]) > 0 and int(conf["SlurmctldTimeout"]) > 0
    # No node is listed: workers register themselves with slurmd -Z.
    assert "NodeName" not in conf
    assert conf["PartitionName"].split() == [
        PARTITION,
        "Nodes=ALL",
        "Default=YES",
        "MaxTime=INFINITE",
        "State=UP",
    ]
    assert "cgroup" not in slurm_conf("tc12", "gy-tc12-ctl", 9)


def test_slurm_conf_is_deterministic() -> None:
    assert slurm_conf("a", "a-ctl", 3) == slurm_conf("a", "a-ctl", 3)


@pytest.mark.parametrize(
    ("cluster", "controller", "max_nodes"),
    [
        ("Bad_Name", "ctl", 2),
        ("ok", "ctl,other", 2),
        ("ok", "ctl[1-2]", 2),
        ("ok", "-ctl", 2),
        ("ok", "ctl", 0),
        ("ok", "x" * 64, 2),
    ],
)
def test_slurm_conf_rejects_bad_input(cluster: str, controller: str, max_nodes: int) -> None:
    with pytest.raises(ValueError):
        slurm_conf(cluster, controller, max_nodes)


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("gy-tc12-worker-1", True),
        ("a", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("Gy-tc12", False),
        ("gy_tc12", False),
        ("gy-tc12-", False),
        ("gy.tc12", False),
        ("", False),
    ],
)
def test_valid_node_name(name: str, ok: bool) -> None:
    assert valid_node_name(name) is ok


def test_gres_conf_names_one_device_per_gpu() -> None:
    assert settings(gres_conf(0)) == {"AutoDetect": "off"}
    assert f"Name=gpu File={GPU_DEVICE_DIR}/gpu0\n" in gres_conf(1)
    assert f"Name=gpu File={GPU_DEVICE_DIR}/gpu[0-7]\n" in gres_conf(8)
    assert "AutoDetect=off" in gres_conf(8)
    # Slurm drops a gpu line without File=, so there must be no count-only line.
    assert "Count=" not in gres_conf(8)
    with pytest.raises(ValueError):
        gres_conf(-1)


def test_worker_conf_arg() -> None:
    assert worker_conf_arg(8, 65536, 2) == "CPUs=8 RealMemory=65536 Gres=gpu:2"
    assert worker_conf_arg(1, 512, 0) == "CPUs=1 RealMemory=512"
    for bad in ((0, 512, 0), (1, 0, 0), (1, 512, -1)):
        with pytest.raises(ValueError):
            worker_conf_arg(*bad)


def test_entrypoint_script_contract() -> None:
    script = entrypoint_script()
    assert script.startswith("#!/bin/bash\n")
    assert re.search(r"__[A-Z_]+__", script) is None  # every placeholder substituted
    assert f"CONF={CONFIG_DIR}\n" in script
    # The munge key is installed 0400 munge:munge and never printed.
    assert "put munge.key /etc/munge/munge.key 0400 munge:munge" in script
    assert "set -x" not in script
    assert "cat $CONF/munge.key" not in script and 'cat "$CONF/munge.key"' not in script
    for needed in (
        "trap stop_all TERM INT",
        "/usr/sbin/slurmctld -D",
        '/usr/sbin/slurmd -D -Z -N "$NODE" --conf "$SLURMD_CONF"',
        "/usr/sbin/sshd -D -e",
        "munged --foreground",
        # The lifecycle script runs once per container; its exit code appears whole.
        f"[ ! -e {LIFECYCLE_RC}.started ]",
        f"mv {LIFECYCLE_RC}.tmp {LIFECYCLE_RC}",
        f"echo 143 >{LIFECYCLE_RC}",  # a script a restart cut short reads as failed
        f">{LIFECYCLE_LOG} 2>&1",
        "GPUYARD_ROLE",
        "GPUYARD_NODE_NAME",
        "GPUYARD_GPUS",
        "GPUYARD_CPUS",
        "GPUYARD_MEMORY_MB",
        f"chown slurm:slurm {STATE_DIR}",
    ):
        assert needed in script, needed


@needs_tools("bash", how="apt-get install bash")
def test_entrypoint_script_parses() -> None:
    proc = subprocess.run(
        ["bash", "-n"], input=entrypoint_script(), capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
