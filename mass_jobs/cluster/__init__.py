"""The live cluster, read through the Kubernetes client: what offline checks cannot see.

- `api`: the connection (kubeconfig, context and namespace, or a pod's own account) and reads that
  say "not found" and "forbidden" apart;
- `scheduling`: kube-scheduler's node filters (taints, node affinity, resources), to tell which
  nodes take a class of this project's pods;
- `preflight`: `mass validate --cluster`, the cluster checked against the spec and the chart's values
  (with `capacity`: Kueue's queue, the nodes and storage classes against the pods as rendered);
- `pods`: `mass pods`, an operator's view of a run's pods and the objects they belong to;
- `model_wait`: `mass serve-wait`, the serve step's wait in its pod: the model served, or why not
  (a predictor pod no node takes, a failed load) within the pending bound and the ready deadline.
"""
