"""kopf handlers, settings, startup wiring, metrics and health endpoints, logging, CLI."""
