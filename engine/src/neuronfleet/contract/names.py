"""The names the operator and everything that looks for its objects share, defined once.

The API group and kinds the operator serves, the labels it puts on what it makes, the name it applies
and labels under, and the port the engine serves on (the metric series it exports are in ``contract/metrics.py``).
The operator writes them; the dev harness, which never imports the operator, and the tests find objects and
pods by them (the Helm chart and the Argo CD checks spell them too, in YAML and Lua). It depends on the
standard library alone.
"""

#: The operator's API group: its kinds' ``apiVersion`` is ``neuronfleet.io/<version>``.
GROUP = "neuronfleet.io"

#: The operator's kinds, and their plurals: the resource names in API paths, RBAC rules and CRD names.
SERVICE_KIND = "NeuronInferenceService"
SERVICE_PLURAL = "neuroninferenceservices"
ARTIFACT_KIND = "NeuronCompiledArtifact"
ARTIFACT_PLURAL = "neuroncompiledartifacts"

#: On every object the operator makes for a service, and the serving pods' selector: the service's name.
LABEL_SERVICE = "neuronfleet.io/service"
#: Kubernetes' recommended label, on a service's serving and router pods: the service's name. A quarantined pod
#: keeps it (it loses ``LABEL_SERVICE``).
LABEL_INSTANCE = "app.kubernetes.io/instance"
#: On an artifact, its compile objects and the pods that serve it: the artifact's hash.
LABEL_ARTIFACT = "neuronfleet.io/artifact"
#: On a serving pod the operator took out of service for a Neuron fault: ``device`` (its engine reported a
#: device fault) or ``node`` (its node carries a Neuron fault condition). The pod loses ``LABEL_SERVICE``, so
#: it leaves its Deployment, Service and InferencePool at once; its fault is told in ``ANNOTATION_FAULT``.
LABEL_QUARANTINED = "neuronfleet.io/quarantined"
ANNOTATION_FAULT = "neuronfleet.io/fault"
#: On the serving pods of a canary (``spec.rollout.canary``): ``canary``. Their Deployment selects by it, so
#: the stable revision's pods and theirs are told apart; the Service selects both.
LABEL_TRACK = "neuronfleet.io/track"
TRACK_CANARY = "canary"
#: ``LABEL_SERVICE`` as Prometheus spells it: the chart's PodMonitor and ServiceMonitor copy the pod label
#: onto every series (``podTargetLabels``), and the autoscaling queries select by it; any scrape config must
#: do the same.
SERVICE_METRIC_LABEL = "neuronfleet_io_service"

#: The operator's name for the API server: the field manager of its server-side applies, the component of
#: its events, and the ``app.kubernetes.io/managed-by`` value on what it makes.
OPERATOR_NAME = "neuronfleet-operator"
FIELD_MANAGER = OPERATOR_NAME
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"

#: The engine's HTTP port (the OpenAI API, ``/health``, ``/metrics``), and the name of that port on the
#: serving pods and their Service, which the probes and the scrapes refer to.
HTTP_PORT = 8000
HTTP_PORT_NAME = "http"
#: Seconds the engine keeps an idle HTTP connection open (vLLM's ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, pinned at
#: its default). A proxy in front must close idle connections sooner: one that sends a request just as the
#: engine closes the connection gets a reset.
HTTP_KEEP_ALIVE_S = 5
#: Where the engine publishes its KV cache events when asked (``serve --kv-events-port``: vLLM's ZMQ
#: publisher and default port) and replays those it still holds (the next port); apart from the HTTP port.
KV_EVENTS_PORT = 5557
#: Its replay port (the engine's default: the next one).
KV_EVENTS_REPLAY_PORT = KV_EVENTS_PORT + 1

#: The response header naming the replica (its pod) that answered, on every answer the engine sends; the
#: operator gives each serving pod its own name in this environment variable (the host name otherwise).
REPLICA_HEADER = "x-neuronfleet-replica"
REPLICA_ENV = "NEURONFLEET_REPLICA"
