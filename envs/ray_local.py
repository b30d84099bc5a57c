"""A real multi-node Ray cluster on this machine, on loopback: for tests, benchmarks and trying the
Ray backend without a second machine.

Each node is its own ``ray start`` (own raylet, object store and worker processes) bound to its own
loopback address (127.0.0.2 for the head, 127.0.0.3, ... for the others: Ray rewrites 127.0.0.1 to
the interface address but keeps the others), under one temporary folder of this cluster's own.
``stop`` kills this cluster's processes only, never a machine-wide ``ray stop``.

Ray's processes detach from the one that started them, so a test process killed before its
``stop`` (a pytest worker that crashed, a CI job cut off) leaves its cluster running. Each cluster
records its owner in its folder (:data:`envs.scratch.OWNER_FILE`); ``start`` first stops every cluster of this
kind whose owner is gone (:func:`reap_orphaned_clusters`).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.scratch import reap_abandoned, write_owner

#: Where clusters' folders are made (a short path: Ray's unix sockets live under it, 108-byte limit).
CLUSTERS_DIR = Path("/tmp")


def reap_orphaned_clusters(clusters_dir: Path = CLUSTERS_DIR) -> list[Path]:
    """Stop every local cluster under ``clusters_dir`` that this user started and whose owner
    process is gone (or is another process under a reused pid), and remove its folder
    (:func:`envs.scratch.reap_abandoned`); the folders reaped. The head's address marks the
    cluster's processes only while some process still names the folder: a dead cluster's port may
    since belong to a live one."""

    def stop(folder: Path, owner: dict) -> None:
        orphan = LocalRayCluster(temp_dir=folder)
        if orphan.processes():
            orphan.address = str(owner.get("address", ""))
        orphan.stop()  # reap_abandoned logs the folders it removed

    return reap_abandoned("ray-*", clusters_dir, stop=stop)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _ray_command() -> str:
    ray = Path(sys.executable).with_name("ray")
    if not ray.exists():
        raise RuntimeError(f"Ray is not installed next to {sys.executable} (pip install ray)")
    return str(ray)


@dataclass
class LocalRayCluster:
    """``nodes`` Ray nodes on 127.0.0.2, 127.0.0.3, ... with ``cpus[i]`` CPUs each."""

    cpus: tuple[float, ...] = (1, 1)
    env: dict[str, str] = field(default_factory=dict)
    temp_dir: Path | None = None
    address: str = ""
    node_ips: list[str] = field(default_factory=list)

    def start(self, timeout_s: float = 120.0) -> LocalRayCluster:
        """Start the head, then each worker node; returns when every node is up. Clusters left by
        owners that died first are stopped (:func:`reap_orphaned_clusters`)."""
        reap_orphaned_clusters()
        self.temp_dir = Path(tempfile.mkdtemp(prefix="ray-", dir=CLUSTERS_DIR))
        head = "127.0.0.2"
        port = _free_port(head)
        self.address = f"{head}:{port}"
        write_owner(self.temp_dir, address=self.address)
        common = ["--temp-dir", str(self.temp_dir), "--disable-usage-stats"]
        env = os.environ | {"RAY_USAGE_STATS_ENABLED": "0"} | self.env
        try:
            self._start_nodes(port, common, env, timeout_s)
        except BaseException:
            self.stop()  # a head that started must not outlive a failed start
            raise
        return self

    def _start_nodes(self, port: int, common: list[str], env: dict[str, str], timeout_s: float) -> None:
        head = "127.0.0.2"
        for index, cpus in enumerate(self.cpus):
            ip = f"127.0.0.{2 + index}"
            role = (
                ["--head", "--port", str(port), "--include-dashboard=false"]
                + ["--ray-client-server-port", str(_free_port(head))]
                if index == 0
                else ["--address", self.address]
            )
            done = subprocess.run(
                [_ray_command(), "start", *role, "--node-ip-address", ip, "--num-cpus", str(cpus), *common],
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                raise RuntimeError(f"ray start of node {ip} failed: {' / '.join(tail)}")
            self.node_ips.append(ip)

    def processes(self) -> list[Any]:
        """Every process of this cluster (found by its temp folder or its head's address, plus what
        they started)."""
        import psutil

        # Most of Ray's processes name the temp folder; its client server names only the head's
        # address (and outlives `ray start`, which detaches it).
        marks = [str(self.temp_dir)] if self.temp_dir is not None else []
        marks += [f"--address={self.address}"] if self.address else []
        roots = []
        for process in psutil.process_iter(["cmdline"]):
            cmdline = " ".join(process.info["cmdline"] or [])
            if any(mark in cmdline for mark in marks):
                roots.append(process)
        found = {p.pid: p for p in roots}
        for root in roots:
            try:
                found.update({c.pid: c for c in root.children(recursive=True)})
            except psutil.Error:
                pass
        return list(found.values())

    def raylet(self, node_ip: str) -> Any:
        """The raylet process of the node at ``node_ip``."""
        for process in self.processes():
            try:
                if process.name() == "raylet" and f"--node_ip_address={node_ip}" in " ".join(process.cmdline()):
                    return process
            except Exception:  # noqa: BLE001, S112 - a process that just ended is not the one
                continue
        raise LookupError(f"no raylet for node {node_ip}")

    def kill_node(self, node_ip: str, *, ray_processes_only: bool = False) -> list[int]:
        """Kill a node as a lost machine would go: its raylet and every process under it, at once.
        ``ray_processes_only``: the raylet and Ray's worker processes (the actors) only, as when Ray
        itself fails on a machine that stays up; what the actors started must then end by itself."""
        raylet = self.raylet(node_ip)
        victims = [raylet, *raylet.children(recursive=not ray_processes_only)]
        for process in victims:
            try:
                process.kill()
            except Exception:  # noqa: BLE001, S110 - already gone
                pass
        return [p.pid for p in victims]

    def stop(self) -> None:
        """Kill this cluster's processes (not other Ray clusters on the machine) and remove its folder."""
        import psutil

        for _ in range(3):
            processes = self.processes()
            if not processes:
                break
            for process in processes:
                try:
                    process.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(processes, timeout=5)
            time.sleep(0.2)
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> LocalRayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
