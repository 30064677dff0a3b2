"""meshsage: one responder and one memory behind Discord, Meshtastic and the console.

Importing this package does nothing: no config, no logging, no clients, no event loops.
"""

__version__ = "0.4.0"
