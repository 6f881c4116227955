"""``spotrain dashboard``: a one-time login link to the running controller's dashboard (issue 24, item 5).

The CLI holds the API token, so it asks the controller for a link (``POST /v1/dashboard/links``)
instead of the user pasting the token into a form: the link logs a browser in once, within a couple
of minutes (``server/login_links.py``). The link is printed alone on stdout (for scripts and
copy-paste), what it is on stderr; ``--open`` also hands it to the system's browser (Python's
``webbrowser``, which honours ``$BROWSER``).
"""

from __future__ import annotations

import click


@click.command("dashboard")
@click.option("--open", "open_browser", is_flag=True, help="Open the link in the web browser as well.")
def command(open_browser: bool) -> None:
    """Print a one-time login link to the running controller's dashboard (valid once, for 2 minutes)."""
    from autoscaler.client.http import Client

    from .jobs import _require_controller

    _require_controller()
    client = Client()
    url, ttl_s = client.login_link()
    click.echo(url)
    click.echo(f"spotrain: a one-time login link to the dashboard of the controller at {client.url}: it logs in "
               f"once, within {ttl_s:g} s; run `spotrain dashboard` again for another", err=True)
    if open_browser:
        import webbrowser

        if not webbrowser.open(url):
            click.echo("spotrain: no web browser could be opened here; open the link above in one", err=True)
