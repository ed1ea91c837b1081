"""Backends that speak the Responses API (`--upstream-api responses`): a sans-I/O decoder of
their event streams (decoder.py) under the Chat client's thin shell (client.py), and what
each backend takes of a Responses request as data (profiles.py)."""
