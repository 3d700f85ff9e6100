"""The fleet twin: one ``NeuronInferenceService`` over virtual time, at any replica count.

Every replica is the real vLLM scheduler with the Neuron scheduler, stepping on the simulated device's
calibrated clock (``neuronfleet.engine.offline``) with its own KV blocks and prefix cache. A router picks each
request's replica as the Endpoint Picker does, from the scoring the operator renders into its config
(``neuronfleet.contract.picker``), or at random as a Service does; an autoscaler adds and removes replicas as
KEDA and the HPA would, and a new replica serves only once its start time has passed.

- ``arrivals``: the requests: seeded generators, trace files, closed-loop conversations.
- ``replica``: one replica, advanced to a moment of virtual time.
- ``picker``: the routers: GIE's scorers, the picker's own counts, its metric refresh; the Service.
- ``autoscaler``: KEDA and the HPA on the engines' waiting queue.
- ``twin``: the event loop, and what it reports.
"""
