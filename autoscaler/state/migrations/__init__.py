"""The state database's Alembic migrations (``versions/``), run by ``autoscaler/state/migrate.py`` when a
Store opens; no alembic.ini: the script location is this package (``importlib.resources``). A new
revision: ``python -m autoscaler.state.migrations "what and why"``."""
