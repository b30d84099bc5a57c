"""The slice of uiautomator2's ``Device`` that the Android backend uses; connecting; record and replay.

``connect(address)`` opens a real device: a local adb serial ("emulator-5554"), or a remote
emulator or device by "IP:port", as GUI-Shepherd (App. B.1) drives its emulator farm; uiautomator2
runs ``adb connect`` itself for an IP:port. ``RecordingDevice`` wraps a real device and writes
every call and what it returned to a JSON Lines file; ``ReplayDevice`` plays such a file back
(checking that the same calls come in the same order) so an Android interaction recorded once on
a device can be re-run anywhere, in tests and in the worker pool, without a device.

Recording format (one JSON object per line): a header
``{"format": "stepwise-uiautomator2-recording", "version": 1, "device": "..."}``, then one
``{"call": name, "args": [...], "kwargs": {...}, "result": ...}`` per call, in order.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from envs.protocol import EnvironmentFailure

RECORDING_FORMAT = "stepwise-uiautomator2-recording"
# The Device methods the backend calls: what a recording holds and a fake must provide.
DEVICE_METHODS: tuple[str, ...] = (
    "dump_hierarchy",
    "window_size",
    "click",
    "long_click",
    "swipe",
    "press",
    "send_keys",
    "clear_text",
    "app_start",
    "app_stop",
    "app_clear",
    "app_wait",
    "app_current",
)


@runtime_checkable
class AndroidDevice(Protocol):
    """What the backend needs of a device; ``uiautomator2.Device`` provides it as is."""

    def dump_hierarchy(self, compressed: bool = False, pretty: bool = False, max_depth: int | None = None) -> str: ...

    def window_size(self) -> tuple[int, int]: ...

    @property
    def info(self) -> dict[str, Any]: ...

    def click(self, x: float, y: float) -> None: ...

    def long_click(self, x: float, y: float, duration: float = 0.5) -> None: ...

    def swipe(self, fx: float, fy: float, tx: float, ty: float, duration: float | None = None) -> Any: ...

    def press(self, key: str) -> Any: ...

    def send_keys(self, text: str, clear: bool = False) -> None: ...

    def clear_text(self) -> None: ...

    def app_start(
        self, package_name: str, activity: str | None = None, wait: bool = False, stop: bool = False
    ) -> None: ...

    def app_stop(self, package_name: str) -> None: ...

    def app_clear(self, package_name: str) -> None: ...

    def app_wait(self, package_name: str, timeout: float = 20.0, front: bool = False) -> int: ...

    def app_current(self) -> dict[str, Any]: ...


def connect(address: str | None = None, *, attempts: int = 2) -> AndroidDevice:
    """A uiautomator2 device by adb serial or "IP:port" (None: $ANDROID_SERIAL, else the only device).

    Raises EnvironmentFailure (the pool then tries another worker) when no device answers.
    """
    import uiautomator2

    last: Exception | None = None
    for attempt in range(attempts):
        try:
            device = uiautomator2.connect(address)
            device.window_size()  # the first real round trip: fails here if the device is not there
            return device
        except Exception as exc:  # noqa: BLE001 - adbutils, uiautomator2 and socket errors alike
            last = exc
            time.sleep(0.5 * (attempt + 1))
    raise EnvironmentFailure(f"no Android device at {address or '$ANDROID_SERIAL / the only device'}: {last}")


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


class RecordingDevice:
    """A real device whose calls (and their results) are appended to a recording as they happen."""

    def __init__(self, device: AndroidDevice, path: Path | str, *, label: str = "") -> None:
        self._device = device
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("w", encoding="utf-8")
        self._lock = threading.Lock()
        self._write({"format": RECORDING_FORMAT, "version": 1, "device": label})

    def _write(self, entry: Mapping[str, Any]) -> None:
        with self._lock:
            self._file.write(json.dumps(entry, ensure_ascii=False) + "\n")
            self._file.flush()

    def __getattr__(self, name: str) -> Any:
        if name not in DEVICE_METHODS:
            return getattr(self._device, name)
        method = getattr(self._device, name)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            self._write(
                {"call": name, "args": _jsonable(args), "kwargs": _jsonable(kwargs), "result": _jsonable(result)}
            )
            return result

        return recorded

    def close(self) -> None:
        with self._lock:
            self._file.close()


class ReplayMismatch(AssertionError):
    """The replayed interaction asked for a call the recording does not have next."""


def _same(recorded: Any, actual: Any) -> bool:
    if isinstance(recorded, (int, float)) and isinstance(actual, (int, float)) and not isinstance(actual, bool):
        return abs(float(recorded) - float(actual)) < 1.0  # pixel coordinates: within a pixel
    if isinstance(recorded, list) and isinstance(actual, (list, tuple)):
        return len(recorded) == len(actual) and all(_same(r, a) for r, a in zip(recorded, actual, strict=True))
    if isinstance(recorded, dict) and isinstance(actual, Mapping):
        return recorded.keys() == actual.keys() and all(_same(recorded[k], actual[k]) for k in recorded)
    return recorded == actual


class ReplayDevice:
    """Plays a recording back: each call must be the recording's next one; its result is returned.

    ``calls`` lists what was asked, in order. ``strict=False`` tolerates calls the recording does
    not have next (they are recorded and answered with None; dumps then repeat the latest screen),
    for driving recorded screens with a policy that wanders.
    """

    def __init__(self, entries: Iterable[Mapping[str, Any]], *, strict: bool = True, label: str = "replay") -> None:
        self.entries = [dict(e) for e in entries if "call" in e]
        self.strict = strict
        self.label = label
        self.position = 0
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self._last_dump: str | None = next((e["result"] for e in self.entries if e["call"] == "dump_hierarchy"), None)
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: Path | str, *, strict: bool = True) -> ReplayDevice:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        entries = [json.loads(line) for line in lines if line.strip()]
        if not entries or entries[0].get("format") != RECORDING_FORMAT:
            raise ValueError(f"{path}: not a {RECORDING_FORMAT} file")
        return cls(entries[1:], strict=strict, label=str(path))

    @classmethod
    def from_steps(
        cls, steps: Sequence[tuple[str, Sequence[Any], Mapping[str, Any], Any]], **kwargs: Any
    ) -> ReplayDevice:
        """Build a recording in code: (call, args, kwargs, result) tuples."""
        return cls(({"call": c, "args": list(a), "kwargs": dict(k), "result": r} for c, a, k, r in steps), **kwargs)

    @property
    def info(self) -> dict[str, Any]:
        """What a health check reads; answered outside the recorded sequence."""
        return {"replay": self.label, "position": self.position, "entries": len(self.entries)}

    @property
    def finished(self) -> bool:
        return self.position >= len(self.entries)

    def _answer(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with self._lock:
            self.calls.append((name, args, kwargs))
            entry = self.entries[self.position] if self.position < len(self.entries) else None
            if (
                entry is not None
                and entry["call"] == name
                and _same(entry.get("args", []), list(args))
                and _same(entry.get("kwargs", {}), kwargs)
            ):
                self.position += 1
                if name == "dump_hierarchy":
                    self._last_dump = entry["result"]
                result = entry.get("result")
                return tuple(result) if name == "window_size" and result is not None else result
            if self.strict:
                expected = (
                    "the end of the recording"
                    if entry is None
                    else f"{entry['call']}({entry.get('args')}, {entry.get('kwargs')})"
                )
                raise ReplayMismatch(
                    f"replay {self.label} at entry {self.position}: "
                    f"got {name}({list(args)}, {kwargs}), expected {expected}"
                )
            if name == "dump_hierarchy":
                # Lenient: move on to the next recorded screen when one is due, else repeat the last.
                if entry is not None and entry["call"] == "dump_hierarchy":
                    self.position += 1
                    self._last_dump = entry["result"]
                return self._last_dump
            if name == "window_size":
                return next((tuple(e["result"]) for e in self.entries if e["call"] == "window_size"), (1080, 2400))
            return None

    def __getattr__(self, name: str) -> Any:
        if name not in DEVICE_METHODS:
            raise AttributeError(name)

        def replayed(*args: Any, **kwargs: Any) -> Any:
            return self._answer(name, args, kwargs)

        return replayed
