"""Human labels in Label Studio: the server, the client, labeling interfaces, selection, push and sync.

Modules (no Dagster here; the stage module :mod:`annotation.labelstudio.human_labels` composes them, and
assets/human_labels.py declares its assets):

* :mod:`~annotation.labelstudio.server`: the project's own Label Studio (start, stop, admin token);
* :mod:`~annotation.labelstudio.connection`: which server to use (environment or the local one);
* :mod:`~annotation.labelstudio.client`: the SDK 2.x client with errors mapped to auth / unavailable / other;
* :mod:`~annotation.labelstudio.interfaces` and ``configs/``: the four labeling interfaces;
* :mod:`~annotation.labelstudio.render`: steps and screens as HTML for annotators;
* :mod:`~annotation.labelstudio.selection`: candidates and active selection under a budget shared by episode source;
* :mod:`~annotation.labelstudio.queue`: the items of each interface (step views, pre-annotations, milestones);
* :mod:`~annotation.labelstudio.push`: idempotent bulk push;
* :mod:`~annotation.labelstudio.sync`: snapshot export -> ``human_labels``, by annotation id;
* :mod:`~annotation.labelstudio.sensor`: syncing every project, as the asset or one sensor tick;
* :mod:`~annotation.labelstudio.agreement`: Cohen's kappa, annotator statistics, training labels;
* :mod:`~annotation.labelstudio.reports` and :mod:`~annotation.labelstudio.plots`: report bodies and figures;
* :mod:`~annotation.labelstudio.reads`: reading the warehouse (the stage's edge);
* :mod:`~annotation.labelstudio.secrets` and :mod:`~annotation.labelstudio.audit`: keys, scrubbing, audits;
* :mod:`~annotation.labelstudio.banner`: what ``make annotate`` prints (login, the one command that queues work).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from annotation.labelstudio.client import (
        LabelStudioAuthError,
        LabelStudioClient,
        LabelStudioError,
        LabelStudioUnavailable,
    )
    from annotation.labelstudio.connection import connect, resolve_credentials
    from annotation.labelstudio.interfaces import INTERFACES, Interface, parse_result
    from annotation.labelstudio.secrets import Credentials, scrub
    from annotation.labelstudio.server import LocalLabelStudio

# Imported on first use, so that `python -m annotation.labelstudio ...` and the light modules (server,
# banner, selection) do not pay for the Label Studio SDK (seconds) unless they talk to a server.
_LAZY = {
    "INTERFACES": "interfaces",
    "Credentials": "secrets",
    "Interface": "interfaces",
    "LabelStudioAuthError": "client",
    "LabelStudioClient": "client",
    "LabelStudioError": "client",
    "LabelStudioUnavailable": "client",
    "LocalLabelStudio": "server",
    "connect": "connection",
    "parse_result": "interfaces",
    "resolve_credentials": "connection",
    "scrub": "secrets",
}
__all__ = [
    "INTERFACES",
    "Credentials",
    "Interface",
    "LabelStudioAuthError",
    "LabelStudioClient",
    "LabelStudioError",
    "LabelStudioUnavailable",
    "LocalLabelStudio",
    "connect",
    "parse_result",
    "resolve_credentials",
    "scrub",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
