"""An annotator's submission in headless Chromium, through the real labeling page, reaches human_labels.

Logs in as the project's admin (password from the local data folder), opens a step-correctness
task, clicks "negative", types a rationale and submits; opens a step-progress task, sets 60 and
submits; then one sensor tick brings both into ``human_labels``. Screenshots of both pages go to
test-artifacts/labelstudio-*.png.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from dagster import DagsterInstance

from annotation.labelstudio.secrets import read_local_secrets
from assets.human_labels import build_label_studio_sensor
from tests.annotation.labelstudio.helpers import labels, push, queued_tasks, tick

pytestmark = pytest.mark.e2e

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"
T = TypeVar("T")


def _chrome():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if not Path(chromium).exists() or not Path(driver_path).exists():
        pytest.fail("Chromium and chromedriver are needed (make setup installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="stepwise-chromium-")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1500,1000",
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver_path), options=options), profile


def _retry(action: Callable[[], T], seconds: float = 20.0) -> T:
    """React re-renders the labeling page: retry on stale or not-yet-present elements."""
    from selenium.common.exceptions import (
        ElementClickInterceptedException,
        NoSuchElementException,
        StaleElementReferenceException,
    )

    deadline = time.monotonic() + seconds
    while True:
        try:
            return action()
        except (StaleElementReferenceException, NoSuchElementException, ElementClickInterceptedException):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def _a_choice_is_checked(driver) -> bool:
    """Whether any choice on the page is checked (False while the page re-renders under us)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return any(box.is_selected() for box in driver.find_elements(By.CSS_SELECTOR, "input.ant-radio-input"))
    except StaleElementReferenceException:
        return False


def _choose(driver, value: str, seconds: float = 30.0) -> None:
    """Click a choice until it is checked and stays checked (the page may re-render while the pre-annotation loads)."""
    from selenium.webdriver.common.by import By

    selector = f"input.ant-radio-input[name={value}]"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _retry(lambda: driver.find_element(By.CSS_SELECTOR, selector).is_selected()):
            _retry(
                lambda: driver.execute_script(
                    "arguments[0].closest('label').click()", driver.find_element(By.CSS_SELECTOR, selector)
                )
            )
        time.sleep(1.0)
        if _retry(lambda: driver.find_element(By.CSS_SELECTOR, selector).is_selected()):
            return
    raise AssertionError(f"could not select {value!r}")


def _wait_for_annotation(client, task_id: int, seconds: float = 30.0) -> dict:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = client._raw("GET", f"api/tasks/{task_id}/annotations/", what="annotations")
        if found:
            return found[0]
        time.sleep(0.5)
    raise AssertionError(f"no annotation arrived for task {task_id}")


def test_submission_in_chromium_reaches_human_labels(ls_server, ls_credentials, small_warehouse, ls_resource):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    instance = DagsterInstance.ephemeral()
    push(small_warehouse, ls_resource, budget=4, instance=instance)
    correctness = queued_tasks(small_warehouse, "step_correctness")[0]
    progress = queued_tasks(small_warehouse, "step_progress")[0]
    admin = read_local_secrets(ls_server.data_dir)
    client = ls_resource.client()
    url = ls_credentials.url
    ARTIFACTS.mkdir(exist_ok=True)
    driver, profile = _chrome()
    try:
        wait = WebDriverWait(driver, 60)
        driver.get(f"{url}/user/login/")
        driver.find_element(By.NAME, "email").send_keys(admin.username)
        driver.find_element(By.NAME, "password").send_keys(admin.password)
        driver.find_element(By.CSS_SELECTOR, "button[type=submit], input[type=submit]").click()
        wait.until(lambda d: "/user/login" not in d.current_url)

        # step correctness: click a choice, write a rationale, submit
        driver.get(f"{url}/projects/{correctness['ls_project_id']}/data?task={correctness['ls_task_id']}")
        wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "input.ant-radio-input[name=negative]")))
        assert "target" in driver.page_source and "Earlier actions" in driver.page_source
        # the model's pre-annotation checks its choice once loaded: a click before that starts an
        # annotation from scratch (no parent prediction; seen once in CI under load)
        wait.until(_a_choice_is_checked)
        _choose(driver, "negative")
        _retry(lambda: driver.find_element(By.CSS_SELECTOR, "textarea[name=rationale]").click())
        _retry(
            lambda: driver.find_element(By.CSS_SELECTOR, "textarea[name=rationale]").send_keys(
                "types into the wrong field"
            )
        )
        driver.save_screenshot(str(ARTIFACTS / "labelstudio-step-correctness.png"))
        _retry(
            lambda: wait.until(EC.element_to_be_clickable((By.XPATH, "//button[normalize-space()='Submit']"))).click()
        )
        submitted = _wait_for_annotation(client, correctness["ls_task_id"])
        assert submitted["result"][0]["value"]["choices"] == ["negative"]

        # step progress: set 60, submit
        driver.get(f"{url}/projects/{progress['ls_project_id']}/data?task={progress['ls_task_id']}")
        wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "input[type=number][name=progress]")))

        def set_progress() -> None:
            box = driver.find_element(By.CSS_SELECTOR, "input[type=number][name=progress]")
            box.click()
            box.send_keys(Keys.CONTROL, "a")
            box.send_keys(Keys.BACKSPACE)
            box.send_keys("60")

        deadline = time.monotonic() + 30
        while True:  # typed again if a late re-render (the pre-annotation loading) replaced the value
            _retry(set_progress)
            time.sleep(1.0)
            value = _retry(
                lambda: driver.find_element(By.CSS_SELECTOR, "input[type=number][name=progress]").get_attribute("value")
            )
            if value == "60" or time.monotonic() > deadline:
                break
        assert value == "60"
        driver.save_screenshot(str(ARTIFACTS / "labelstudio-step-progress.png"))
        _retry(
            lambda: wait.until(EC.element_to_be_clickable((By.XPATH, "//button[normalize-space()='Submit']"))).click()
        )
        _wait_for_annotation(client, progress["ls_task_id"])
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
        client.close()

    result = tick(build_label_studio_sensor(name="browser_test_sensor"), small_warehouse, ls_resource, instance)
    assert len(result.asset_events) == 2
    rows = {(r["interface"], r["ls_task_id"]): r for r in labels(small_warehouse)}
    judged = rows[("step_correctness", correctness["ls_task_id"])]
    assert (judged["label"], judged["rationale"], judged["usable_for_training"]) == (
        "negative",
        "types into the wrong field",
        True,
    )
    assert judged["lead_time_s"] and judged["lead_time_s"] > 0
    assert judged["from_prediction"] is True  # the annotator started from the model's pre-annotation
    assert (judged["episode_id"], judged["step_idx"]) == (correctness["episode_id"], correctness["step_idx"])
    assert rows[("step_progress", progress["ls_task_id"])]["value"] == pytest.approx(0.6)
