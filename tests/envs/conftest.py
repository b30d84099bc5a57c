import os
from pathlib import Path

import pytest

os.environ.setdefault("MINIWOB_CHROME_BINARY", "/usr/bin/chromium")
os.environ.setdefault("MINIWOB_CHROMEDRIVER", "/usr/bin/chromedriver")

SHARED = Path(__file__).resolve().parents[3] / "shared"
DUMPS_DIR = SHARED / "data" / "android-hierarchy"


@pytest.fixture(scope="session")
def dumps_dir() -> Path:
    if not DUMPS_DIR.is_dir():
        pytest.fail(f"the shared Android hierarchy dumps are missing: {DUMPS_DIR}")
    return DUMPS_DIR


def read_dump(name_prefix: str) -> str:
    path = next(DUMPS_DIR.glob(f"{name_prefix}__*.xml"))
    return path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def miniwob_env():
    """One real Chromium for a test module (started once: ~1.5 s)."""
    from envs.miniwob.live import MiniWoBEnv

    env = MiniWoBEnv()
    yield env
    env.close()
