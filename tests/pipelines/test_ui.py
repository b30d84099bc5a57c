"""End to end: the Dagster UI (`make ui`) serves the Stepwise asset graph, checked as a user would.

Starts a real `dagster-webserver -w workspace.yaml` on a free port against a throwaway
$DAGSTER_HOME, asks its GraphQL API for the asset, then opens the asset graph in headless
Chromium and saves a screenshot to test-artifacts/dagster-asset-graph.png.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "test-artifacts"
SCREENSHOT = ARTIFACTS / "dagster-asset-graph.png"
ASSET = "human_demonstrations"
GROUP = "demonstrations"
# The "Lineage" page of Dagster 1.13: the global asset graph (SVG nodes plus a sidebar list).
GRAPH_PATH = "/asset-groups"  # the global lineage: one collapsed node per group
GROUP_PATH = "/locations/stepwise/asset-groups/{group}"  # one group's graph, assets expanded
STARTUP_TIMEOUT_S = 90
PAGE_TIMEOUT_S = 60


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _graphql(base_url: str, query: str, timeout: float = 10) -> dict:
    request = urllib.request.Request(
        f"{base_url}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        payload = json.load(response)
    assert not payload.get("errors"), f"GraphQL errors: {payload['errors']}"
    return payload["data"]


def _log_tail(log_path: Path, chars: int = 4000) -> str:
    try:
        return log_path.read_text(errors="replace")[-chars:]
    except OSError:
        return "<no log>"


WORKSPACE_QUERY = """
{ workspaceOrError {
    __typename
    ... on PythonError { message }
    ... on Workspace { locationEntries {
        name loadStatus
        locationOrLoadError { __typename ... on PythonError { message } }
    } }
} }
"""


def _wait_until_loaded(base_url: str, proc: subprocess.Popen, log_path: Path) -> None:
    """Poll (bounded) until the webserver answers and every code location has loaded."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    last = "no answer yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"dagster-webserver exited with code {proc.returncode}:\n{_log_tail(log_path)}")
        try:
            workspace = _graphql(base_url, WORKSPACE_QUERY, timeout=5)["workspaceOrError"]
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
            last = repr(exc)
        else:
            if workspace["__typename"] != "Workspace":
                pytest.fail(f"workspace failed to load: {workspace}")
            entries = workspace["locationEntries"]
            for entry in entries:
                error = entry["locationOrLoadError"]
                if error and error["__typename"] == "PythonError":
                    pytest.fail(f"code location {entry['name']!r} failed to load:\n{error['message']}")
            if entries and all(entry["loadStatus"] == "LOADED" for entry in entries):
                return
            last = f"locations: {[(e['name'], e['loadStatus']) for e in entries]}"
        time.sleep(0.25)
    pytest.fail(f"dagster-webserver not ready after {STARTUP_TIMEOUT_S} s ({last}):\n{_log_tail(log_path)}")


@pytest.fixture(scope="module")
def webserver(tmp_path_factory):
    """Base URL of a dagster-webserver serving workspace.yaml from a fresh, throwaway instance."""
    exe = Path(sys.executable).with_name("dagster-webserver")
    if not exe.exists():
        pytest.fail(f"{exe} is missing; run `make setup` to install the project's virtual environment")
    home = tmp_path_factory.mktemp("stepwise_home")
    log_path = home / "dagster-webserver.log"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STEPWISE_HOME", str(home))
        mp.setenv("DAGSTER_HOME", str(home / "dagster"))
        mp.setenv("HF_HUB_OFFLINE", "1")
        from pipelines.cli.common import prepare_dagster_home

        dagster_home = prepare_dagster_home()  # copies the repo's dagster.yaml into $DAGSTER_HOME
        assert (dagster_home / "dagster.yaml").is_file()
        env = dict(os.environ)

    port = _free_port()
    base_url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(exe), "-h", "127.0.0.1", "-p", str(port), "-w", "workspace.yaml"],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group, so teardown also ends its code-server child
        )
    try:
        _wait_until_loaded(base_url, proc, log_path)
        # Mark the instance's "Join the Dagster community" dialog as seen (what its Skip button does);
        # on a fresh $DAGSTER_HOME it would otherwise cover the graph a second after page load.
        _graphql(base_url, "mutation { setNuxSeen }")
        assert _graphql(base_url, "{ shouldShowNux }")["shouldShowNux"] is False
        yield base_url
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
    try:  # leftovers of the group (the code server) even when the webserver itself has exited
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait(timeout=10)


def _find_binary(preferred: str, *names: str) -> str:
    if Path(preferred).is_file():
        return preferred
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(
        f"{preferred} not found (nor {', '.join(names)} on PATH): "
        "run `make setup` to install Debian's chromium and chromium-driver"
    )


@pytest.fixture
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        pytest.fail(f"selenium is not installed ({exc}); run `make setup`")
    chromium = _find_binary("/usr/bin/chromium", "chromium", "chromium-browser")
    chromedriver = _find_binary("/usr/bin/chromedriver", "chromedriver")

    profile = tempfile.mkdtemp(prefix="stepwise-chromium-")
    options = Options()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1600,1000",
        f"--user-data-dir={profile}",
        # No outside network: only the local webserver resolves.
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    try:
        driver.set_page_load_timeout(PAGE_TIMEOUT_S)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


ASSET_NODES_QUERY = """
{ assetNodes {
    assetKey { path }
    groupName
    assetChecksOrError { __typename ... on AssetChecks { checks { name } } }
} }
"""


def _asset_nodes(base_url: str) -> dict[str, dict]:
    nodes = _graphql(base_url, ASSET_NODES_QUERY)["assetNodes"]
    return {"/".join(node["assetKey"]["path"]): node for node in nodes}


def _check_names(node: dict) -> list[str]:
    checks = node["assetChecksOrError"]
    assert checks["__typename"] == "AssetChecks", f"asset checks failed to load: {checks}"
    return sorted(check["name"] for check in checks["checks"])


def test_graphql_lists_asset_in_demonstrations_group(webserver):
    nodes = _asset_nodes(webserver)
    assert ASSET in nodes, f"{ASSET} missing from the webserver's assets: {sorted(nodes)}"
    assert nodes[ASSET]["groupName"] == GROUP
    assert _check_names(nodes[ASSET]), f"{ASSET} has no asset checks"


def test_asset_graph_shows_asset_in_browser(webserver, browser):
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    n_checks = len(_check_names(_asset_nodes(webserver)[ASSET]))
    # The asset's node in the graph itself (an SVG foreignObject), not its entry in the sidebar list.
    node_xpath = f"//*[local-name()='svg']//*[local-name()='foreignObject'][.//*[normalize-space(text())='{ASSET}']]"
    checks_summary = re.compile(rf"\b\d+ / {n_checks}\b")  # e.g. "0 / 4 Passed" on a fresh instance

    def graph_node(driver):
        """The asset's graph node, once it shows its name and its live status has loaded."""
        for element in driver.find_elements(By.XPATH, node_xpath):
            if not element.is_displayed():
                continue
            text = element.text
            if ASSET in text and "Loading" not in text and checks_summary.search(text):
                return element
        return False

    ARTIFACTS.mkdir(exist_ok=True)
    # The global lineage shows every stage as a group.
    browser.get(f"{webserver}{GRAPH_PATH}")
    WebDriverWait(browser, PAGE_TIMEOUT_S, poll_frequency=0.25).until(
        lambda d: all(g in d.find_element(By.TAG_NAME, "body").text for g in ("demonstrations", "labels", "rollouts"))
    )
    browser.save_screenshot(str(ARTIFACTS / "dagster-global-lineage.png"))
    browser.get(f"{webserver}{GROUP_PATH.format(group=GROUP)}")
    try:
        node = WebDriverWait(
            browser, PAGE_TIMEOUT_S, poll_frequency=0.25, ignored_exceptions=(StaleElementReferenceException,)
        ).until(graph_node)  # React re-renders the node while its status loads
    except TimeoutException:
        browser.save_screenshot(str(SCREENSHOT))
        body = browser.find_element(By.TAG_NAME, "body").text
        pytest.fail(
            f"{ASSET} (with its {n_checks} asset checks, status loaded) never appeared in the asset graph "
            f"at {browser.current_url} within {PAGE_TIMEOUT_S} s "
            f"(screenshot: {SCREENSHOT}); page text:\n{body[:2000]}"
        )
    browser.save_screenshot(str(SCREENSHOT))

    assert node.is_displayed()
    assert ASSET in node.text
    body = browser.find_element(By.TAG_NAME, "body").text
    assert ASSET in body
    assert "Join the Dagster community" not in body, "the community dialog covers the graph"
    assert SCREENSHOT.stat().st_size > 10_000, "screenshot is suspiciously small"
