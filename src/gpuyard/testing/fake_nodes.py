"""An in-memory stand-in for SlurmNodeRuntime, for fast tests of the training operator.

It records what a real runtime would do (containers with their image, files and
restart counts; networks; volumes) and answers ``sinfo`` with every running worker
idle. ``fail_create`` makes the next creates of the named nodes fail; :meth:`kill`
makes a node die as a container does (exited, or gone); ``unreachable`` makes every
call fail as an engine that does not answer. The real thing is runtimes/slurm/nodes.py,
tested end to end on Podman.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.ownership import Ownership


@dataclass
class FakeNode:
    spec: Any
    files: dict[str, tuple[bytes, int]]
    state: Literal["running", "exited"] = "running"
    restarts: int = 0
    authorized_keys: str = ""
    generation: int = 0
    hosts: dict[str, str] = field(default_factory=dict)


@dataclass
class FakeNodeRuntime:
    nodes: dict[str, FakeNode] = field(default_factory=dict)
    networks: set[str] = field(default_factory=set)
    # Network -> its subnet, and -> this host's part of its overlay (runtimes/slurm/overlay.py).
    subnets: dict[str, str] = field(default_factory=dict)
    overlays: dict[str, Any] = field(default_factory=dict)
    # The node runtimes of the other hosts of a fleet: their workers register with a
    # controller here, so Slurm (sinfo, scontrol) sees them as the real one does.
    slurm_peers: list[FakeNodeRuntime] = field(default_factory=list)
    volumes: set[str] = field(default_factory=set)
    fail_create: set[str] = field(default_factory=set)
    execs: list[tuple[str, list[str]]] = field(default_factory=list)
    # Slurm remembers a drain (and its reason) across the node's replacement, as the
    # real one does.
    drained: dict[str, str] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)
    removed_volumes: list[str] = field(default_factory=list)
    # Lifecycle script exit codes by node name (a node with a script and no entry:
    # 0; None: still running).
    lifecycle_rc: dict[str, int | None] = field(default_factory=dict)
    # While True, every call raises as a runtime whose engine does not answer.
    unreachable: bool = False
    # The images the engine holds (None: every image, as an engine with no image
    # source to copy from is assumed to). With a set, a create naming another image
    # fails, and ensure_image copies it in (recorded in ``copied``).
    images: set[str] | None = None
    copied: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    owner: Ownership | None = None

    def _answer(self) -> None:
        if self.unreachable:
            raise RuntimeFailure("no container engine reachable (injected)")

    def kill(self, name: str, *, remove: bool = False) -> None:
        """The node's container dies (``remove``: and is gone, as after ``rm -f``)."""
        with self._lock:
            if remove:
                del self.nodes[name]
            else:
                self.nodes[name].state = "exited"

    def bind(self, owner: Ownership) -> None:
        self.owner = owner

    def ensure_network(self, name: str, subnet: str | None = None) -> None:
        self._answer()
        self.networks.add(name)
        if subnet is not None:
            self.subnets[name] = subnet

    def attach_overlay(self, spec: Any) -> None:
        self._answer()
        self.overlays[spec.network] = spec

    def detach_overlay(self, network: str) -> None:
        self._answer()
        self.overlays.pop(network, None)

    def set_hosts(self, name: str, entries: Mapping[str, str]) -> None:
        self._answer()
        self._node(name).hosts = dict(entries)

    def remove_network(self, name: str) -> None:
        self._answer()
        self.networks.discard(name)

    def create_node(self, spec: Any, files: dict[str, tuple[bytes, int]]) -> str:
        self._answer()
        with self._lock:
            if spec.name in self.fail_create:
                self.fail_create.discard(spec.name)
                raise RuntimeFailure(f"could not create {spec.name}: injected failure")
            if spec.network not in self.networks:
                raise RuntimeFailure(f"network {spec.network} does not exist")
            if self.images is not None and spec.image not in self.images:
                raise RuntimeFailure(f"no such image: {spec.image}")
            old = self.nodes.get(spec.name)
            self.nodes[spec.name] = FakeNode(
                spec=spec,
                files=dict(files),
                authorized_keys=files.get("authorized_keys", (b"", 0))[0].decode(),
                generation=(old.generation + 1) if old else 0,
            )
            if spec.state_volume:
                self.volumes.add(spec.state_volume)
            self.created.append(spec.name)
            return f"fake-{spec.name}-{self.nodes[spec.name].generation}"

    def ensure_image(self, image: str, progress: Callable[[str], None] | None = None) -> bool:
        self._answer()
        if self.images is None or image in self.images:
            return False
        if progress is not None:
            progress(f"copying image {image} to the host: 0 of 160 MB")
        self.images.add(image)
        self.copied.append(image)
        return True

    def install_authorized_keys(self, name: str, keys_text: str) -> None:
        self._node(name).authorized_keys = keys_text

    def exec(self, name: str, argv: list[str], timeout_s: float = 30) -> tuple[int, str]:
        self._node(name)
        self.execs.append((name, list(argv)))
        if argv[:2] == ["scontrol", "update"]:
            node = argv[2].split("=", 1)[1]
            if "state=drain" in argv:
                reasons = [a.split("=", 1)[1] for a in argv if a.startswith("reason=")]
                self.drained[node] = reasons[0] if reasons else "drained"
            elif "state=resume" in argv:
                self.drained.pop(node, None)
        if argv == ["scontrol", "show", "node", "-o"]:
            return 0, "".join(self._node_line(n) for n in sorted(self._in_slurm()))
        return 0, ""

    def _in_slurm(self) -> dict[str, FakeNode]:
        """The nodes a controller here sees: this host's and its Slurm peers'."""
        seen: dict[str, FakeNode] = {}
        for runtime in [*self.slurm_peers, self]:
            seen.update(runtime.nodes)
        return seen

    def _node_line(self, name: str) -> str:
        """One worker as ``scontrol show node -o`` prints it (the fields the operator
        reads); SlurmdStartTime changes with every start of the node."""
        node = self._in_slurm()[name]
        if node.spec.role != "worker" or node.state != "running":
            return ""
        state = "IDLE+DRAIN" if name in self.drained else "IDLE"
        reason = f" Reason={self.drained[name]} [root@now]" if name in self.drained else ""
        started = f"{node.generation}.{node.restarts}"
        return f"NodeName={name} State={state} SlurmdStartTime={started}{reason}\n"

    def lifecycle_result(self, name: str) -> int | None:
        node = self._node(name)
        if node.state != "running":
            raise RuntimeFailure(f"node {name} is not running")
        if "lifecycle.sh" not in node.files:
            return None
        return self.lifecycle_rc.get(name, 0)

    def restart_node(self, name: str) -> None:
        node = self._node(name)
        node.restarts += 1
        node.state = "running"

    def remove_node(self, name: str) -> None:
        self._answer()
        with self._lock:
            self.nodes.pop(name, None)

    def node_state(self, name: str) -> Literal["missing", "created", "running", "exited"]:
        self._answer()
        node = self.nodes.get(name)
        return "missing" if node is None else node.state

    def node_address(self, name: str, network: str) -> str | None:
        self._answer()
        node = self.nodes.get(name)
        if node is None or node.state != "running":
            return None
        return f"10.99.0.{sorted(self.nodes).index(name) + 2}"

    def list_nodes(self, label: str, value: str) -> list[str]:
        self._answer()
        return [n for n, node in self.nodes.items() if node.spec.labels.get(label) == value]

    def wait_slurm_ready(
        self, controller: str, expected_nodes: list[str], timeout_s: float
    ) -> None:
        self._answer()
        seen = self._in_slurm()
        missing = [
            n for n in [controller, *expected_nodes] if n not in seen or seen[n].state != "running"
        ]
        if missing:
            raise RuntimeFailure(f"nodes not up in Slurm: {', '.join(missing)}")

    def sinfo(self, controller: str) -> list[tuple[str, str]]:
        self._node(controller)
        return [
            (name, "drained" if name in self.drained else "idle")
            for name, node in sorted(self._in_slurm().items())
            if node.spec.role == "worker" and node.state == "running"
        ]

    def remove_volume(self, name: str) -> None:
        self._answer()
        self.removed_volumes.append(name)
        self.volumes.discard(name)

    def _node(self, name: str) -> FakeNode:
        self._answer()
        node = self.nodes.get(name)
        if node is None:
            raise RuntimeFailure(f"node {name} does not exist")
        return node
