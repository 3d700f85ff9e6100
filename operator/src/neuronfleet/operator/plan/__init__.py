"""Pure planning: a spec in, the Kubernetes objects it wants out.

Nothing here talks to the API server. Every object is built whole, with a
deterministic name, so applying it twice changes nothing and a restarted
operator builds the same objects again.

- ``shared``: owners, names, labels, the engine file, the artifact store, security contexts.
- ``compiling``: a service's artifact; the artifact's ConfigMap and compile Job.
- ``serving``: a service's engine ConfigMap, Deployment, Service and PodDisruptionBudget (a :class:`ServingPlan`);
  ``devices``: how its pods get their Neuron devices (the device plugin, or a DRA claim template).
- ``routing``: a service's InferencePool, and with ``spec.routing`` its router: the pods, their access, config and
  Services, wired from ``picker`` (GIE's Endpoint Picker: its config, command line and container) and ``envoy``
  (Envoy in front of it: its bootstrap, the revision split and its container).
"""

from neuronfleet.operator.plan.compiling import (
    artifact,
    artifact_configmap,
    artifact_name,
    compile_invocation,
    compile_job,
    compile_job_name,
)
from neuronfleet.operator.plan.devices import NEURON_CLAIM, claim_template, neuron_claim
from neuronfleet.operator.plan.envoy import RevisionSplit
from neuronfleet.operator.plan.routing import (
    SPLIT_ANNOTATION,
    RouterImages,
    canary_inference_pool,
    canary_pool_name,
    inference_pool,
    picker_name,
    router_name,
    router_objects,
    router_removal,
    scoring_of,
)
from neuronfleet.operator.plan.serving import (
    SIM_CPU,
    SIM_MEMORY,
    STARTUP_PROBE_PERIOD_S,
    ServedArtifact,
    ServingPlan,
    canary_name,
    canary_plan,
    deployment,
    disruption_budget,
    engine_configmap,
    serve_invocation,
    service,
    serving_objects,
    serving_plan,
)
from neuronfleet.operator.plan.shared import (
    CACHE_MOUNT,
    CONFIG_DIR,
    CONFIG_VOLUME,
    ENGINE_FILE,
    MANAGED_BY,
    RUN_AS,
    STORE_MOUNT,
    Owner,
    StoreAccess,
    artifact_labels,
    engine_configmap_name,
    engine_yaml,
    served_engine,
    service_labels,
    serving_labels,
    serving_pod_selector,
    store_access,
    store_location,
    store_path,
)

__all__ = [
    "CACHE_MOUNT",
    "CONFIG_DIR",
    "CONFIG_VOLUME",
    "ENGINE_FILE",
    "MANAGED_BY",
    "NEURON_CLAIM",
    "RUN_AS",
    "SIM_CPU",
    "SIM_MEMORY",
    "SPLIT_ANNOTATION",
    "STARTUP_PROBE_PERIOD_S",
    "STORE_MOUNT",
    "Owner",
    "RevisionSplit",
    "RouterImages",
    "ServedArtifact",
    "ServingPlan",
    "StoreAccess",
    "artifact",
    "artifact_configmap",
    "artifact_labels",
    "artifact_name",
    "canary_inference_pool",
    "canary_name",
    "canary_plan",
    "canary_pool_name",
    "claim_template",
    "compile_invocation",
    "compile_job",
    "compile_job_name",
    "deployment",
    "disruption_budget",
    "engine_configmap",
    "engine_configmap_name",
    "engine_yaml",
    "inference_pool",
    "neuron_claim",
    "picker_name",
    "router_name",
    "router_objects",
    "router_removal",
    "scoring_of",
    "serve_invocation",
    "served_engine",
    "service",
    "service_labels",
    "serving_labels",
    "serving_objects",
    "serving_plan",
    "serving_pod_selector",
    "store_access",
    "store_location",
    "store_path",
]
