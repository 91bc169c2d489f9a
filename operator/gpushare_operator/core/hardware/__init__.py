"""What the GPUs are: MIG profile names and NVIDIA's MIG geometry per GPU model (go-nvml's tables,
as package data in migtables.json)."""
