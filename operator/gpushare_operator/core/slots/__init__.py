"""Slots: what each slot of a node promises (memory, isolation), changes of them, and memory
requests placed against them."""
