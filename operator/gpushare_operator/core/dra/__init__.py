"""Backend DRA's objects: NVIDIA's DRA driver (its ResourceSlices and the labels that switch it
on), the ResourceClaims holding its devices, our DeviceClasses, and a DRA node's slot memory."""
