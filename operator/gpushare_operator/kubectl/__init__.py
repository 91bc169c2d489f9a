"""The kubectl plugin (``kubectl gpushare``): plan, status and explain, with the operator's code.

Beside ``app`` in the layers: it uses ``kube`` for every API call and ``reconcile``, ``cache``
and ``core`` for everything it works out, and nothing of the running operator (kopf, the
writer, leader election).
"""
