"""A simulated host on this machine: its own network namespace and address (a veth pair
made here), and its own Podman service with its own storage, reached over TCP on that
address, so what gpuyard sends it crosses the veth like traffic to a remote host
(shared/notes/test-hosts-on-one-machine.md). Root only.

With ``ssh_key`` (an OpenSSH public key line) the host is reached as a real remote server
is: its Podman listens on a unix socket only and an sshd in the namespace lets that key
in as root; :attr:`PodmanHost.ssh_url` is the engine URL gpuyard is given.

Used by the e2e tests that need a second host and bench/bench_volume_move.py. Everything
it makes is named ``gyvc<n>`` and removed by :meth:`PodmanHost.close`; addresses are
inside the /30 it made (10.231.<n>.0/30, n from 200 up, a range the fleet scripts leave
alone). Test processes run side by side (scripts/run-tests.sh): ``n`` is claimed
atomically by making the namespace, and ``close`` removes only what this object made.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import docker

from gpuyard.runtimes.engines.url import ping_unix_socket, terminate_process

PORT = 2375
CONF = """[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
tmp_dir = "{run}/libpod"
[network]
network_config_dir = "{lib}/networks"
"""


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


def available() -> str | None:
    """Why simulated hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "nsenter", "unshare", "podman", "ssh", "ssh-keygen", "/usr/sbin/sshd"):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    return None


# How to get what available() asks for (tests/required_parts.py names it in a skip or failure).
HOSTS_HOW = "run the tests as root after WITH_TEST_HOSTS=1 bash scripts/setup-system.sh"


SSHD_CONFIG = """Port 22
ListenAddress {address}
HostKey {run}/ssh_host_ed25519_key
PidFile {run}/sshd.pid
AuthorizedKeysFile {run}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowStreamLocalForwarding yes
StreamLocalBindUnlink yes
"""


class PodmanHost:
    """One simulated host; :meth:`start` returns its engine URL (``tcp://ADDR:2375``, or
    with ``ssh_key`` the ``ssh://`` one)."""

    def __init__(self, ssh_key: str | None = None) -> None:
        self.ssh_key = ssh_key
        self._sshd: subprocess.Popen[bytes] | None = None
        # The index (name, address) is claimed by :meth:`start`: other test processes
        # make simulated hosts at the same time, so a name is only ours once ``ip netns
        # add`` made it; until then there is nothing of ours to remove.
        self.index = 0
        self.name = "gyvc"
        self.netns = ""
        self.address = ""
        self._claimed = False
        self._veth = False
        self.lib = Path(tempfile.mkdtemp(prefix="gyvc-", dir="/var/lib"))
        self.run = Path(tempfile.mkdtemp(prefix="gyvc-", dir="/run"))
        self._proc: subprocess.Popen[bytes] | None = None

    def _claim(self) -> None:
        """Take the first free index: its namespace is made here, which fails for a name
        that exists (``ip netns add`` creates its file exclusively), so two processes
        asking at once never get the same one. An index whose veth is left over from a
        killed run is skipped (it is not ours to remove)."""
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        for index in range(200, 250):
            name = f"gyvc{index}"
            if f" {name}-" in links:  # its veth ends, "-o" and "-i"
                continue
            made = subprocess.run(["ip", "netns", "add", name], capture_output=True, timeout=30)
            if made.returncode == 0:
                self.index, self.name, self._claimed = index, name, True
                self.netns = f"/run/netns/{name}"
                self.address = f"10.231.{index}.2"
                return
        raise RuntimeError("no free simulated-host index (gyvc200-gyvc249 all taken)")

    @property
    def url(self) -> str:
        return f"tcp://{self.address}:{PORT}"

    @property
    def socket(self) -> Path:
        """The engine's unix socket (SSH hosts)."""
        return self.run / "podman.sock"

    @property
    def ssh_url(self) -> str:
        """The engine URL over SSH: the socket forwarded by the host's sshd."""
        return f"ssh://root@{self.address}{self.socket}"

    @property
    def listen(self) -> str:
        return f"unix://{self.socket}" if self.ssh_key else self.url

    def nsenter(self) -> list[str]:
        """The command prefix that runs a program in this host's network namespace."""
        return ["nsenter", f"--net={self.netns}"]

    def start(self, timeout_s: float = 30.0) -> str:
        # The host's uplink is "eth0" inside its namespace, as on a real server: a name
        # starting with "gy" would pass for one of gpuyard's container bridges.
        self._claim()
        net, outer, inner = f"10.231.{self.index}", f"{self.name}-o", "eth0"
        _run("ip", "link", "add", outer, "type", "veth", "peer", "name", f"{self.name}-i")
        self._veth = True
        _run("ip", "link", "set", f"{self.name}-i", "netns", self.name)
        _run(*self.nsenter(), "ip", "link", "set", f"{self.name}-i", "name", inner)
        _run("ip", "addr", "add", f"{net}.1/30", "dev", outer)
        _run("ip", "link", "set", outer, "up")
        _run(*self.nsenter(), "sh", "-c",
             f"ip addr add {net}.2/30 dev {inner} && ip link set {inner} up && "
             f"ip link set lo up && ip route add default via {net}.1")  # fmt: skip
        conf = self.run / "containers.conf"
        conf.write_text(CONF.format(run=self.run, lib=self.lib))
        # unshare -m and a private /dev/shm keep this Podman's locks apart from the
        # machine's; nsenter --net (not `ip netns exec`) keeps the cgroup v1 mounts.
        script = (
            # A private /run/netns too: the namespaces of this host's containers must
            # not outlive it in the machine's /run/netns.
            "mount -t tmpfs tmpfs /dev/shm && mount -t tmpfs tmpfs /run/netns && exec podman "
            f"--root {self.lib}/storage --runroot {self.run}/runroot "
            f"system service --time=0 {self.listen}"
        )
        with open(self.run / "service.log", "ab") as log:
            self._proc = subprocess.Popen(
                [*self.nsenter(), "unshare", "-m", "--propagation", "private", "sh", "-c", script],
                env={**os.environ, "CONTAINERS_CONF": str(conf)},
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"podman on {self.name} exited: {self.log()}")
            if self.ssh_key:
                if ping_unix_socket(str(self.socket)):
                    self._start_sshd()
                    return self.ssh_url
            else:
                probe = subprocess.run(
                    ["sh", "-c", f"exec 3<>/dev/tcp/{self.address}/{PORT}"],
                    capture_output=True,
                    executable="/bin/bash",
                )
                if probe.returncode == 0:
                    return self.url
            time.sleep(0.1)
        raise RuntimeError(f"podman on {self.name} did not answer: {self.log()}")

    def _start_sshd(self) -> None:
        assert self.ssh_key is not None
        key = self.run / "ssh_host_ed25519_key"
        if not key.exists():
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        (self.run / "authorized_keys").write_text(self.ssh_key.strip() + "\n")
        config = self.run / "sshd_config"
        config.write_text(SSHD_CONFIG.format(address=self.address, run=self.run))
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation dir
        with open(self.run / "sshd.log", "ab") as log:
            self._sshd = subprocess.Popen(
                [*self.nsenter(), "/usr/sbin/sshd", "-D", "-e", "-f", str(config)],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            probe = subprocess.run(
                ["sh", "-c", f"exec 3<>/dev/tcp/{self.address}/22"],
                capture_output=True,
                executable="/bin/bash",
            )
            if probe.returncode == 0:
                return
            time.sleep(0.05)
        raise RuntimeError(f"sshd on {self.name} did not start")

    def load_image(self, from_engine: str, image: str) -> None:
        """Copy ``image`` from the engine at ``from_engine`` into this host's engine
        (save there, load here: no registry)."""
        source = docker.DockerClient(base_url=from_engine)
        target = docker.DockerClient(base_url=f"unix://{self.socket}" if self.ssh_key else self.url)
        try:
            data = b"".join(source.images.get(image).save(named=True))
            target.images.load(data)
        finally:
            source.close()
            target.close()

    # -- faults ------------------------------------------------------------------
    def down(self) -> None:
        """Cut the host off: its link goes down (a real partition)."""
        _run("ip", "link", "set", f"{self.name}-o", "down")

    def up(self) -> None:
        _run("ip", "link", "set", f"{self.name}-o", "up")

    def drop(self) -> None:
        """Drop every packet on the host's link, silently (no reset, no ICMP): a
        partition the far end does not hear about. Rules in the host's own namespace."""
        for chain in ("INPUT", "OUTPUT"):
            where = "-i" if chain == "INPUT" else "-o"
            _run(*self.nsenter(), "iptables", "-I", chain, where, "eth0", "-j", "DROP")

    def undrop(self) -> None:
        for chain in ("INPUT", "OUTPUT"):
            where = "-i" if chain == "INPUT" else "-o"
            _run(*self.nsenter(), "iptables", "-D", chain, where, "eth0", "-j", "DROP")

    def freeze(self) -> None:
        """Freeze the host's engine (SIGSTOP): its socket still accepts connections, as
        a hung engine's does, but nothing answers."""
        assert self._proc is not None
        os.killpg(self._proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self._proc is not None
        os.killpg(self._proc.pid, signal.SIGCONT)

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.run / "service.log").read_text(errors="replace")[-2000:]
        return ""

    def volume_dir(self, volume: str) -> Path:
        """Where ``volume``'s files lie on this machine (its storage is a plain dir)."""
        return self.lib / "storage" / "volumes" / volume / "_data"

    def close(self) -> None:
        """Stop the service and remove the namespace, the veth and the storage. Its
        containers die with it: the storage and the namespace are this host's alone."""
        if self._sshd is not None:
            terminate_process(self._sshd, 5)
            self._sshd = None
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGCONT)  # a test may have frozen it
            # Containers outlive the engine's service (conmon): remove them through it.
            with contextlib.suppress(Exception):
                client = docker.DockerClient(
                    base_url=f"unix://{self.socket}" if self.ssh_key else self.url, timeout=30
                )
                try:
                    for container in client.containers.list(all=True):
                        container.remove(force=True)
                finally:
                    client.close()
        if self._proc is not None:
            terminate_process(self._proc, 10)
            self._proc = None
        # Only what this object made: a name it did not claim may be another process's.
        if self._claimed:
            with contextlib.suppress(subprocess.CalledProcessError):
                _run("ip", "netns", "del", self.name)
            self._claimed = False
        if self._veth:
            with contextlib.suppress(subprocess.CalledProcessError):
                _run("ip", "link", "del", f"{self.name}-o")
            self._veth = False
        # Overlay mounts lived in the service's private mount namespace, gone with it.
        shutil.rmtree(self.lib, ignore_errors=True)
        shutil.rmtree(self.run, ignore_errors=True)

    def __enter__(self) -> PodmanHost:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main() -> None:
    """Try a fleet on one machine: ``sudo .venv/bin/python -m tests.e2e.podman_host
    --hosts 3 --ssh-key "$(gpuyard hosts key)"`` starts that many simulated hosts reached
    over SSH, prints the ``gpuyard hosts add`` line of each, and removes them all on
    Ctrl-C."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--ssh-key", required=True, help="the installation's public key")
    parser.add_argument("--image", action="append", default=[], help="copy IMAGE in")
    parser.add_argument("--from-engine", default="unix:///run/podman/podman.sock")
    args = parser.parse_args()
    problem = available()
    if problem:
        raise SystemExit(f"cannot make simulated hosts here: {problem}")
    hosts: list[PodmanHost] = []
    try:
        for i in range(args.hosts):
            host = PodmanHost(ssh_key=args.ssh_key)
            hosts.append(host)
            host.start()
            for image in args.image:
                host.load_image(args.from_engine, image)
            print(
                f"gpuyard hosts add sim-{i} --engine {host.ssh_url} "
                f'--gpus "NVIDIA RTX A6000:4" --vcpus 16 --memory-gb 64',
                flush=True,
            )
        print("simulated hosts running; Ctrl-C removes them", flush=True)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        for host in hosts:
            host.close()


if __name__ == "__main__":
    main()
