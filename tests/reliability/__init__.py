"""The reliability suite (issue 14; marker ``chaos``): what spotrain was put through, and what held.

Each test records its figures with :func:`figures.record`; ``benchmarks/reliability.py`` runs the
suite and prints them as one table. ``docs/reliability.md`` describes every check.
"""
