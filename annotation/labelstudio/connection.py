"""Which Label Studio to talk to: the user's own (environment) or the project's own (local data folder)."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from annotation.labelstudio.client import LabelStudioClient, LabelStudioUnavailable
from annotation.labelstudio.secrets import (
    API_KEY_ENV,
    Credentials,
    annotator_salt,
    credentials_from_environment,
)
from annotation.labelstudio.server import LocalLabelStudio, labelstudio_dir


def resolve_credentials(
    home: Path | str,
    *,
    start_local: bool,
    port: int | None = None,
    progress: Callable[[str], None] | None = None,
    environ: dict[str, str] | None = None,
) -> Credentials:
    """``LABEL_STUDIO_URL`` + ``LABEL_STUDIO_API_KEY`` when both are set; else the project's own server.

    With ``start_local`` the project's server is started if it is not running (the first start
    takes about a minute); without, a stopped server raises :class:`LabelStudioUnavailable`.
    """
    from_env = credentials_from_environment(environ)
    if from_env is not None:
        return from_env
    server = LocalLabelStudio(home, port=port)
    if not start_local and not server.status().running:
        raise LabelStudioUnavailable(
            f"the project's Label Studio server is not running (data in {server.data_dir}); "
            f"start it with `make annotate`, or set LABEL_STUDIO_URL and {API_KEY_ENV} to use your own"
        )
    return server.credentials(progress)


def connect(
    home: Path | str,
    *,
    start_local: bool = True,
    port: int | None = None,
    timeout_s: float = 60.0,
    progress: Callable[[str], None] | None = None,
) -> LabelStudioClient:
    """A client for the Label Studio this project uses (see :func:`resolve_credentials`)."""
    return LabelStudioClient(
        resolve_credentials(home, start_local=start_local, port=port, progress=progress), timeout_s=timeout_s
    )


def pseudonym_salt(home: Path | str) -> str:
    """The secret that turns Label Studio user ids into pseudonymous annotator ids (kept in the data folder)."""
    return annotator_salt(labelstudio_dir(Path(home)))


@dataclass(frozen=True)
class LabelStudioSite:
    """The stage's Label Studio as plain values: how to connect, the project titles' prefix, the home
    (the project's own server keeps its data under it and serves screenshots from it)."""

    connect: Callable[[], LabelStudioClient]
    namespace: str
    home: Path
    own_server: bool
    api_key_env: str = API_KEY_ENV

    @property
    def data_dir(self) -> Path:
        return labelstudio_dir(self.home)

    @property
    def lock_path(self) -> Path:
        """One sync at a time (sensor and asset), across processes."""
        return self.data_dir / ".stepwise-sync.lock"

    def login_hint(self) -> str:
        if self.own_server:
            return (
                f'admin@stepwise.local (password: field "password" of {self.data_dir / "stepwise-credentials.json"}; '
                f"print it with python -m annotation.labelstudio password --home {shlex.quote(str(self.home))})"
            )
        return "your own Label Studio account"
