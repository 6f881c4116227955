"""Market traces (DESIGN.md "Market trace"): a CSV of offering states over time.

Header: ``time_s,cloud,region,zone,instance_type,accelerator,gpus,spot_price,on_demand_price,spot_available``.
A row gives one offering's state from ``time_s`` (seconds from trace start) until that offering's next
row. Past the last row an offering keeps its last state. An empty ``spot_price`` means no spot market.

The same parsed trace drives the local cloud (in compressed real time) and the simulator (in virtual
time), so the two see exactly the same market.

Size limits (issue 21, finding 12; docs/formats.md): a trace file is a regular file of at most
``MAX_TRACE_BYTES`` bytes and ``MAX_TRACE_ROWS`` data rows, each field at most ``MAX_FIELD_BYTES``;
anything beyond, a FIFO or a device is one :class:`TraceError` line naming the file (and the line).
Two months of 5-minute rows for 20 offerings are 350,000 rows; ``MAX_TRACE_ROWS`` parse in about 10 s.
"""

from __future__ import annotations

import bisect
import csv
import dataclasses
import io
import math
from collections.abc import Iterable, Iterator, Sequence
from importlib import resources
from pathlib import Path

from ..base import Offering
from ..catalog import NOTICE_SECONDS
from ..errors import ProviderError
from ..safe_files import FileRefused, read_text_file

HEADER = (
    "time_s",
    "cloud",
    "region",
    "zone",
    "instance_type",
    "accelerator",
    "gpus",
    "spot_price",
    "on_demand_price",
    "spot_available",
)
# Sanity bounds: GPUs per instance and spot instances per offering (a typo, not a market).
MAX_GPUS = 64
MAX_SPOT_AVAILABLE = 1_000_000
# Size bounds (docs/formats.md): past these a trace is not a market but a mistake or an attack.
MAX_TRACE_BYTES = 64 * 1024 * 1024
MAX_TRACE_ROWS = 500_000
MAX_FIELD_BYTES = 1024


class TraceError(ProviderError, ValueError):
    """The trace file is malformed; the message names the line and column."""


@dataclasses.dataclass(frozen=True)
class _Point:
    time_s: float
    spot_price: float | None
    on_demand_price: float
    spot_available: int


@dataclasses.dataclass
class _Series:
    cloud: str
    region: str
    zone: str
    instance_type: str
    accelerator: str
    gpus: int
    times: list[float]
    points: list[_Point]

    def at(self, t: float) -> _Point:
        i = bisect.bisect_right(self.times, t) - 1
        return self.points[max(i, 0)]


class MarketTrace:
    """A parsed market trace. ``offerings_at(t)`` gives every offering's state at trace time ``t``."""

    def __init__(self, series: Sequence[_Series]) -> None:
        if not series:
            raise TraceError("market trace has no rows")
        self._series = {self._key(s): s for s in series}
        self.duration_s = max(s.times[-1] for s in series)

    @staticmethod
    def _key(s: _Series) -> str:
        return f"{s.cloud}/{s.zone}/{s.instance_type}/{s.accelerator}:{s.gpus}"

    @property
    def keys(self) -> list[str]:
        return sorted(self._series)

    def change_times(self) -> list[float]:
        """Every time at which some offering's state changes, sorted (for event-driven simulation)."""
        return sorted({t for s in self._series.values() for t in s.times})

    def offering_at(self, key: str, t: float) -> Offering:
        s = self._series[key]
        p = s.at(t)
        return Offering(
            cloud=s.cloud,
            region=s.region,
            zone=s.zone,
            instance_type=s.instance_type,
            accelerator=s.accelerator,
            gpus=s.gpus,
            on_demand_price_usd_per_hour=p.on_demand_price,
            spot_price_usd_per_hour=p.spot_price,
            spot_available=p.spot_available if p.spot_price is not None else 0,
            notice_seconds=NOTICE_SECONDS.get(s.cloud, 120.0),
        )

    def offerings_at(self, t: float) -> list[Offering]:
        return [self.offering_at(k, t) for k in self.keys]

    def spot_price_integral_usd(self, key: str, start_s: float, end_s: float, *, market: str = "spot") -> float:
        """Cost in USD of holding one instance of ``key`` from ``start_s`` to ``end_s`` (trace time),
        integrating the piecewise-constant price: every billed second at that second's price."""
        if end_s <= start_s:
            return 0.0
        s = self._series[key]
        total = 0.0
        t = start_s
        i = max(bisect.bisect_right(s.times, t) - 1, 0)
        while t < end_s:
            nxt = s.times[i + 1] if i + 1 < len(s.times) else float("inf")
            seg_end = min(end_s, nxt)
            p = s.points[i]
            price = p.on_demand_price if market != "spot" else (p.spot_price if p.spot_price is not None else p.on_demand_price)
            total += price * (seg_end - t) / 3600.0
            t = seg_end
            i += 1
        return total

    # ----- parsing -----
    @classmethod
    def parse(cls, text: str, *, source: str = "trace") -> "MarketTrace":
        if len(text) > MAX_TRACE_BYTES:
            raise TraceError(f"{source}: larger than the limit of {MAX_TRACE_BYTES} bytes (docs/formats.md)")
        reader = csv.reader(io.StringIO(text))
        rows = _rows(reader, source)
        try:
            header = next(rows)
        except StopIteration:
            raise TraceError(f"{source}: empty file") from None
        if tuple(h.strip() for h in header) != HEADER:
            raise TraceError(f"{source}: line 1: header must be {','.join(HEADER)}")
        series: dict[str, _Series] = {}
        count = 0
        for row in rows:
            lineno = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            count += 1
            if count > MAX_TRACE_ROWS:
                raise TraceError(f"{source}: line {lineno}: more than {MAX_TRACE_ROWS} rows (the limit, docs/formats.md)")
            if len(row) != len(HEADER):
                raise TraceError(f"{source}: line {lineno}: expected {len(HEADER)} columns, got {len(row)}")
            rec = dict(zip(HEADER, (c.strip() for c in row)))
            for name in ("cloud", "region", "zone", "instance_type", "accelerator"):
                if not rec[name]:
                    raise TraceError(f"{source}: line {lineno}: {name} is empty")
            field = "time_s"
            try:
                t = float(rec["time_s"])
                field = "gpus"
                gpus = int(rec["gpus"])
                field = "spot_price"
                spot = float(rec["spot_price"]) if rec["spot_price"] else None
                field = "on_demand_price"
                od = float(rec["on_demand_price"])
                field = "spot_available"
                avail = int(rec["spot_available"]) if rec["spot_available"] else 0
            except ValueError:
                kind = "a whole number" if field in ("gpus", "spot_available") else "a number"
                raise TraceError(f"{source}: line {lineno}: {field} must be {kind} (got {rec[field]!r})") from None
            if not all(math.isfinite(x) for x in (t, od, spot if spot is not None else 1.0)):
                raise TraceError(f"{source}: line {lineno}: times and prices must be finite numbers")
            for name, value, low in (("time_s", t, 0.0), ("gpus", gpus, 1), ("on_demand_price", od, 1e-12),
                                     ("spot_available", avail, 0), ("spot_price", spot if spot is not None else 1.0, 1e-12)):
                if value < low:
                    bound = ">= 0" if low == 0 else "> 0"
                    raise TraceError(f"{source}: line {lineno}: {name} must be {bound} (got {rec[name]!r})")
            if gpus > MAX_GPUS or avail > MAX_SPOT_AVAILABLE:
                raise TraceError(f"{source}: line {lineno}: gpus (at most {MAX_GPUS}) or spot_available (at most "
                                 f"{MAX_SPOT_AVAILABLE}) out of range")
            s = _Series(rec["cloud"], rec["region"], rec["zone"], rec["instance_type"], rec["accelerator"], gpus, [], [])
            key = cls._key(s)
            s = series.setdefault(key, s)
            if s.times and t < s.times[-1]:
                raise TraceError(f"{source}: line {lineno}: time_s goes backwards for {key}")
            if s.times and t == s.times[-1]:
                s.points[-1] = _Point(t, spot, od, avail)
                continue
            s.times.append(t)
            s.points.append(_Point(t, spot, od, avail))
        return cls(list(series.values()))

    @classmethod
    def load(cls, path: str | Path) -> "MarketTrace":
        try:  # a regular file only: a FIFO or /dev/zero is refused, never waited on or read to the end
            text = read_text_file(path, max_bytes=MAX_TRACE_BYTES, what="market trace")
        except FileRefused as exc:
            raise TraceError(str(exc)) from None
        return cls.parse(text, source=str(path))

    @classmethod
    def bundled(cls) -> "MarketTrace":
        text = resources.files("cloud_providers.local").joinpath("data/market.csv").read_text()
        return cls.parse(text, source="bundled market.csv")


def _rows(reader: Iterator[list[str]], source: str) -> Iterator[list[str]]:
    """``reader``'s rows; a CSV error (a field over the csv module's limit, a NUL byte) or a field over
    ``MAX_FIELD_BYTES`` becomes one :class:`TraceError` line naming the line."""
    line = 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise TraceError(f"{source}: after line {line}: not a CSV row ({exc})") from None
        line = getattr(reader, "line_num", line)
        if any(len(c) > MAX_FIELD_BYTES for c in row):
            raise TraceError(f"{source}: line {line}: a field is longer than {MAX_FIELD_BYTES} characters")
        yield row


def write_trace(rows: Iterable[Sequence[object]]) -> str:
    """Render rows (in HEADER order) as trace CSV text."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(HEADER)
    for r in rows:
        w.writerow(r)
    return buf.getvalue()
