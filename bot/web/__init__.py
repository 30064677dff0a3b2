"""The operator's web view and /metrics (``web:``), served by the bot on aiohttp.

``model`` gathers a snapshot from the running app, ``history`` keeps the last hour and day,
``charts``/``pages``/``prom`` render them, ``server`` serves and guards them, ``checks`` tells
what stops the view before anything starts. Imported only when ``web.enabled`` is set.
"""
