"""The host process: ``python -m intloom.host`` (see ``daemon`` for its lifecycle)."""
