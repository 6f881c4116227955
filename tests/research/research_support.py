"""The job spec the research tests run (the policy tests' ``make_spec``)."""

from __future__ import annotations

from typing import Any

from autoscaler.jobs.spec import JobSpec, spec_from_dict


def make_spec(**over: Any) -> JobSpec:
    base: dict[str, Any] = {
        "name": "j",
        "run": "python train.py",
        "resources": {"accelerators": ["V100:1"], "clouds": ["aws", "gcp"]},
        "objective": {"deadline": "24h"},
        "simulate": {"work_gpu_hours": 19.2},
    }
    base.update(over)
    return spec_from_dict(base)
