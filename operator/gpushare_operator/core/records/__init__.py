"""The slim records the caches keep: a Node, a GPU Pod, and a GPUSharingPolicy compiled once per
generation."""
