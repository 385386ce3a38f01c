"""``dispatcher console``: a web page over every queue, its dead letters and its limits.

One aiohttp process serves hand-written HTML, CSS and JavaScript shipped in
the package (``static/``: no build step, no CDN, works offline) and a small
JSON API. The reads (``sampler.py`` for what the page polls, ``views.py`` for
pages of dead letters and a run's tasks) reuse what ``dispatcher status``
reads; every action (``actions.py``) calls the very function its CLI command
calls. Actions need the console's token and pass CSRF checks (``guard.py``);
without a token the console is read-only.
"""

from __future__ import annotations

from dispatcher.console.app import ConsoleConfig, build_app, serve

__all__ = ["ConsoleConfig", "build_app", "serve"]
