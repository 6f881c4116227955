"""Workers on real cloud instances: the instance agent and its wire format with the controller.

The agent (``python -m cloud_providers.remote.agent --config PATH``) runs on every instance the
controller launches with ``--executor remote``. It asks the controller for its assignment, starts the
job's ranks with the same ``Gang`` the local agent uses, relays notices (the controller's directives and
the cloud's own spot/preemption notice) to the workers' notice file, and reports exits and rank 0's
progress back. The controller's side is ``autoscaler/remote/executor.py`` and ``autoscaler/remote/endpoints.py``.
"""

from __future__ import annotations

from .wire import ASSIGNMENT_PATH, REPORT_PATH

__all__ = ["ASSIGNMENT_PATH", "REPORT_PATH"]
