"""MIG layouts: a policy's layout per GPU model, and the mig-parted ConfigMap they are written
to."""
