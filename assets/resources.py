"""Dagster resources: the outside systems assets use, each wrapped thinly.

* ``warehouse``: the DuckDB catalog and Parquet store under one home folder.
* ``env_pool``: where environments run (the worker pool's reserve and timeouts, Chromium,
  Android devices).
* ``label_studio``: a Label Studio server through the SDK 2.x client.

Assets own their resources (``pipelines/`` only registers them), so nothing below ``assets/``
knows Dagster.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from dagster import ConfigurableResource, Failure
from pydantic import Field

from annotation.labelstudio.client import LabelStudioClient
from annotation.labelstudio.connection import LabelStudioSite, pseudonym_salt, resolve_credentials
from annotation.labelstudio.secrets import API_KEY_ENV, URL_ENV, Credentials, credentials_from_environment
from annotation.labelstudio.server import labelstudio_dir
from envs.android.env import AndroidConfig
from envs.miniwob.live import MiniWoBConfig
from envs.pool import EnvPool
from envs.pool_jobs import PoolConfig
from envs.ray_pool import make_pool
from warehouse.catalog import Warehouse
from warehouse.storage import stepwise_home


class WarehouseResource(ConfigurableResource):
    """The DuckDB catalog and Parquet store under ``home`` (default: $STEPWISE_HOME or ./.stepwise)."""

    home: str | None = None

    def get(self) -> Warehouse:
        return Warehouse(self.home)


class EnvPoolResource(ConfigurableResource):
    """Where environments run: the worker pool's reserve and timeouts, Chromium, Android devices."""

    spares: int = Field(default=1, description="ready workers kept in reserve (GUI-Shepherd kept half its emulators)")
    step_timeout_s: float = Field(default=10.0, description="a step that takes longer gets its worker killed")
    reset_timeout_s: float = Field(default=30.0, description="same, for starting an episode")
    max_attempts: int = Field(default=3, description="tries per episode on fresh workers, the first included")
    chromium_binary: str = Field(default=MiniWoBConfig.chromium_binary, description="Chromium for MiniWoB++")
    chromedriver: str = Field(default=MiniWoBConfig.chromedriver, description="its chromedriver")
    android_devices: list[str] = Field(
        default=[], description="adb serials or IP:port of Android emulators/devices, one worker each"
    )
    android_settle_s: float = Field(default=0.6, description="wait after an Android action before reading the screen")
    backend: str = Field(
        default="local",
        description="local: worker processes on this machine | ray: worker actors on the Ray cluster at ray_address",
    )
    ray_address: str | None = Field(
        default=None, description="the Ray head's host:port (its `ray start --head --port`), with backend ray"
    )
    ray_cpus_per_worker: float = Field(default=1.0, description="CPUs a worker actor reserves on its Ray node")

    def pool_config(self, workers: int) -> PoolConfig:
        try:
            return PoolConfig(
                workers=workers,
                spares=self.spares,
                step_timeout_s=self.step_timeout_s,
                reset_timeout_s=self.reset_timeout_s,
                max_attempts=self.max_attempts,
                backend=self.backend,
                ray_address=self.ray_address,
                ray_cpus_per_worker=self.ray_cpus_per_worker,
            )
        except ValueError as exc:
            raise Failure(f"resources.env_pool.config: {exc}") from None

    def settings(self) -> dict[str, float | int | str]:
        """The pool settings recorded with every batch (the backend too: where the episodes ran)."""
        recorded: dict[str, float | int | str] = {
            "step_timeout_s": self.step_timeout_s,
            "max_attempts": self.max_attempts,
        }
        if self.backend != "local":
            recorded |= {"pool_backend": self.backend, "ray_address": self.ray_address or ""}
        return recorded

    def pool(
        self,
        backend: str,
        workers: int,
        log: Callable[[str], None] | None = None,
        *,
        episode_max_time_ms: int | None = None,
    ) -> EnvPool:
        """A pool of ``workers`` environments of ``backend`` (miniwob | android); MiniWoB++'s episode
        clock set to ``episode_max_time_ms`` when given (slow policies: an LLM on a CPU)."""
        if backend == "miniwob":
            return self.miniwob_pool(workers, log=log, episode_max_time_ms=episode_max_time_ms)
        if backend == "android":
            return self.android_pool(workers, log=log)
        raise Failure(f"unknown environment backend {backend!r} (miniwob | android)")

    def miniwob_pool(self, workers: int, log=None, episode_max_time_ms: int | None = None) -> EnvPool:
        config = MiniWoBConfig(
            chromium_binary=self.chromium_binary,
            chromedriver=self.chromedriver,
            episode_max_time_ms=episode_max_time_ms,
        )
        return make_pool(config, self.pool_config(workers), log=log)

    def android_pool(self, workers: int, log=None) -> EnvPool:
        if not self.android_devices:
            raise Failure(
                "no Android devices configured: set resources.env_pool.config.android_devices to adb serials "
                "or IP:port addresses of emulators/devices (one worker per device; extra ones are spares)"
            )
        configs = [AndroidConfig(serial=d, settle_s=self.android_settle_s) for d in self.android_devices]
        return make_pool(configs, self.pool_config(min(workers, len(configs))), log=log)


RAY_FAMILIES_HELP = (
    "a Ray head's host:port: a run that brings several families up to date runs each as a Ray task (the "
    "cluster's nodes must share this home's file system); none: one after another here"
)


def ray_family_map(address: str | None):
    """Label families as tasks on the Ray cluster at ``address`` (``None``: one after another here),
    as ``run_label_partitions`` takes them. The cluster is checked now, before anything is labelled
    (a family without a stored library would otherwise be labelled and published first)."""
    if not address:
        return None
    from envs.ray_pool import connect, map_on_cluster

    try:
        connect(address)
    except Exception as exc:  # noqa: BLE001 - PoolError, one line naming the address
        raise Failure(f"label families on the Ray cluster at {address}: {exc}") from None

    def run(update_family, families):
        try:
            return map_on_cluster(address, update_family, families)
        except Exception as exc:  # noqa: BLE001 - Ray wraps the family's own error; the user needs both
            raise Failure(f"label families on the Ray cluster at {address}: {exc}") from None

    return run


class LabelStudioResource(ConfigurableResource):
    """Label Studio through the SDK 2.x client.

    The user's own server when ``LABEL_STUDIO_URL`` and ``LABEL_STUDIO_API_KEY`` are set (or
    ``url`` here plus the key in the environment variable named by ``api_key_env``); otherwise
    the project's own server under ``$STEPWISE_HOME/labelstudio``, started on demand when
    ``autostart``. The key is never part of this config (Dagster records run config).
    """

    home: str | None = Field(default=None, description="STEPWISE_HOME (default: $STEPWISE_HOME or ./.stepwise)")
    url: str | None = Field(
        default=None, description="a Label Studio URL; default $LABEL_STUDIO_URL, else the project's own server"
    )
    api_key_env: str = Field(
        default=API_KEY_ENV, description="the environment variable holding the API key (never the key itself)"
    )
    autostart: bool = Field(default=True, description="start the project's own server when it is not running")
    port: int | None = Field(default=None, description="preferred port of the project's own server (default 8080)")
    project_namespace: str = Field(default="Stepwise", description="prefix of the Label Studio project titles")
    timeout_s: float = 60.0

    def stepwise_home(self) -> Path:
        return Path(self.home).resolve() if self.home else stepwise_home()

    def data_dir(self) -> Path:
        return labelstudio_dir(self.stepwise_home())

    def credentials(self, *, start: bool | None = None, progress: Callable[[str], None] | None = None) -> Credentials:
        environ = dict(os.environ)
        if self.url and environ.get(self.api_key_env):
            environ[URL_ENV], environ[API_KEY_ENV] = self.url, environ[self.api_key_env]
        elif self.api_key_env != API_KEY_ENV and environ.get(self.api_key_env):
            environ[API_KEY_ENV] = environ[self.api_key_env]
        return resolve_credentials(
            self.stepwise_home(),
            start_local=self.autostart if start is None else start,
            port=self.port,
            progress=progress,
            environ=environ,
        )

    def client(self, *, start: bool | None = None, progress: Callable[[str], None] | None = None) -> LabelStudioClient:
        return LabelStudioClient(self.credentials(start=start, progress=progress), timeout_s=self.timeout_s)

    def salt(self) -> str:
        return pseudonym_salt(self.stepwise_home())

    def site(self, *, start: bool | None = None, progress: Callable[[str], None] | None = None) -> LabelStudioSite:
        """This server as the plain settings the human-labels stage works with."""
        return LabelStudioSite(
            connect=lambda: self.client(start=start, progress=progress),
            namespace=self.project_namespace,
            home=self.stepwise_home(),
            own_server=self.uses_local_server(),
            api_key_env=self.api_key_env,
        )

    def uses_local_server(self) -> bool:
        return credentials_from_environment() is None and not (self.url and os.environ.get(self.api_key_env))


RESOURCES = {"warehouse": WarehouseResource(), "env_pool": EnvPoolResource(), "label_studio": LabelStudioResource()}
