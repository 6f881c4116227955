"""The local cloud: instances are groups of local worker processes; the spot market is a trace.

The market trace (DESIGN.md format) runs time-compressed: market time = offset + wall seconds since
the cloud was created x ``time_scale``. Prices, availability, notices and billing all follow market
time, so a two-minute run at scale 60 bills two market hours at the trace's prices.

When an offering's ``spot_available`` drops below the number of spot instances held on it, the
surplus (newest first) gets the cloud's notice (AWS 120 s, GCP 30 s of market time) and is terminated
when the notice runs out. A scenario (``scenario.py``) adds scripted capacity caps and preemptions.

Like AWS and GCP, the cloud does not tell its user how much spot room an offering has: ``offerings()``
reports ``spot_available=None`` and the room shows only in what happens - a launch succeeds or raises
``CapacityUnavailable``, a held instance gets a notice. ``oracle=True`` (a scenario's ``oracle: true``,
the simulator's ``--oracle``) reports the trace's room as well, for research: the policy then knows
which offerings have room and since when, which no real cloud says.

The local machine needs a few real seconds to act on a notice however compressed the market is, so a
notice lasts at least ``min_notice_real_s`` of wall time (billing still follows the market clock).

A machine of a ``spotrain run``'s own cloud shuts itself down when that command is gone (``owner.py``);
``poll`` ends its bill at the moment it did, however much later a controller looks.

State (instances, launch decisions, the clock origin, fired scenario events) is a JSON file rewritten
atomically, so the cloud outlives a controller crash just as a real one would.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..base import SPOT, Billing, Instance, InstanceState, LaunchRequest, Offering
from ..errors import CapacityUnavailable, InvalidRequest
from .market import MarketTrace
from .scenario import Scenario

DEFAULT_TIME_SCALE = 60.0
DEFAULT_MIN_NOTICE_REAL_S = 3.0


class LocalProvider:
    name = "local"

    def __init__(
        self,
        *,
        root: str | Path | None,
        trace: MarketTrace | None = None,
        time_scale: float = DEFAULT_TIME_SCALE,
        start_offset_s: float = 0.0,
        scenario: Scenario | None = None,
        min_notice_real_s: float = DEFAULT_MIN_NOTICE_REAL_S,
        on_terminate: Callable[[str], None] | None = None,
        progress_of: Callable[[str], int | None] | None = None,
        clock: Callable[[], float] = time.time,
        min_billed_s: float = 0.0,
        stopped_at: Callable[[str], float | None] | None = None,
        oracle: bool = False,
    ) -> None:
        """``root``: where the cloud's state file lives (None: in memory only, for the simulator);
        ``clock``: the clock the market runs on (wall time, or the simulator's virtual clock);
        ``min_billed_s``: the least it bills a launch, as real clouds do (EC2: 60 s);
        ``stopped_at``: the wall time an instance's machine shut itself down, or None
        (``LocalExecutor.stopped_at``: its owner was gone, ``owner.py``); ``poll`` ends its bill then;
        ``oracle``: report each offering's spot room (the trace's), which real clouds do not."""
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        if min_billed_s < 0:
            raise ValueError("min_billed_s must be >= 0")
        self.min_billed_s = float(min_billed_s)
        self.oracle = bool(oracle)
        self.root = None if root is None else Path(root)
        if self.root is not None:
            self.root.mkdir(parents=True, exist_ok=True)
        self.trace = trace or MarketTrace.bundled()
        self.scenario = scenario or Scenario()
        self.min_notice_real_s = min_notice_real_s
        self._on_terminate = on_terminate
        self._progress_of = progress_of
        self._stopped_at = stopped_at
        self._clock = clock
        self._lock = threading.RLock()
        self._path = None if self.root is None else self.root / "cloud.json"
        self._state = self._load()
        if not self._state:
            self._state = {
                "t0_wall": self._clock(),
                "time_scale": float(time_scale),
                "offset_s": float(start_offset_s),
                "counter": 0,
                "instances": {},
                "decisions": {},
                "fired": [],
                "caps": {},
                "unreported": [],
            }
            self._save()
        self.time_scale = float(self._state["time_scale"])

    # ----- persistence -----
    def _load(self) -> dict[str, Any]:
        if self._path is None:
            return {}
        try:
            state: dict[str, Any] = json.loads(self._path.read_text())
            return state
        except (OSError, ValueError):
            return {}

    def _save(self) -> None:
        if self._path is None:
            return
        tmp = self._path.with_name("cloud.json.tmp")
        tmp.write_text(json.dumps(self._state))
        os.replace(tmp, self._path)

    # ----- clock -----
    def now_s(self) -> float:
        st = self._state
        if self.time_scale == 1.0 and st["offset_s"] == st["t0_wall"]:
            # The clock is the market's own (the simulator's virtual clock): exactly, so a change in
            # the trace is seen at its very time.
            return float(self._clock())
        return float(st["offset_s"] + (self._clock() - st["t0_wall"]) * self.time_scale)

    def real_elapsed_s(self) -> float:
        return float(self._clock() - self._state["t0_wall"])

    def next_event_s(self) -> float:
        """The next market-clock time at which the cloud acts on its own (a notice that runs out);
        the simulator's loop wakes the controller then. Market changes come from the trace."""
        due = [r["notice_deadline_wall"] for r in self._state["instances"].values()
               if r["state"] == InstanceState.NOTICE.value and r.get("notice_deadline_wall") is not None]
        if not due:
            return float("inf")
        return float(self._state["offset_s"] + (min(due) - self._state["t0_wall"]) * self.time_scale)

    # ----- offerings -----
    def offerings(self) -> Sequence[Offering]:
        offers = self.trace.offerings_at(self.now_s())
        if self.oracle:
            return offers
        # As a real cloud: prices (spot price history is public), not room.
        return [o if o.spot_available is None else dataclasses.replace(o, spot_available=None) for o in offers]

    def _offering(self, key: str) -> Offering:
        try:
            return self.trace.offering_at(key, self.now_s())
        except KeyError:
            raise InvalidRequest(f"no such offering {key!r} in the local cloud", cloud="local") from None

    # ----- instances -----
    def _to_instance(self, rec: Mapping[str, Any]) -> Instance:
        return Instance(
            instance_id=rec["instance_id"],
            cloud=rec["cloud"],
            region=rec["region"],
            zone=rec["zone"],
            instance_type=rec["instance_type"],
            market=rec["market"],
            state=InstanceState(rec["state"]),
            tags=dict(rec["tags"]),
            launched_at_s=rec["launched_at_s"],
            terminated_at_s=rec.get("terminated_at_s"),
            interruption=rec.get("interruption"),
            notice_deadline_s=rec.get("notice_deadline_s"),
            offering_key=rec["offering_key"],
        )

    def _alive_spot(self, *, offering_key: str | None = None, job: str | None = None) -> list[dict[str, Any]]:
        out = []
        for rec in self._state["instances"].values():
            if rec["market"] != SPOT or rec["state"] in ("terminated", "notice"):
                continue
            if offering_key is not None and rec["offering_key"] != offering_key:
                continue
            if job is not None and rec["tags"].get("spotrain-job") != job:
                continue
            out.append(rec)
        return sorted(out, key=lambda r: (r["launched_at_s"], r.get("seq", 0)))

    def _job_cap(self) -> int | None:
        caps = self._state.get("caps", {})
        return caps.get("spot") if caps else None

    def launch(self, request: LaunchRequest) -> Instance:
        with self._lock:
            existing = self._state["decisions"].get(request.decision_id)
            if existing is not None:
                return self._to_instance(self._state["instances"][existing])
            o = self._offering(request.offering.key)
            if request.market == SPOT:
                if o.spot_price_usd_per_hour is None:
                    raise InvalidRequest(f"{o.key} has no spot market", cloud=o.cloud, zone=o.zone, instance_type=o.instance_type)
                held = len(self._alive_spot(offering_key=o.key))
                job = request.tags.get("spotrain-job")
                cap = self._job_cap()
                if held >= (o.spot_available or 0) or (
                    cap is not None and len(self._alive_spot(job=job)) >= cap
                ):
                    raise CapacityUnavailable(
                        f"no spot capacity for {o.instance_type} in {o.zone}",
                        cloud=o.cloud, region=o.region, zone=o.zone, instance_type=o.instance_type,
                    )
            self._state["counter"] += 1
            # Ids are unique across local clouds (each `spotrain run` has its own), like a real cloud's.
            iid = f"i-{secrets.token_hex(8)}"
            rec = {
                "instance_id": iid,
                "seq": self._state["counter"],
                "cloud": o.cloud,
                "region": o.region,
                "zone": o.zone,
                "instance_type": o.instance_type,
                "offering_key": o.key,
                "market": request.market,
                "state": InstanceState.RUNNING.value,
                "tags": dict(request.tags),
                "launched_at_s": self.now_s(),
                "terminated_at_s": None,
                "interruption": None,
                "notice_deadline_s": None,
                "notice_deadline_wall": None,
            }
            self._state["instances"][iid] = rec
            self._state["decisions"][request.decision_id] = iid
            self._save()
            return self._to_instance(rec)

    def _kill(self, rec: dict[str, Any]) -> None:
        rec["state"] = InstanceState.TERMINATED.value
        rec["terminated_at_s"] = self.now_s()
        if self._on_terminate is not None:
            self._on_terminate(rec["instance_id"])

    def terminate(self, instance_id: str) -> None:
        with self._lock:
            rec = self._state["instances"].get(instance_id)
            if rec is None or rec["state"] == InstanceState.TERMINATED.value:
                if self._on_terminate is not None:
                    self._on_terminate(instance_id)
                return
            self._kill(rec)
            # A poll reports every change once, including the ones the controller asked for.
            self._state.setdefault("unreported", []).append(instance_id)
            self._save()

    def list_instances(self, tags: Mapping[str, str]) -> Sequence[Instance]:
        with self._lock:
            return [
                self._to_instance(r)
                for r in self._state["instances"].values()
                if all(r["tags"].get(k) == v for k, v in tags.items())
            ]

    def get(self, instance_id: str) -> Instance | None:
        rec = self._state["instances"].get(instance_id)
        return None if rec is None else self._to_instance(rec)

    # ----- the market's own moves -----
    def _give_notice(self, rec: dict[str, Any], reason: str, changed: dict[str, dict[str, Any]]) -> None:
        notice_s = self._offering(rec["offering_key"]).notice_seconds
        rec["state"] = InstanceState.NOTICE.value
        rec["interruption"] = reason
        rec["notice_deadline_s"] = self.now_s() + notice_s
        rec["notice_deadline_wall"] = self._clock() + max(notice_s / self.time_scale, self.min_notice_real_s)
        changed[rec["instance_id"]] = rec

    def poll(self) -> Sequence[Instance]:
        with self._lock:
            changed: dict[str, dict[str, Any]] = {}
            for iid in self._state.get("unreported", []):
                if iid in self._state["instances"]:
                    changed[iid] = self._state["instances"][iid]
            self._state["unreported"] = []
            wall = self._clock()
            # 0. Machines that shut themselves down (their owner was gone): billed until they did.
            self._shut_down_on_their_own(changed)
            # 1. Notices that ran out: the cloud takes the machine back.
            for rec in self._state["instances"].values():
                if rec["state"] == InstanceState.NOTICE.value and wall >= rec["notice_deadline_wall"]:
                    self._kill(rec)
                    # The cloud took it back when the notice ran out, even if nobody polled then (a
                    # controller that was down): the bill ends at that moment.
                    due_s = self._state["offset_s"] + (rec["notice_deadline_wall"] - self._state["t0_wall"]) * self.time_scale
                    rec["terminated_at_s"] = min(rec["terminated_at_s"], due_s)
                    changed[rec["instance_id"]] = rec
            # 2. Scripted scenario events.
            fired = set(self._state["fired"])
            for ev in self.scenario.events:
                if ev.index in fired:
                    continue
                due = False
                if ev.at_real_s is not None:
                    due = self.real_elapsed_s() >= ev.at_real_s
                elif ev.at_step is not None and self._progress_of is not None:
                    jobs = {r["tags"].get("spotrain-job") for r in self._state["instances"].values()}
                    due = any((self._progress_of(j) or -1) >= ev.at_step for j in jobs if j)
                if not due:
                    continue
                self._state["fired"].append(ev.index)
                if ev.spot_capacity is not None:
                    self._state["caps"] = {"spot": ev.spot_capacity}
                if ev.preempt is not None:
                    victims = self._alive_spot()[::-1][: ev.preempt]
                    for rec in victims:
                        self._give_notice(rec, "scenario-preemption", changed)
            # 3. Capacity caps of the scenario, per job.
            cap = self._job_cap()
            if cap is not None:
                jobs = {r["tags"].get("spotrain-job") for r in self._alive_spot()}
                for j in jobs:
                    held = self._alive_spot(job=j)
                    for rec in held[::-1][: max(0, len(held) - cap)]:
                        self._give_notice(rec, "spot-capacity", changed)
            # 4. The market trace: availability below what is held preempts the newest surplus.
            t = self.now_s()
            for key in {r["offering_key"] for r in self._alive_spot()}:
                avail = self.trace.offering_at(key, t).spot_available or 0
                held = self._alive_spot(offering_key=key)
                for rec in held[::-1][: max(0, len(held) - avail)]:
                    self._give_notice(rec, "spot-market", changed)
            self._save()
            return [self._to_instance(r) for r in changed.values()]

    def _market_s_at(self, wall_s: float) -> float:
        return float(self._state["offset_s"] + (wall_s - self._state["t0_wall"]) * self.time_scale)

    def _shut_down_on_their_own(self, changed: dict[str, dict[str, Any]]) -> None:
        if self._stopped_at is None:
            return
        for rec in self._state["instances"].values():
            if rec["state"] == InstanceState.TERMINATED.value:
                continue
            wall_s = self._stopped_at(rec["instance_id"])
            if wall_s is None:
                continue
            self._kill(rec)
            rec["terminated_at_s"] = max(rec["launched_at_s"], min(rec["terminated_at_s"], self._market_s_at(wall_s)))
            changed[rec["instance_id"]] = rec

    def billing(self, instance: Instance) -> Billing:
        rec = self._state["instances"].get(instance.instance_id)
        start = instance.launched_at_s if rec is None else rec["launched_at_s"]
        end_raw = instance.terminated_at_s if rec is None else rec.get("terminated_at_s")
        end = end_raw if end_raw is not None else self.now_s()
        if end_raw is not None and self.min_billed_s:
            end = max(end, start + self.min_billed_s)  # the cloud bills a launch at least its minimum
        key = instance.offering_key
        cost = self.trace.spot_price_integral_usd(key, start, end, market=instance.market)
        od = self.trace.spot_price_integral_usd(key, start, end, market="on-demand")
        return Billing(billed_seconds=max(0.0, end - start), cost_usd=cost, on_demand_cost_usd=od)
