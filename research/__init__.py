"""Research code: tried, measured, not in the product (issue 22).

Outside the installed packages (``pyproject.toml`` installs ``autoscaler``, ``cloud_providers``,
``runtime`` and ``cost_models`` only); the benchmarks and the tests import it from a checkout.

- ``tracegen``: seeded synthetic spot markets (heavy-tailed available runs and outages per zone) that
  the benchmarks and tests run the policies on; ``spotrain simulate`` reads any trace CSV.
- ``online_dp``: the dynamic program over ``tracegen``'s market model that the two below solve.
- ``online_bound``: the best cost a policy that knows only the past can get, with the generator's
  true parameters (``benchmarks/online_bound.py``).
- ``planner``: a model-based decision rule with estimated parameters, tried for issue 15 and not
  kept (``benchmarks/planner.py``; README "Benchmarks").
"""
