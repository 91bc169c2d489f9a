"""gpushare: GPU-sharing policies to NVIDIA device-plugin configuration and live sharing state.

Layers, each importing only the ones below it (enforced by import-linter):
``core`` (pure) < ``cache`` < ``kube`` (all API I/O) < ``app`` (kopf handlers, wiring),
with ``testing`` (local control plane, GPU node simulator) on top.
"""

__version__ = "0.1.0"
