"""Credentials for Label Studio, and keeping them out of logs, Parquet and lineage.

Where a key comes from, in order:

1. the environment: ``LABEL_STUDIO_URL`` and ``LABEL_STUDIO_API_KEY`` (a user's own server);
2. the local data folder: ``$STEPWISE_HOME/labelstudio/stepwise-credentials.json`` (mode 0600),
   written by :mod:`annotation.labelstudio.server` for the project's own server.

Nothing else stores a key: resources take no key in their config (Dagster would record run
config), lineage records the server as ``local`` or ``host:port``, and every message this package
raises or logs goes through :func:`scrub`, which blanks registered secrets and anything shaped
like a JWT or a long hex token.
"""

from __future__ import annotations

import json
import os
import re
import secrets as _random
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from warehouse.storage import write_atomic

URL_ENV = "LABEL_STUDIO_URL"
API_KEY_ENV = "LABEL_STUDIO_API_KEY"
CREDENTIALS_FILE = "stepwise-credentials.json"

_registered: set[str] = set()
_registered_lock = threading.Lock()
# JWTs (three base64url parts), and bare 40-char hex tokens (Label Studio's legacy tokens).
_TOKEN_SHAPES = re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}|\b[0-9a-f]{40}\b")


def register_secret(value: str | None) -> None:
    """Remember a secret so :func:`scrub` blanks it wherever it appears."""
    if value and len(value) >= 6:
        with _registered_lock:
            _registered.add(value)


def scrub(text: object) -> str:
    """``text`` with every registered secret and token-shaped string replaced by ``***``."""
    result = str(text)
    with _registered_lock:
        known = sorted(_registered, key=len, reverse=True)
    for secret in known:
        result = result.replace(secret, "***")
    return _TOKEN_SHAPES.sub("***", result)


@dataclass(frozen=True)
class Credentials:
    """Where Label Studio is and the key to use. ``repr`` never shows the key."""

    url: str
    api_key: str = field(repr=False)
    source: str  # "environment" | "local data folder"
    username: str | None = None

    def __post_init__(self) -> None:
        register_secret(self.api_key)

    @property
    def server_key(self) -> str:
        """A credential-free name for the server, used in tables and lineage."""
        return "local" if self.source == "local data folder" else server_key_for_url(self.url)


def server_key_for_url(url: str) -> str:
    """``host:port`` of a URL (no user info, path or query)."""
    parts = urlsplit(url)
    host = parts.hostname or "unknown"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{host}:{port}"


def credentials_from_environment(environ: dict[str, str] | None = None) -> Credentials | None:
    """The user's own server, when both ``LABEL_STUDIO_URL`` and ``LABEL_STUDIO_API_KEY`` are set."""
    env = os.environ if environ is None else environ
    url = (env.get(URL_ENV) or "").strip()
    key = (env.get(API_KEY_ENV) or "").strip()
    if url and key:
        return Credentials(url=url.rstrip("/"), api_key=key, source="environment")
    return None


@dataclass
class LocalSecrets:
    """What the project keeps for its own server: admin login and personal access token."""

    username: str
    password: str = field(repr=False)
    api_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        register_secret(self.password)
        register_secret(self.api_key)


def read_local_secrets(folder: Path) -> LocalSecrets | None:
    """The secrets file in ``folder``, or None if there is none."""
    path = folder / CREDENTIALS_FILE
    try:
        payload = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return LocalSecrets(
        username=payload["username"],
        password=payload["password"],
        api_key=payload.get("api_key"),
    )


def write_local_secrets(folder: Path, local: LocalSecrets) -> Path:
    """Write the secrets file atomically with mode 0600 (readable by its owner only)."""
    path = folder / CREDENTIALS_FILE
    payload = {"username": local.username, "password": local.password, "api_key": local.api_key}
    write_atomic(path, json.dumps(payload, indent=2), mode=0o600)
    os.chmod(path, 0o600)
    return path


def annotator_salt(folder: Path) -> str:
    """The local secret that pseudonymises annotators (created on first use, kept in the data folder).

    The same salt serves any server (the project's own or a user's), so an annotator keeps one
    pseudonymous id across syncs and restarts. Losing it only changes future pseudonyms.
    """
    salt_file = folder / "stepwise-annotator-salt"
    try:
        salt = salt_file.read_text().strip()
    except FileNotFoundError:
        salt = ""
    if not salt:
        folder.mkdir(parents=True, exist_ok=True)
        salt = _random.token_hex(16)
        fd = os.open(salt_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(salt)
    register_secret(salt)
    return salt
