"""Which Label Studio the project talks to: the user's own (environment) or the project's own server."""

from __future__ import annotations

import pytest

from annotation.labelstudio.client import LabelStudioUnavailable
from annotation.labelstudio.connection import LabelStudioSite, connect, pseudonym_salt, resolve_credentials
from annotation.labelstudio.secrets import API_KEY_ENV, URL_ENV
from annotation.labelstudio.server import STATE_FILE, labelstudio_dir

KEY = "personal-access-token-for-tests-0123456789"


def test_the_users_own_server_when_both_variables_are_set(tmp_path):
    environ = {URL_ENV: "http://ls.example:9000/", API_KEY_ENV: KEY}
    creds = resolve_credentials(tmp_path, start_local=True, environ=environ)
    assert (creds.url, creds.source, creds.server_key) == ("http://ls.example:9000", "environment", "ls.example:9000")
    assert not labelstudio_dir(tmp_path).exists()  # nothing was started, nothing written


def test_otherwise_the_projects_own_server_which_is_not_started_unless_asked(tmp_path):
    with pytest.raises(LabelStudioUnavailable) as failure:
        resolve_credentials(tmp_path, start_local=False, environ={URL_ENV: "http://ls.example:9000"})
    message = str(failure.value)
    assert "not running" in message and "make annotate" in message and API_KEY_ENV in message
    assert not (labelstudio_dir(tmp_path) / STATE_FILE).exists()


def test_connect_gives_a_client_for_the_environments_server(tmp_path, monkeypatch):
    monkeypatch.setenv(URL_ENV, "http://127.0.0.1:9")
    monkeypatch.setenv(API_KEY_ENV, KEY)
    client = connect(tmp_path, start_local=False, timeout_s=5.0)
    assert (client.url, client.server_key, client.timeout_s) == ("http://127.0.0.1:9", "127.0.0.1:9", 5.0)
    assert KEY not in repr(client)
    client.close()  # never connected: nothing to close


def test_pseudonym_salt_is_kept_per_home(tmp_path):
    first = pseudonym_salt(tmp_path / "a")
    assert first == pseudonym_salt(tmp_path / "a") and len(first) >= 16
    assert first != pseudonym_salt(tmp_path / "b")
    assert any(first in p.read_text() for p in labelstudio_dir(tmp_path / "a").iterdir() if p.is_file())


def test_site_paths_and_login_hint(tmp_path):
    calls = []
    site = LabelStudioSite(connect=lambda: calls.append(1), namespace="N", home=tmp_path, own_server=True)
    assert site.data_dir == labelstudio_dir(tmp_path) and site.lock_path.parent == site.data_dir
    assert "admin@stepwise.local" in site.login_hint() and "stepwise-credentials.json" in site.login_hint()
    assert "python -m annotation.labelstudio password --home" in site.login_hint()  # how to read it
    assert (
        LabelStudioSite(lambda: None, "N", tmp_path, own_server=False).login_hint() == "your own Label Studio account"
    )
    assert calls == []  # connecting is left to the stage


@pytest.mark.e2e
def test_the_running_local_server_without_starting_it(ls_server, ls_home, ls_credentials):
    creds = resolve_credentials(ls_home, start_local=False, environ={})
    assert (creds.url, creds.source, creds.server_key) == (ls_credentials.url, "local data folder", "local")
