"""API objects read as the fit engine's inputs: the snapshot of nodes and pools, a pod's
constraints, DRA devices and TAS slices, PodGroup membership, the labels a new node gets from
its kubelet, and topology relaxation."""
