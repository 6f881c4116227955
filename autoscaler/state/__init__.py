"""Persistent controller state (SQLAlchemy; SQLite by default)."""

from __future__ import annotations

from .models import TERMINAL, Decision, Event, InstanceRow, Job, JobState
from .store import Store

__all__ = ["TERMINAL", "Decision", "Event", "InstanceRow", "Job", "JobState", "Store"]
