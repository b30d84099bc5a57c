"""Android through uiautomator2, behind the environment protocol (``envs.protocol``).

* ``hierarchy``: the view-hierarchy XML (``uiautomator dump`` / ``Device.dump_hierarchy()``) -> Screen;
* ``actions``: canonical actions -> uiautomator2 calls (pure: element bounds in, calls out);
* ``device``: the slice of the uiautomator2 ``Device`` API we use, connecting by serial or
  IP:port, and a recording / replaying device for working without one;
* ``env``: ``AndroidEnv`` and its picklable ``AndroidConfig`` for the worker pool.
"""

from envs.android.actions import DeviceCall, to_device_calls
from envs.android.device import AndroidDevice, RecordingDevice, ReplayDevice, ReplayMismatch, connect
from envs.android.env import AndroidConfig, AndroidEnv
from envs.android.hierarchy import parse_bounds, parse_hierarchy, role_of_class

__all__ = [
    "AndroidConfig",
    "AndroidDevice",
    "AndroidEnv",
    "DeviceCall",
    "RecordingDevice",
    "ReplayDevice",
    "ReplayMismatch",
    "connect",
    "parse_bounds",
    "parse_hierarchy",
    "role_of_class",
    "to_device_calls",
]
