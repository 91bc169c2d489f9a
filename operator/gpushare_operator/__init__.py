"""gpushare: GPU-sharing policies to NVIDIA device-plugin configuration and live sharing state.

Layers, each importing only the ones below it (enforced by import-linter):
``core`` (pure) < ``cache`` < ``reconcile`` < ``kube`` (all API I/O) < ``app`` (the operator:
kopf handlers, wiring) and ``kubectl`` (the plugin).  The local control plane and the GPU
simulator are a distribution of their own, ``gpushare_testing``, never shipped.
"""

__version__ = "0.1.0"
