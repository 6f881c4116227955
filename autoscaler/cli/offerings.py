"""``spotrain offerings``: what can be bought, where, at what on-demand and spot price right now.

``--cloud local`` (the default) shows the local cloud's market: the bundled trace (or ``--trace``) at
its start, the prices and spot room a fresh ``spotrain run`` begins with. ``--cloud aws`` and
``--cloud gcp`` ask the cloud itself (its credentials from the environment, as the controller's; a
stand-in through ``AWS_ENDPOINT_URL`` or ``SPOTRAIN_GCP_ENDPOINT``): AWS's current spot prices, GCP's
list prices. Real clouds do not say how much spot room they have, so availability is ``-`` there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

CLOUDS = ("local", "aws", "gcp")


def _provider_offerings(cloud: str, trace_path: str | None) -> Sequence[Any]:
    from cloud_providers.errors import ProviderError

    from ..errors import SpotrainError

    if cloud == "local":
        from cloud_providers.local.market import MarketTrace

        try:
            trace = MarketTrace.load(trace_path) if trace_path else MarketTrace.bundled()
        except (OSError, ValueError) as exc:
            raise SpotrainError(f"--trace {trace_path}: {exc}") from None
        return trace.offerings_at(0.0)
    if trace_path:
        raise click.BadParameter("--trace is for --cloud local", param_hint="--trace")
    from autoscaler.fleet.clouds import _provider_factory

    try:
        provider = _provider_factory(cloud)(controller_id="spotrain-offerings")
        return provider.offerings()  # type: ignore[no-any-return]
    except ValueError as exc:  # a bad setting, or the cloud's SDK missing (names spotrain[aws])
        raise SpotrainError(f"{cloud}: {exc}") from None
    except ProviderError as exc:
        raise SpotrainError(f"{cloud}: cannot list offerings: {exc}") from None


def _row(o: Any) -> dict[str, Any]:
    spot = o.spot_price_usd_per_hour
    return {
        "key": o.key, "cloud": o.cloud, "region": o.region, "zone": o.zone, "instance_type": o.instance_type,
        "accelerator": o.accelerator, "gpus": o.gpus, "on_demand_usd_per_hour": o.on_demand_price_usd_per_hour,
        "spot_usd_per_hour": spot, "spot_available": o.spot_available,
        "spot_saving": None if spot is None or not o.on_demand_price_usd_per_hour else
        round(1 - spot / o.on_demand_price_usd_per_hour, 4),
        "notice_seconds": o.notice_seconds,
    }


def _table(rows: list[dict[str, Any]]) -> str:
    head = ("CLOUD", "ZONE", "INSTANCE TYPE", "GPUS", "ON-DEMAND $/h", "SPOT $/h", "SAVING", "SPOT ROOM")
    body = [(r["cloud"], r["zone"], r["instance_type"], f"{r['gpus']}x {r['accelerator']}",
             f"{r['on_demand_usd_per_hour']:.4f}", "-" if r["spot_usd_per_hour"] is None else f"{r['spot_usd_per_hour']:.4f}",
             "-" if r["spot_saving"] is None else f"{100 * r['spot_saving']:.0f}%",
             "-" if r["spot_available"] is None else str(r["spot_available"])) for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    return "\n".join(line.rstrip() for line in [fmt.format(*head)] + [fmt.format(*b) for b in body])


@click.command("offerings")
@click.option("--cloud", type=click.Choice(CLOUDS), default="local", show_default=True,
              help="local: the local cloud's market; aws, gcp: ask the cloud (credentials from the environment).")
@click.option("--accelerator", default=None, metavar="NAME", help="Only this accelerator (e.g. A100, T4).")
@click.option("--trace", "trace_path", default=None, metavar="CSV", help="The local cloud's market trace (default: bundled).")
@click.option("--json", "as_json", is_flag=True, help="Print the offerings as a JSON list.")
def offerings_command(cloud: str, accelerator: str | None, trace_path: str | None, as_json: bool) -> None:
    """List offerings with their current on-demand and spot prices and spot availability."""
    from cloud_providers import catalog

    from . import render

    wanted = None
    if accelerator:
        wanted = {a.upper(): a for a in catalog.ACCELERATORS}.get(accelerator.upper())
        if wanted is None:
            raise click.BadParameter(f"unknown accelerator {accelerator!r} (known: {', '.join(sorted(catalog.ACCELERATORS))})",
                                     param_hint="--accelerator")
    offers = [o for o in _provider_offerings(cloud, trace_path) if wanted is None or o.accelerator == wanted]
    rows = sorted((_row(o) for o in offers), key=lambda r: (r["accelerator"], r["gpus"], r["spot_usd_per_hour"] or 1e9,
                                                            r["on_demand_usd_per_hour"], r["key"]))
    if as_json:
        click.echo(render.as_json(rows))
        return
    if not rows:
        click.echo(f"no offerings on {cloud}" + (f" with {wanted}" if wanted else ""))
        return
    where = "the local cloud's market at its start" if cloud == "local" else f"{cloud}, now"
    click.echo(f"{len(rows)} offering(s) on {where} (prices per instance-hour)")
    click.echo(_table(rows))
