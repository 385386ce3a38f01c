"""The process kubelet: one Node whose Pods run as local processes, for the local cluster.

It registers its Node (Ready, its Lease renewed), binds every unscheduled Pod to
itself, and runs each Pod's containers in a network namespace of the Pod's own
with the env a kubelet resolves, a kubeconfig holding a token of the Pod's
ServiceAccount, readiness from the readinessProbe, and the status written back;
it serves ``kubectl logs`` (``logs.py``). The container's image is not pulled:
its command runs from this Python environment (``images.py`` gives our images'
entrypoints). A failed livenessProbe restarts the container; volumes and
resource limits are not enforced.
"""
