"""Put on PYTHONPATH of a ``meshsage`` subprocess so its unmodified discord.py talks to the
loopback fake (tests/fakes/fake_discord.py) on port $FAKE_DISCORD_PORT instead of discord.com.
Test-only; the product has no such switch."""

import os

_port = os.environ.get("FAKE_DISCORD_PORT")
if _port:
    import warnings

    import yarl

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # discord.py imports audioop
        import discord.gateway
        import discord.http

    discord.http.Route.BASE = f"http://127.0.0.1:{_port}/api/v10"
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(f"ws://127.0.0.1:{_port}/gateway")
