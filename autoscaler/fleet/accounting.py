"""Money is data: per-instance billing rolled up into jobs, and the market history the policy learns from.

Costs come from the provider's own billing (every billed second at that second's price, in the
provider's clock). The on-demand counterfactual of a job prices the same billed seconds of the same
offerings at their on-demand price: what holding that hardware on-demand would have cost.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from autoscaler.policy import MarketHistory
from autoscaler.state import InstanceRow, Job
from cloud_providers.base import SPOT, Instance, InstanceState, Provider


def row_to_instance(row: InstanceRow) -> Instance:
    """The instance as the provider reported it at launch (region and tags included: providers bill
    from them), with the state the controller has recorded since."""
    parts = row.offering_key.split("/")
    try:
        tags = json.loads(row.tags_json or "{}")
    except ValueError:
        tags = {}
    return Instance(
        instance_id=row.instance_id,
        cloud=row.cloud,
        region=row.region,
        zone=parts[1] if len(parts) > 1 else "",
        instance_type=parts[2] if len(parts) > 2 else "",
        market=row.market,
        state=InstanceState(row.state),
        tags=tags if isinstance(tags, dict) else {},
        launched_at_s=row.launched_at_s,
        terminated_at_s=row.terminated_at_s,
        interruption=row.interruption,
        offering_key=row.offering_key,
    )


def update_billing(provider: Provider, rows: Iterable[InstanceRow]) -> tuple[float, float]:
    """Refresh each row's billed seconds and cost; return the job's (cost_usd, on_demand_cost_usd)."""
    cost = od = 0.0
    for row in rows:
        b = provider.billing(row_to_instance(row))
        # Billing never goes backwards (a terminated instance's bill is final).
        row.billed_seconds = max(row.billed_seconds, b.billed_seconds)
        row.cost_usd = max(row.cost_usd, b.cost_usd)
        row.on_demand_cost_usd = max(row.on_demand_cost_usd, b.on_demand_cost_usd)
        cost += row.cost_usd
        od += row.on_demand_cost_usd
    return cost, od


def bill_job(provider: Provider, job: Job, rows: Iterable[InstanceRow]) -> None:
    """Refresh the job's bill: its instances' (``update_billing``) plus the egress its moves between
    regions and clouds were billed (issue 23), so ``cost_usd`` - and the hard budget - count both."""
    cost, job.on_demand_cost_usd = update_billing(provider, rows)
    job.cost_usd = cost + (job.egress_usd or 0.0)


def burn_rate_usd_per_hour(rows: Iterable[InstanceRow], prices: Mapping[str, tuple[float, float | None]]) -> float:
    """What the job's live instances cost per hour right now (prices: key -> (on-demand, spot))."""
    total = 0.0
    for row in rows:
        if row.state == InstanceState.TERMINATED.value:
            continue
        if row.offering_key not in prices:
            # An offering the cloud no longer lists (or not this tick): the instance still bills, at
            # what it has cost per second so far, or, before its first bill, at nothing better known.
            total += row.cost_usd / row.billed_seconds * 3600.0 if row.billed_seconds > 0 else 0.0
            continue
        total += instance_rate_usd_per_hour(row.market, prices[row.offering_key])
    return total


def instance_rate_usd_per_hour(market: str, price: tuple[float, float | None]) -> float:
    """What one instance in ``market`` bills per hour at ``price`` (on-demand, spot)."""
    od, spot = price
    return spot if market == SPOT and spot is not None else od


def holdings_burn_rate_usd_per_hour(holdings: Mapping[tuple[str, str], int],
                                    prices: Mapping[str, tuple[float, float | None]]) -> float:
    """``burn_rate_usd_per_hour`` of instance counts per (offering key, market), all of listed offerings
    (the simulator's fast path holds counts, not rows)."""
    return sum(n * instance_rate_usd_per_hour(m, prices[k]) for (k, m), n in holdings.items() if n > 0)


def history_from_totals(totals: Iterable[tuple[str, float, int]]) -> dict[str, MarketHistory]:
    """``market_history`` from per-offering totals the database summed (``Store.spot_history``)."""
    return {k: MarketHistory(k, held, pre) for k, held, pre in totals}


def market_history(rows: Iterable[InstanceRow]) -> dict[str, MarketHistory]:
    """Spot seconds held and preemptions seen per offering, over every instance this controller had."""
    held: dict[str, float] = {}
    pre: dict[str, int] = {}
    for row in rows:
        if row.market != SPOT:
            continue
        held[row.offering_key] = held.get(row.offering_key, 0.0) + row.billed_seconds
        if row.interruption:
            pre[row.offering_key] = pre.get(row.offering_key, 0) + 1
    return {k: MarketHistory(k, held[k], pre.get(k, 0)) for k in held}
