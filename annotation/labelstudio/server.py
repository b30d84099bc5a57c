"""The project's own Label Studio server: start, stop, status, and its admin credentials.

On embedded defaults (no ``LABEL_STUDIO_URL`` / ``LABEL_STUDIO_API_KEY`` in the environment) the
project runs Label Studio from PyPI itself:

* bound to 127.0.0.1 only (``--internal-host``; ``--host`` is not the bind address);
* data under ``$STEPWISE_HOME/labelstudio`` (SQLite database, media, exports, its ``.env`` with
  the Django secret key), plus two files of ours there: ``stepwise-server.json`` (pid, port) and
  ``stepwise-credentials.json`` (mode 0600: admin e-mail and password, personal access token)
  and ``stepwise-annotator-salt`` (the secret behind pseudonymous annotator ids);
* an admin account created on first start (random password), and a personal access token (a JWT
  refresh token) created through the server's own API after logging in, because the legacy
  ``LABEL_STUDIO_USER_TOKEN`` is refused unless the data was created with legacy tokens enabled;
* started detached (its own session), so it outlives the command that started it; ``stop``
  ends exactly that process (by the pid it recorded).

Label Studio silently moves to the next port when the one asked for is busy: the port it really
took is read from its log. The first start of a data folder would run ~400 Django migrations
(~35 s, over a minute on a busy machine); instead a migrated, empty database (schema only: no
user, no secret) is built once per Label Studio version in a cache folder
(``$STEPWISE_LS_SCHEMA_CACHE``, default ``~/.cache/stepwise``) and copied into each new data
folder, so a fresh home starts in ~10-15 s. Set ``STEPWISE_LS_SCHEMA_CACHE=off`` to disable it.

Run ``python -m annotation.labelstudio {start,stop,status,url,password}``.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.metadata
import json
import os
import re
import secrets as _random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from annotation.labelstudio.secrets import (
    CREDENTIALS_FILE,
    Credentials,
    LocalSecrets,
    read_local_secrets,
    scrub,
    write_local_secrets,
)
from warehouse.storage import atomic_path, write_atomic

DEFAULT_PORT = 8080
PORT_ENV = "STEPWISE_LABEL_STUDIO_PORT"
ADMIN_EMAIL = "admin@stepwise.local"
STATE_FILE = "stepwise-server.json"
LOG_FILE = "stepwise-server.log"
LOCK_FILE = ".stepwise-server.lock"
FIRST_START_TIMEOUT_S = 420.0
SCHEMA_CACHE_ENV = "STEPWISE_LS_SCHEMA_CACHE"
_STARTED_AT_LINE = re.compile(r"Starting development server at http://[^:/]+:(\d+)/")
_children: dict[int, subprocess.Popen] = {}  # processes this Python process started, to reap them


class LabelStudioServerError(RuntimeError):
    """The local Label Studio server could not be started, reached or logged into."""


@dataclass(frozen=True)
class ServerStatus:
    running: bool
    url: str | None
    pid: int | None
    port: int | None
    data_dir: Path


def labelstudio_dir(home: Path) -> Path:
    """``$STEPWISE_HOME/labelstudio``: Label Studio's own data folder."""
    return Path(home) / "labelstudio"


_SECRET_KEY_LINE = re.compile(r"^\s*SECRET_KEY\s*=", re.MULTILINE)


def ensure_secret_key(data_dir: Path) -> None:
    """Give the data folder its Django ``SECRET_KEY`` before Label Studio's first start.

    Label Studio signs every token with the ``SECRET_KEY`` of ``<data>/.env`` and, when there is
    none, generates and appends one in each process that imports its settings; on a first start
    two processes can both append, the server signs with one key and the next start reads the
    other, so every token stops working after a restart. Written here once (mode 0600,
    temporary file then rename), the key is read by every process and survives restarts.
    """
    env_file = data_dir / ".env"
    try:
        text = env_file.read_text()
    except FileNotFoundError:
        text = ""
    if _SECRET_KEY_LINE.search(text):
        return
    separator = "\n" if text and not text.endswith("\n") else ""
    write_atomic(env_file, f"{text}{separator}SECRET_KEY={_random.token_urlsafe(50)}\n", mode=0o600)


def label_studio_executable() -> str:
    """The ``label-studio`` script of the running interpreter's environment (falls back to PATH)."""
    candidate = Path(sys.executable).with_name("label-studio")
    return str(candidate) if candidate.exists() else "label-studio"


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on host:port (Label Studio checks 'localhost' the same way)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) != 0


def free_port(preferred: int | None = None) -> int:
    """``preferred`` if free, else a free port chosen by the kernel."""
    if preferred and port_is_free(preferred):
        return preferred
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_environment(data_dir: Path, document_root: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a quiet, local, private Label Studio process (``document_root``: the parent of STEPWISE_HOME)."""
    env = dict(os.environ if base is None else base)
    for name in ("LABEL_STUDIO_URL", "LABEL_STUDIO_API_KEY", "LABEL_STUDIO_USER_TOKEN"):
        env.pop(name, None)
    env.update(
        {
            "LABEL_STUDIO_BASE_DATA_DIR": str(data_dir),
            "SENTRY_DSN": "",
            "FRONTEND_SENTRY_DSN": "",
            "COLLECT_ANALYTICS": "false",
            "LATEST_VERSION_CHECK": "false",
            "LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK": "true",
            # files under a project's local-files storage (the push gives each project one on
            # $STEPWISE_HOME, which must lie strictly inside this root) are served at
            # /data/local-files/?d=<path relative to this root>
            "LOCAL_FILES_SERVING_ENABLED": "true",
            "LOCAL_FILES_DOCUMENT_ROOT": str(document_root),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def schema_cache_dir() -> Path | None:
    """Where migrated empty databases are cached (None when disabled)."""
    configured = os.environ.get(SCHEMA_CACHE_ENV, "")
    if configured.lower() in ("off", "0", "false", "no"):
        return None
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stepwise"


def migrated_schema(
    progress: Callable[[str], None] | None = None, timeout_s: float = FIRST_START_TIMEOUT_S
) -> Path | None:
    """A Label Studio SQLite database with every migration applied and no rows of users or secrets.

    Built once per Label Studio version with ``label-studio version`` (which migrates and exits)
    in a scratch folder; only the database file is kept (the scratch folder's generated secret
    key is thrown away). None when the cache is disabled or the build fails (then Label Studio
    migrates the new folder itself, as usual).
    """
    root = schema_cache_dir()
    if root is None:
        return None
    version = importlib.metadata.version("label-studio")
    target = root / f"labelstudio-{version}-schema.sqlite3"
    if target.exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".labelstudio-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        if progress:
            progress(f"migrating an empty Label Studio {version} database once (cached in {root})")
        scratch = Path(tempfile.mkdtemp(prefix="stepwise-ls-schema-", dir=root))
        try:
            env = server_environment(scratch, scratch)
            for name in ("LABEL_STUDIO_USERNAME", "LABEL_STUDIO_PASSWORD"):
                env.pop(name, None)
            result = subprocess.run(
                [label_studio_executable(), "version", "--data-dir", str(scratch)],
                env=env,
                cwd=scratch,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
            built = scratch / "label_studio.sqlite3"
            if result.returncode != 0 or not built.exists():
                return None
            with atomic_path(target) as tmp:
                shutil.copyfile(built, tmp)
            return target
        except (OSError, subprocess.SubprocessError):
            return None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


class LocalLabelStudio:
    """The Label Studio server that the project runs for itself under ``$STEPWISE_HOME/labelstudio``."""

    def __init__(
        self, home: Path | str, *, port: int | None = None, startup_timeout_s: float = FIRST_START_TIMEOUT_S
    ) -> None:
        self.home = Path(home).resolve()
        self.data_dir = labelstudio_dir(self.home)
        self.preferred_port = port or int(os.environ.get(PORT_ENV) or DEFAULT_PORT)
        self.startup_timeout_s = startup_timeout_s

    # -- files -------------------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.data_dir / STATE_FILE

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_FILE

    def _read_state(self) -> dict | None:
        try:
            return json.loads(self.state_path.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def _write_state(self, state: dict) -> None:
        write_atomic(self.state_path, json.dumps(state, indent=2))

    @contextmanager
    def _lock(self) -> Iterator[None]:
        """One process at a time starts or stops the server (parallel Dagster steps, tests)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / LOCK_FILE, "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # -- status ------------------------------------------------------------------------------
    def status(self) -> ServerStatus:
        """Whether the recorded process is alive and answers /health on its port."""
        state = self._read_state()
        if not state:
            return ServerStatus(False, None, None, None, self.data_dir)
        pid, port = state.get("pid"), state.get("port")
        url = f"http://127.0.0.1:{port}"
        running = isinstance(pid, int) and pid > 0 and _process_alive(pid) and _healthy(url)
        return ServerStatus(running, url if running else None, pid, port, self.data_dir)

    @property
    def url(self) -> str | None:
        return self.status().url

    # -- start / stop ------------------------------------------------------------------------
    def start(self, progress: Callable[[str], None] | None = None) -> str:
        """Start the server unless it already runs; return its URL. Idempotent and safe to call concurrently."""
        say = progress or (lambda message: None)
        with self._lock():
            current = self.status()
            if current.running:
                return current.url  # type: ignore[return-value]
            if current.pid and _process_alive(current.pid):
                # alive but not answering: a previous start still migrating, or wedged
                say(f"Label Studio (pid {current.pid}) is not answering yet; waiting for it")
                try:  # _wait_healthy gives the port it answers on; start() promises the URL
                    return f"http://127.0.0.1:{self._wait_healthy(current.pid, current.port, say)}"
                except LabelStudioServerError:
                    self._terminate(current.pid)
            return self._spawn(say)

    def _spawn(self, say: Callable[[str], None]) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ensure_secret_key(self.data_dir)
        local = read_local_secrets(self.data_dir)
        first_start = not (self.data_dir / "label_studio.sqlite3").exists()
        if local is None:
            local = LocalSecrets(username=ADMIN_EMAIL, password=_random.token_urlsafe(18))
            write_local_secrets(self.data_dir, local)
        schema = migrated_schema(say) if first_start else None
        if schema is not None:
            shutil.copyfile(schema, self.data_dir / "label_studio.sqlite3")
        previous = self._read_state() or {}
        port = free_port(previous.get("port") or self.preferred_port)
        env = server_environment(self.data_dir, self.home.parent)
        env["LABEL_STUDIO_USERNAME"] = local.username  # creates the admin on first start (ignored after)
        env["LABEL_STUDIO_PASSWORD"] = local.password
        command = [
            label_studio_executable(),
            "start",
            "--no-browser",
            "--internal-host",
            "127.0.0.1",
            "--port",
            str(port),
            "--data-dir",
            str(self.data_dir),
        ]
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        say(
            f"starting Label Studio on 127.0.0.1:{port} (data {self.data_dir}; "
            + (
                "first start runs the database migrations, a minute or more)"
                if first_start and schema is None
                else "a few seconds)"
            )
        )
        with open(self.log_path, "ab") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.data_dir,
                start_new_session=True,
            )
        _children[process.pid] = process
        self._write_state({"pid": process.pid, "port": port, "requested_port": port, "started_at": time.time()})
        actual_port = self._wait_healthy(process.pid, port, say, log_offset=log_offset)
        return f"http://127.0.0.1:{actual_port}"

    def _wait_healthy(self, pid: int, port: int | None, say: Callable[[str], None], log_offset: int = 0) -> int:
        deadline = time.monotonic() + self.startup_timeout_s
        announced = time.monotonic()
        while time.monotonic() < deadline:
            if not _process_alive(pid):
                raise LabelStudioServerError(
                    f"Label Studio exited during start-up; end of its log ({self.log_path}):\n"
                    f"{self._log_tail(log_offset)}"
                )
            bound = self._bound_port(log_offset) or port
            if bound and _healthy(f"http://127.0.0.1:{bound}"):
                if bound != port:
                    say(f"port {port} was taken: Label Studio moved to {bound}")
                state = self._read_state() or {}
                self._write_state({**state, "pid": pid, "port": bound})
                return bound
            if time.monotonic() - announced > 15:
                say("Label Studio is still starting (migrations on first start)...")
                announced = time.monotonic()
            time.sleep(1.0)
        raise LabelStudioServerError(
            f"Label Studio did not answer within {self.startup_timeout_s:.0f} s; end of its log ({self.log_path}):\n"
            f"{self._log_tail(log_offset)}"
        )

    def _bound_port(self, log_offset: int) -> int | None:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(log_offset)
                text = log.read().decode(errors="replace")
        except FileNotFoundError:
            return None
        found = _STARTED_AT_LINE.findall(text)
        return int(found[-1]) if found else None

    def _log_tail(self, log_offset: int = 0, chars: int = 3000) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(log_offset)
                return scrub(log.read().decode(errors="replace")[-chars:])
        except FileNotFoundError:
            return "<no log>"

    def stop(self, timeout_s: float = 20.0) -> bool:
        """Stop the server this project started (by its recorded pid). True if one was running."""
        with self._lock():
            state = self._read_state()
            if not state or not state.get("pid"):
                return False
            pid = int(state["pid"])
            was_alive = _process_alive(pid)
            if was_alive:
                self._terminate(pid, timeout_s)
            self._write_state({k: v for k, v in state.items() if k != "pid"})
            return was_alive

    def _terminate(self, pid: int, timeout_s: float = 20.0) -> None:
        """SIGTERM the server's process group (it runs in its own session), SIGKILL if it lingers."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            except PermissionError:
                os.kill(pid, sig)
            deadline = time.monotonic() + (timeout_s if sig == signal.SIGTERM else 5.0)
            while time.monotonic() < deadline and _process_alive(pid):
                time.sleep(0.1)
            if not _process_alive(pid):
                break
        _reap(pid)

    # -- credentials ---------------------------------------------------------------------------
    def credentials(self, progress: Callable[[str], None] | None = None) -> Credentials:
        """Start the server if needed and return its URL and a working personal access token.

        The token is created once (logging in as the admin) and kept in the data folder; a token
        the server no longer accepts (a reset database) is replaced.
        """
        url = self.start(progress)
        with self._lock():
            local = read_local_secrets(self.data_dir)
            if local is None:
                local = self._recover_admin()
            if local.api_key and _token_works(url, local.api_key):
                return Credentials(url=url, api_key=local.api_key, source="local data folder", username=local.username)
            try:
                local.api_key = _create_personal_access_token(url, local.username, local.password)
            except LabelStudioServerError:
                local = self._recover_admin(local)
                local.api_key = _create_personal_access_token(url, local.username, local.password)
            write_local_secrets(self.data_dir, local)
            return Credentials(url=url, api_key=local.api_key, source="local data folder", username=local.username)

    def _recover_admin(self, local: LocalSecrets | None = None) -> LocalSecrets:
        """The secrets file was lost or its password no longer works: create or reset the admin with a new password."""
        del local
        fresh = LocalSecrets(username=ADMIN_EMAIL, password=_random.token_urlsafe(18))
        env = server_environment(self.data_dir, self.home)
        result = subprocess.run(
            [
                label_studio_executable(),
                "reset_password",
                "--username",
                fresh.username,
                "--password",
                fresh.password,
                "--data-dir",
                str(self.data_dir),
            ],
            env=env,
            cwd=self.data_dir,
            capture_output=True,
            text=True,
            timeout=180,
        )
        if "successfully" not in result.stdout.lower():
            raise LabelStudioServerError(
                f"could not recover the admin account of {self.data_dir}: "
                f"{scrub(result.stdout[-500:] + result.stderr[-500:])}"
            )
        write_local_secrets(self.data_dir, fresh)
        return fresh


def _process_alive(pid: int) -> bool:
    if pid in _children and _children[pid].poll() is not None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _reap(pid: int) -> None:
    child = _children.pop(pid, None)
    if child is not None:
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _healthy(url: str) -> bool:
    try:
        response = httpx.get(f"{url}/health", timeout=3.0)
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and "UP" in response.text


def _token_works(url: str, token: str) -> bool:
    """True if the server exchanges the personal access token for an access token."""
    try:
        response = httpx.post(f"{url}/api/token/refresh/", json={"refresh": token}, timeout=15.0)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def _create_personal_access_token(url: str, email: str, password: str) -> str:
    """Log in through the web form (session + CSRF) and create a personal access token.

    Label Studio allows one token per user; an existing one (e.g. from a lost secrets file) is
    revoked first through the same session.
    """
    with httpx.Client(base_url=url, timeout=30.0, follow_redirects=False) as web:
        web.get("/user/login/")
        csrf = web.cookies.get("csrftoken")
        login = web.post(
            "/user/login/",
            data={"email": email, "password": password, "csrfmiddlewaretoken": csrf or ""},
            headers={"Referer": f"{url}/user/login/"},
        )
        if login.status_code != 302 or "sessionid" not in web.cookies:
            raise LabelStudioServerError(
                f"could not log in to Label Studio at {url} as {email} (HTTP {login.status_code})"
            )
        headers = {"X-CSRFToken": web.cookies.get("csrftoken") or "", "Referer": f"{url}/"}
        created = web.post("/api/token/", headers=headers)
        if created.status_code == 400 or created.status_code == 409:  # a token exists already: revoke it, retry
            for existing in web.get("/api/token/").json() or []:
                token = existing.get("token") if isinstance(existing, dict) else None
                if token:
                    web.post("/api/token/blacklist/", json={"refresh": token}, headers=headers)
            created = web.post("/api/token/", headers=headers)
        if created.status_code not in (200, 201):
            raise LabelStudioServerError(
                f"Label Studio at {url} refused to create a personal access token (HTTP {created.status_code}): "
                f"{scrub(created.text[:300])}"
            )
        return created.json()["token"]


def main(argv: list[str] | None = None) -> int:
    """``python -m annotation.labelstudio start|stop|status|url|password`` for the project's own server
    (``password``: the admin's, printed from the credentials file, for logging in to the web UI)."""
    from warehouse.storage import stepwise_home

    parser = argparse.ArgumentParser(prog="python -m annotation.labelstudio", description=main.__doc__)
    parser.add_argument("command", choices=["start", "stop", "status", "url", "password"])
    parser.add_argument("--home", default=None, help="STEPWISE_HOME (default: $STEPWISE_HOME or ./.stepwise)")
    parser.add_argument(
        "--port", type=int, default=None, help=f"preferred port (default ${PORT_ENV} or {DEFAULT_PORT})"
    )
    args = parser.parse_args(argv)
    server = LocalLabelStudio(Path(args.home) if args.home else stepwise_home(), port=args.port)
    if args.command == "start":
        try:
            creds = server.credentials(progress=lambda message: print(f"[label-studio] {message}", flush=True))
        except LabelStudioServerError as exc:
            print(f"[label-studio] {exc}", file=sys.stderr)
            return 1
        print(f"[label-studio] running at {creds.url} (pid {server.status().pid})")
        print(
            f"[label-studio] log in as {creds.username}; "
            f"password and API token in {server.data_dir / CREDENTIALS_FILE} "
            f"(print the password: python -m annotation.labelstudio password --home {server.home})"
        )
        return 0
    if args.command == "password":
        local = read_local_secrets(server.data_dir)
        if local is None:
            print(f"[label-studio] no {CREDENTIALS_FILE} in {server.data_dir}: start the server first", file=sys.stderr)
            return 1
        print(local.password)
        return 0
    if args.command == "stop":
        print("[label-studio] stopped" if server.stop() else "[label-studio] was not running")
        return 0
    status = server.status()
    if args.command == "url":
        if not status.running:
            return 1
        print(status.url)
        return 0
    print(f"running at {status.url} (pid {status.pid})" if status.running else "not running")
    print(f"data: {status.data_dir}")
    return 0 if status.running else 3


if __name__ == "__main__":
    sys.exit(main())
