"""The ``gs://`` checkpoint store, on the real google-cloud-storage client against the loopback GCS fake.

The first half is one store contract run over ``file://``, ``s3://`` (moto, in process) and ``gs://``
(``tests/gcp/fake_gcs.py`` reached through ``STORAGE_EMULATOR_HOST``): round trip and keep-N, the
manifest written last, every kind of damage detected with a fall back to the previous checkpoint,
readers that never delete, final weights, sharded states. Damage is done through the store's own
verbs, so the contract is the same for every store. The second half is what only GCS has: bit rot at
rest caught by the client's crc32c and then by the manifest's sha256, resumable uploads, list
pagination, transient errors retried, typed errors, and the one-line error without the SDK.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
import torch
from safetensors.torch import load as st_load

from runtime import CheckpointManager, make_store
from runtime.errors import CheckpointCorrupt, CheckpointError, StoreError
from runtime.store import GCS_CORRUPT_READ_ATTEMPTS, GcsStore, Store

from .fake_gcs import FakeGcs

pytestmark = pytest.mark.gcp

BUCKET = "ckpts"


@pytest.fixture(scope="module")
def gcs() -> Iterator[FakeGcs]:
    with FakeGcs() as fake:
        fake.create_bucket(BUCKET)
        yield fake


@pytest.fixture
def gcs_env(gcs: FakeGcs, monkeypatch: pytest.MonkeyPatch) -> FakeGcs:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
    for key in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"):
        monkeypatch.delenv(key, raising=False)
    return gcs


def _gs_uri() -> str:
    return f"gs://{BUCKET}/team/{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.aws), "gs"])
def store_uri(request: pytest.FixtureRequest, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "file":
        yield f"file://{tmp_path}/job"
    elif request.param == "s3":
        moto = pytest.importorskip("moto")
        import boto3

        for key in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
            monkeypatch.delenv(key, raising=False)
        for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                           ("AWS_DEFAULT_REGION", "us-east-1")):
            monkeypatch.setenv(key, value)
        with moto.mock_aws():
            boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
            yield f"s3://{BUCKET}/team/job"
    else:
        request.getfixturevalue("gcs_env")
        yield _gs_uri()


def _state(step: int, n: int = 16) -> dict[str, Any]:
    torch.manual_seed(step)
    return {"model": {"w": torch.randn(n, 8), "b": torch.zeros(8, dtype=torch.bfloat16)},
            "opt": {"state": {0: {"step": torch.tensor(float(step))}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
            "pos": {"epoch": 1, "step": step}, "flags": torch.tensor([True, False])}


def _save(mgr: CheckpointManager, step: int, **state_kw: Any) -> None:
    mgr.persist_async(mgr.snapshot(step, _state(step, **state_kw), {"epoch": 1, "world_size": 2}))
    mgr.wait()


def _overwrite(store: Store, relpath: str, data: bytes) -> None:
    with store.writer(relpath) as f:
        f.write(data)


def _checkpoint_objects(store: Store) -> list[str]:
    return sorted(f"checkpoints/{step}/{name}" for step in store.list_dir("checkpoints")
                  for name in store.list_dir(f"checkpoints/{step}"))


# ----------------------------------------------------------------- the contract, over every store


def test_round_trip_keep_n_and_only_complete_objects(store_uri: str) -> None:
    store = make_store(store_uri)
    mgr = CheckpointManager(store, keep=2)
    for step in (5, 10, 15):
        _save(mgr, step)
    assert mgr.steps() == [10, 15]
    files = ("manifest.json", "state.safetensors")
    assert _checkpoint_objects(store) == [f"checkpoints/{s}/{f}" for s in (10, 15) for f in files]
    loaded = CheckpointManager(make_store(store_uri), keep=2).load_latest()
    assert loaded is not None and loaded.step == 15
    assert torch.equal(loaded.state["model"]["w"], _state(15)["model"]["w"])
    assert loaded.state["opt"]["state"][0]["step"].item() == 15.0 and loaded.state["flags"].tolist() == [True, False]
    manifest = json.loads(store.read_bytes("checkpoints/15/manifest.json"))
    assert manifest["step"] == 15 and len(manifest["files"]["state.safetensors"]["sha256"]) == 64


def test_a_checkpoint_without_its_manifest_is_incomplete(store_uri: str) -> None:
    store = make_store(store_uri)
    mgr = CheckpointManager(store, keep=3)
    _save(mgr, 1)
    _overwrite(store, "checkpoints/2/state.safetensors", b"partial")  # the writer died before the manifest
    loaded = mgr.load_latest()
    assert loaded is not None and loaded.step == 1
    with pytest.raises(CheckpointCorrupt, match="no manifest"):
        mgr.load(2)


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "manifest-json", "manifest-edit", "missing-file"])
def test_damaged_newest_falls_back_to_previous_and_is_set_aside(store_uri: str, damage: str) -> None:
    store = make_store(store_uri)
    mgr = CheckpointManager(store, keep=3)
    _save(mgr, 1)
    _save(mgr, 2)
    state_file, manifest_file = "checkpoints/2/state.safetensors", "checkpoints/2/manifest.json"
    data = store.read_bytes(state_file)
    if damage == "truncate":
        _overwrite(store, state_file, data[: len(data) // 2])
    elif damage == "flip":
        flipped = bytearray(data)
        flipped[-3] ^= 0x01
        _overwrite(store, state_file, bytes(flipped))
    elif damage == "garbage":
        _overwrite(store, state_file, b"garbage")
    elif damage == "manifest-json":
        _overwrite(store, manifest_file, b'{"step": 2, "form')
    elif damage == "manifest-edit":  # still valid JSON: only its own sha256 can tell
        m = json.loads(store.read_bytes(manifest_file))
        m["epoch"] = 9
        _overwrite(store, manifest_file, json.dumps(m).encode())
    else:  # a sound manifest whose state file is gone
        manifest = store.read_bytes(manifest_file)
        store.delete_tree("checkpoints/2")
        _overwrite(store, manifest_file, manifest)
    with pytest.raises(CheckpointCorrupt):
        mgr.load(2)
    loaded = mgr.load_latest()
    assert loaded is not None and loaded.step == 1
    assert torch.equal(loaded.state["model"]["w"], _state(1)["model"]["w"])
    assert mgr.steps() == [1]
    assert store.read_bytes("checkpoints/2/CORRUPT").decode().startswith("checkpoint 2:")
    assert store.exists(manifest_file)  # set aside, not deleted


def _manifest_of(mgr: CheckpointManager, step: int) -> str:
    return mgr.store.read_bytes(f"checkpoints/{step}/manifest.json").decode()


def test_a_reader_never_writes_and_all_corrupt_means_a_fresh_start(store_uri: str) -> None:
    store = make_store(store_uri)
    _save(CheckpointManager(store, keep=3), 3)
    _overwrite(store, "checkpoints/3/state.safetensors", b"x")
    reader = CheckpointManager(make_store(store_uri), keep=3, writer=False)
    assert reader.load_latest() is None
    assert reader.steps() == [3] and not store.exists("checkpoints/3/CORRUPT")


def test_final_weights_uri_and_contents(store_uri: str) -> None:
    store = make_store(store_uri)
    url = CheckpointManager(store, keep=1).write_final({"w": torch.arange(4.0)})
    assert url == f"{store_uri}/final/model.safetensors"
    assert torch.equal(st_load(store.read_bytes("final/model.safetensors"))["w"], torch.arange(4.0))


def test_store_verbs(store_uri: str) -> None:
    store = make_store(store_uri)
    _overwrite(store, "a/b/c.bin", b"1")
    _overwrite(store, "a/d.bin", b"22")
    assert store.list_dir("a") == ["b", "d.bin"] and store.list_dir("a/b") == ["c.bin"]
    assert store.list_dir("nothing-here") == []
    assert store.exists("a/d.bin") and not store.exists("a/e.bin")
    assert store.read_bytes("a/d.bin") == b"22"
    buffer, sha = store.read_hashed("a/d.bin")
    assert buffer.tolist() == [50, 50] and len(sha) == 64
    with pytest.raises(FileNotFoundError):
        store.read_bytes("a/e.bin")
    with pytest.raises(FileNotFoundError):
        store.read_hashed("a/e.bin")
    store.delete_tree("a")
    store.delete_tree("a")  # idempotent
    assert store.list_dir("a") == [] and not store.exists("a/d.bin")


def test_a_sharded_state_round_trips(store_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import runtime.serialization as serialization

    monkeypatch.setattr(serialization, "MIN_SHARD_BYTES", 64 << 10)  # split a 512 KiB state
    mgr = CheckpointManager(make_store(store_uri), keep=1)
    _save(mgr, 7, n=16384)
    files = json.loads(_manifest_of(mgr, 7))["files"]
    assert len(files) >= 2 and all(name.startswith("state-0000") for name in files)
    loaded = CheckpointManager(make_store(store_uri), keep=1).load_latest()
    assert loaded is not None and torch.equal(loaded.state["model"]["w"], _state(7, n=16384)["model"]["w"])


# ----------------------------------------------------------------- what only gs:// has


def _gs_store(gcs: FakeGcs, **kw: Any) -> tuple[GcsStore, str]:
    uri = _gs_uri()
    store = GcsStore(BUCKET, uri.removeprefix(f"gs://{BUCKET}/"), **kw)
    return store, uri.removeprefix(f"gs://{BUCKET}/")


def test_make_store_builds_a_gcs_store_without_contacting_anything() -> None:
    store = make_store("gs://bucket/team/job/")
    assert isinstance(store, GcsStore) and store.uri == "gs://bucket/team/job"
    assert store.url("final/model.safetensors") == "gs://bucket/team/job/final/model.safetensors"
    assert GcsStore("bucket", "").url("x") == "gs://bucket/x"
    with pytest.raises(ValueError, match="missing bucket"):
        make_store("gs:///job")


def test_bit_rot_at_rest_fails_crc32c_then_sha256_and_falls_back(gcs_env: FakeGcs) -> None:
    store, prefix = _gs_store(gcs_env)
    mgr = CheckpointManager(store, keep=3)
    _save(mgr, 1)
    _save(mgr, 2)
    gcs_env.corrupt(BUCKET, f"{prefix}/checkpoints/2/state.safetensors")  # bytes changed, stored crc32c not
    path = "/download/storage/v1/b/ckpts/o/" + quote(f"{prefix}/checkpoints/2/state.safetensors", safe="")
    before = gcs_env.count("GET", path)
    with pytest.raises(CheckpointCorrupt, match="sha256"):
        mgr.load(2)
    reads = gcs_env.count("GET", path) - before
    assert reads == GCS_CORRUPT_READ_ATTEMPTS + 1  # re-read while it might be a transfer fault, then judged
    loaded = mgr.load_latest()
    assert loaded is not None and loaded.step == 1 and mgr.steps() == [1]


def test_large_objects_go_up_as_resumable_uploads_in_chunks(gcs_env: FakeGcs) -> None:
    store, prefix = _gs_store(gcs_env, chunk_size_bytes=1 << 20)
    mgr = CheckpointManager(store, keep=1)
    _save(mgr, 3, n=300_000)  # 9.6 MB: above the client's 8 MiB single-request limit
    name = f"{prefix}/checkpoints/3/state.safetensors"
    sessions = [q for m, p, q in gcs_env.requests if m == "POST" and "uploadType=resumable" in q]
    chunks = [q for m, p, q in gcs_env.requests if m == "PUT" and "upload_id=" in q]
    assert len(sessions) == 1 and len(chunks) == 10
    assert len(gcs_env.get(BUCKET, name)) > 8 << 20
    loaded = CheckpointManager(GcsStore(BUCKET, prefix), keep=1).load_latest()
    assert loaded is not None and torch.equal(loaded.state["model"]["w"], _state(3, n=300_000)["model"]["w"])


def test_listing_follows_pages(gcs_env: FakeGcs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gcs_env, "page_size", 2)
    store, _ = _gs_store(gcs_env)
    mgr = CheckpointManager(store, keep=10)
    for step in range(1, 8):
        _save(mgr, step)
    assert mgr.steps() == list(range(1, 8))
    assert len(store.list_dir("checkpoints/3")) == 2
    store.delete_tree("checkpoints")
    assert store.list_dir("checkpoints") == []


def test_pruning_deletes_the_listed_generation_only(gcs_env: FakeGcs) -> None:
    store, prefix = _gs_store(gcs_env)
    mgr = CheckpointManager(store, keep=1)
    _save(mgr, 1)
    _save(mgr, 2)
    deletes = [q for m, p, q in gcs_env.requests if m == "DELETE" and quote(f"{prefix}/checkpoints/1/", safe="") in p]
    assert len(deletes) == 2 and all("ifGenerationMatch=" in q for q in deletes)
    assert gcs_env.names(BUCKET, f"{prefix}/checkpoints/1/") == []


def test_transient_errors_are_retried_by_the_client(gcs_env: FakeGcs) -> None:
    store, prefix = _gs_store(gcs_env)
    gcs_env.fail_next(1, 503, match="POST /upload/")
    gcs_env.fail_next(1, 429, match=f"GET /storage/v1/b/{BUCKET}/o")
    mgr = CheckpointManager(store, keep=2)
    _save(mgr, 1)
    assert mgr.steps() == [1]
    assert gcs_env.count("POST", "/upload/") >= 3  # the failed one, then state and manifest


def test_errors_are_typed(gcs_env: FakeGcs) -> None:
    missing = GcsStore("no-such-bucket", "job")
    with pytest.raises(StoreError, match="no-such-bucket"):
        missing.list_dir("checkpoints")
    with pytest.raises(StoreError, match="cannot upload gs://no-such-bucket/job/x"):
        _overwrite(missing, "x", b"1")
    store, _ = _gs_store(gcs_env)
    gcs_env.fail_next(1, 403, match="POST /upload/")
    mgr = CheckpointManager(store, keep=2)
    mgr.persist_async(mgr.snapshot(1, _state(1), {}))
    with pytest.raises(CheckpointError, match="persist failed.*403"):
        mgr.wait()
    gcs_env.fail_next(1, 403, match="GET /download/")
    _overwrite(store, "y", b"1")
    with pytest.raises(StoreError, match="cannot read"):
        store.read_bytes("y")


def test_without_the_sdk_a_gs_store_is_one_line_naming_the_extra() -> None:
    code = (
        "import sys; sys.modules['google.cloud.storage'] = None\n"
        "from runtime import make_store\n"
        "from runtime.errors import UnsupportedStore\n"
        "try:\n    make_store('gs://bucket/job')\n"
        "except UnsupportedStore as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert "\n" not in line and "pip install 'spotrain[gcp]'" in line and "gs://bucket/job" in line
