"""Transports: one module per platform behind the ``Transport`` Protocol in ``base``.

Only ``transports/meshtastic*.py`` imports meshtastic and only ``transports/discord*.py`` imports
discord; ``app.py`` imports an adapter module only when its config section is enabled.
"""
