"""Secrets: scrubbed from messages, stored 0600 in the data folder only, never shown by repr."""

from __future__ import annotations

import stat

from annotation.labelstudio.secrets import (
    Credentials,
    LocalSecrets,
    annotator_salt,
    credentials_from_environment,
    read_local_secrets,
    register_secret,
    scrub,
    server_key_for_url,
    write_local_secrets,
)

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJ0b2tlbl90eXBlIjoicmVmcmVzaCJ9.c2lnbmF0dXJlLXBhcnQtaGVyZQ"


def test_scrub_blanks_registered_secrets_and_token_shapes():
    register_secret("hunter2-password")
    assert scrub("login with hunter2-password failed") == "login with *** failed"
    assert JWT not in scrub(f"Bearer {JWT}") and "***" in scrub(f"Bearer {JWT}")
    assert scrub("token " + "ab12" * 10) == "token ***"


def test_credentials_never_show_their_key():
    creds = Credentials(url="http://127.0.0.1:8080", api_key=JWT, source="environment")
    assert JWT not in repr(creds) and JWT not in str(creds)
    assert creds.server_key == "127.0.0.1:8080"
    assert Credentials(url="http://x", api_key=JWT, source="local data folder").server_key == "local"
    assert server_key_for_url("https://user:pw@ls.example.org/path?q=1") == "ls.example.org:443"


def test_environment_needs_both_variables():
    assert credentials_from_environment({"LABEL_STUDIO_URL": "http://h:1"}) is None
    creds = credentials_from_environment({"LABEL_STUDIO_URL": "http://h:1/", "LABEL_STUDIO_API_KEY": JWT})
    assert creds.url == "http://h:1" and creds.source == "environment"


def test_local_secrets_file_is_private(tmp_path):
    path = write_local_secrets(tmp_path, LocalSecrets(username="admin@x", password="pw-123456", api_key=JWT))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_local_secrets(tmp_path).api_key == JWT
    assert "pw-123456" not in repr(read_local_secrets(tmp_path))
    salt = annotator_salt(tmp_path)
    assert salt == annotator_salt(tmp_path) and len(salt) == 32
    assert stat.S_IMODE((tmp_path / "stepwise-annotator-salt").stat().st_mode) == 0o600
