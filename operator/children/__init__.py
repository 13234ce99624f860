"""Pure functions: the RolloutJob model itself (tracefleet.contract.job) and the operator's config ->
child manifests, built from the kubernetes client's typed models and handed on as JSON (`metadata.as_manifest`;
the NetworkPolicies are still written as JSON), one module per child kind (the model is KubeRay's ray-operator
`common/`: builders take the API type, never a view of it; defaults are resolved in the model).

No API calls here, so every security and scheduling property of a child is unit-testable:
GPU limits and probes of the inference Deployment (`inference`), the harness pod's native proxy
sidecar and its sandboxing (no service-account token, non-root, runtimeClassName, deadline)
(`harness`), the per-job NetworkPolicy (`network_policy`), evaluator and sealer Jobs (`jobs`);
labels and ownerReferences (`metadata`), security contexts (`security`) and what every pod is
given from outside — bucket access and its task (`inputs`).

Data path (keys: tracefleet.contract.layout): the proxy sidecar records the capture log on a volume shared with the
harness container and, when the pod stops, uploads capture + artifacts to
`<bucket>/<job>/sessions/<session>/`; the evaluator Job reads them and writes `reward.json`
there; a sealer Job builds and seals `<bucket>/<job>/batches/<seq>/` from a fixed set of
sessions. Harness pods never hold bucket credentials nor RBAC.
"""
