"""``neuronfleet-engine``: the engine's command line (``main.py`` holds the app)."""
