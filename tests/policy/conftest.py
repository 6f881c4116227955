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
    for k, v in over.items():
        base[k] = v
    return spec_from_dict(base)
