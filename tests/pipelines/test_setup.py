"""The stack the tests run against is the one the project declares: the transformers floor in
pyproject.toml is the locked version (constraints.txt) and the installed one."""

import importlib.metadata
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _declared(name: str) -> str:
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(d for d in dependencies if re.match(rf"{re.escape(name)}\b", d) and not d.startswith(f"{name}-"))


def _locked(name: str) -> str:
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.lower().startswith(f"{name}=="):
            return line.split("==", 1)[1].strip()
    raise AssertionError(f"{name} is not locked in constraints.txt")


def test_the_transformers_floor_is_the_locked_and_installed_version():
    floor = re.search(r">=\s*([\d.]+)", _declared("transformers"))
    assert floor is not None, "pyproject must state a transformers floor"
    assert floor.group(1) == _locked("transformers") == importlib.metadata.version("transformers")


def test_torch_is_the_local_cpu_wheel_and_installed_first():
    assert _declared("torch") == "torch==2.13.0"
    assert importlib.metadata.version("torch").startswith("2.13.0")
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert setup.index('install -q "torch==2.13.0"') < setup.index("-c constraints.txt")
