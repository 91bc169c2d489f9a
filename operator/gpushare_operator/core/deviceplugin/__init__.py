"""NVIDIA's device plugin: the config a policy renders to (one ConfigMap key each, content-hashed)
and the plugin's own schema for it."""
