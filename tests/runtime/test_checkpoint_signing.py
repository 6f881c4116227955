"""Regression tests of issue 21, finding 9: checkpoints are authenticated, not only checked for integrity.

Code that can write job B's store (job A's workers, on a shared bucket) used to be able to put a
checkpoint with B's id and matching hashes there, and B resumed from it. Now the controller issues each
job a key (``SPOTRAIN_CHECKPOINT_KEY``); B's workers sign their manifests with it and set aside, as
corrupt, one signed with another key or not signed at all, falling back to B's own previous one. The
trainers here are real (torch on CPU, world size 1) and are configured from the worker-protocol
environment, as on an instance. The forgery tests fail on the code before the fix (B resumed from the
forged step 4).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import runtime.checkpoint as checkpoint
from runtime import CheckpointManager, make_store

KEY_B = secrets.token_hex(32)
KEY_A = secrets.token_hex(32)


def _trainer(uri: str, job_id: str, max_steps: int, key: str | None) -> Any:
    from runtime import ElasticTrainer, TrainerConfig

    env = {"SPOTRAIN_JOB_ID": job_id, "SPOTRAIN_CHECKPOINT_URI": uri}
    if key is not None:
        env["SPOTRAIN_CHECKPOINT_KEY"] = key
    torch.manual_seed(0)
    config = TrainerConfig.from_env(env=env, max_steps=max_steps)
    model = torch.nn.Linear(2, 1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 2), torch.randn(64, 1))
    return ElasticTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), data,
                          loss_fn=lambda m, b: ((m(b[0]) - b[1]) ** 2).mean(), config=config)


def _train(uri: str, job_id: str, max_steps: int, key: str | None) -> int | None:
    """Train to ``max_steps`` and checkpoint there; the step it resumed from (None: from scratch)."""
    trainer = _trainer(uri, job_id, max_steps, key)
    try:
        for _ in trainer:
            pass
        trainer.checkpoint(wait=True)
        return trainer.resumed_from
    finally:
        trainer.close()


def _forge(source: Path, target: Path, step: int, *, owner: str, key: str | None) -> None:
    """Copy checkpoint ``step`` of ``source`` into ``target`` as if ``owner`` had written it: the job id
    rewritten, the manifest signed with ``key`` (the forger's own; None: unsigned) and rehashed. What
    code with write access to ``target``'s store, and only its own key, can do."""
    shutil.copytree(source / "checkpoints" / str(step), target / "checkpoints" / str(step))
    path = target / "checkpoints" / str(step) / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["job_id"] = owner
    manifest.pop("manifest_hmac_sha256", None)
    manifest.pop("manifest_sha256", None)
    if key is not None:
        digest = hashlib.sha256(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        manifest["manifest_hmac_sha256"] = hmac.new(bytes.fromhex(key), b"spotrain-manifest/1:" + digest.encode(),
                                                    hashlib.sha256).hexdigest()
    manifest["manifest_sha256"] = checkpoint._manifest_sha256(manifest)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("forger_key", [KEY_A, None], ids=["signed-with-another-jobs-key", "unsigned"])
def test_finding9_a_checkpoint_forged_into_job_bs_path_is_set_aside(tmp_path: Path, forger_key: str | None) -> None:
    """Job A (its own key, or none) trains to step 4 in its own directory and plants that checkpoint,
    with B's id and valid hashes, in B's directory above B's own step 2. B's worker, with B's key,
    refuses it as corrupt (marked, kept as evidence) and resumes from its own step 2."""
    uri_a, uri_b = f"file://{tmp_path}/job-a", f"file://{tmp_path}/job-b"
    assert _train(uri_b, "job-b", 2, KEY_B) is None
    assert _train(uri_a, "job-a", 4, forger_key) is None
    _forge(tmp_path / "job-a", tmp_path / "job-b", 4, owner="job-b", key=forger_key)
    assert _train(uri_b, "job-b", 3, KEY_B) == 2  # to step 3: pruning keeps the forged step 4 (newer)
    marker = (tmp_path / "job-b/checkpoints/4/CORRUPT").read_text()
    assert ("not signed" if forger_key is None else "does not verify") in marker, marker
    assert KEY_B not in marker and KEY_A not in marker


def test_finding9_the_jobs_own_signed_checkpoints_resume(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/job-b"
    assert _train(uri, "job-b", 2, KEY_B) is None
    manifest = json.loads((tmp_path / "job-b/checkpoints/2/manifest.json").read_text())
    assert len(manifest["manifest_hmac_sha256"]) == 64
    assert _train(uri, "job-b", 4, KEY_B) == 2
    assert not (tmp_path / "job-b/checkpoints/2/CORRUPT").exists()


def test_finding9_without_a_key_checkpoints_stay_unsigned_and_resume(tmp_path: Path) -> None:
    """Runs without a controller (no key) keep working as before, unsigned."""
    uri = f"file://{tmp_path}/local"
    assert _train(uri, "local", 2, None) is None
    assert "manifest_hmac_sha256" not in json.loads((tmp_path / "local/checkpoints/2/manifest.json").read_text())
    assert _train(uri, "local", 4, None) == 2


def test_finding9_with_a_key_an_unsigned_checkpoint_of_the_same_job_is_refused(tmp_path: Path) -> None:
    """The documented choice (docs/formats.md): with a key, unsigned is refused even with the job's id,
    since a forger could always leave the signature out. A job gets a key from its submit on, so its
    own checkpoints are all signed; a job submitted before keys has no key and stays unsigned."""
    uri = f"file://{tmp_path}/job-b"
    assert _train(uri, "job-b", 2, None) is None
    assert _train(uri, "job-b", 1, KEY_B) is None  # to step 1: pruning keeps the refused (newer) step 2
    assert "not signed" in (tmp_path / "job-b/checkpoints/2/CORRUPT").read_text()


def test_finding9_an_edited_signature_is_refused_and_the_prefetch_is_checked_too(tmp_path: Path) -> None:
    """A read ahead (``prefetch_latest``, which has no key) does not let a forged checkpoint through."""
    root = tmp_path / "job-b"
    mgr = CheckpointManager(make_store(f"file://{root}"), keep=3, job_id="job-b", signing_key=bytes.fromhex(KEY_B))
    for step in (1, 2):
        mgr.persist(mgr.snapshot(step, {"w": torch.full((4,), float(step))}, {"job_id": "job-b"}))
    path = root / "checkpoints/2/manifest.json"
    manifest = json.loads(path.read_text())
    manifest["manifest_hmac_sha256"] = "0" * 64
    path.write_text(json.dumps(manifest))
    checkpoint.prefetch_latest(mgr.store)
    loaded = CheckpointManager(mgr.store, keep=3, job_id="job-b", signing_key=bytes.fromhex(KEY_B)).load_latest()
    assert loaded is not None and loaded.step == 1 and loaded.state["w"][0].item() == 1.0
    assert (root / "checkpoints/2/CORRUPT").exists()


def test_finding9_the_key_is_not_in_the_configs_repr() -> None:
    from runtime import TrainerConfig

    config = TrainerConfig.from_env(env={"SPOTRAIN_CHECKPOINT_URI": "file:///tmp/x/j", "SPOTRAIN_CHECKPOINT_KEY": KEY_B},
                                     max_steps=1)
    assert config.checkpoint.signing_key == bytes.fromhex(KEY_B)
    assert KEY_B not in repr(config) and KEY_B not in str(config.checkpoint)
    with pytest.raises(ValueError) as err:
        TrainerConfig.from_env(env={"SPOTRAIN_CHECKPOINT_URI": "file:///tmp/x/j", "SPOTRAIN_CHECKPOINT_KEY": "zz" * 20},
                               max_steps=1)
    assert "zz" not in str(err.value)
    assert os.environ.get("SPOTRAIN_CHECKPOINT_KEY") is None
