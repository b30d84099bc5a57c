"""Human labels in Label Studio: the server, the client, labeling interfaces, selection, push and sync.

Modules (no Dagster here; the stage module :mod:`annotation.human_labels` composes them, and
assets/human_labels.py declares its assets):

* :mod:`~annotation.labelstudio.server`: the project's own Label Studio (start, stop, admin token);
* :mod:`~annotation.labelstudio.connection`: which server to use (environment or the local one);
* :mod:`~annotation.labelstudio.client`: the SDK 2.x client with errors mapped to auth / unavailable / other;
* :mod:`~annotation.labelstudio.interfaces` and ``configs/``: the four labeling interfaces;
* :mod:`~annotation.labelstudio.render`: steps and screens as HTML for annotators;
* :mod:`~annotation.labelstudio.selection`: candidates and active selection under a budget;
* :mod:`~annotation.labelstudio.queue`: the items of each interface (step views, pre-annotations, milestones);
* :mod:`~annotation.labelstudio.push`: idempotent bulk push;
* :mod:`~annotation.labelstudio.sync`: snapshot export -> ``human_labels``, by annotation id;
* :mod:`~annotation.labelstudio.sensor`: syncing every project, as the asset or one sensor tick;
* :mod:`~annotation.labelstudio.agreement`: Cohen's kappa, annotator statistics, training labels;
* :mod:`~annotation.labelstudio.reports` and :mod:`~annotation.labelstudio.plots`: report bodies and figures;
* :mod:`~annotation.labelstudio.reads`: reading the warehouse (the stage's edge);
* :mod:`~annotation.labelstudio.secrets` and :mod:`~annotation.labelstudio.audit`: keys, scrubbing, audits.
"""

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
