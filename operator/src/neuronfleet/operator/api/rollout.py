"""How a ``NeuronInferenceService`` moves to a new revision: its rollout settings, its canary, and how its
replicas drain when they stop. The admission rules of each model are in :mod:`neuronfleet.operator.api.rules`.
"""

from __future__ import annotations

from pydantic import Field

from neuronfleet.operator.api import rules
from neuronfleet.operator.api.k8s import K8sModel

#: The most artifacts a service keeps for a rollback beyond the one it serves.
MAX_ARTIFACT_HISTORY = 10


#: The most steps a canary takes before its revision serves everything.
MAX_CANARY_STEPS = 10


class CanaryStep(K8sModel):
    """One step of a canary: the new revision's share, held while the analysis watches it."""

    weight: int = Field(
        ge=1,
        le=99,
        description=(
            "Percent of the requests the new revision takes at this step. Its replicas run beside all the "
            "stable revision's: round(replicas * weight / (100 - weight)) of them, at least 1. Without "
            "spec.routing the Service splits requests by replica count, so the share is the canary's replicas "
            "over all. With spec.routing each revision has its InferencePool and picker, and the router sends "
            "this percent to the canary's (its pods roll to each step's split before the step's pause starts)."
        ),
    )
    pause_seconds: int = Field(
        60,
        ge=0,
        le=86_400,
        description="How long the step holds once its replicas are Ready, before the analysis may promote.",
    )


class CanaryAnalysis(K8sModel):
    """What the new revision must show against the stable one, from the engines' own metrics."""

    min_requests: int = Field(
        100,
        ge=1,
        le=1_000_000,
        description=(
            "Completions the canary must have answered before the analysis passes it; its latencies can abort it "
            "once as many of its requests have had their first token."
        ),
    )
    max_ttft_p99_ratio: float = Field(
        1.2, ge=1, le=100, description="The canary's time-to-first-token p99 over the stable's, at most."
    )
    max_itl_p99_ratio: float = Field(
        1.2, ge=1, le=100, description="The canary's inter-token latency p99 over the stable's, at most."
    )
    max_error_rate_increase: float = Field(
        0.01,
        ge=0,
        le=1,
        description=(
            "The canary's share of completions answered 5xx, less the stable's, at most (a difference: a ratio "
            "to a stable revision with no errors means nothing)."
        ),
    )
    max_padding_share_increase: float = Field(
        0.1,
        ge=0,
        le=1,
        description=(
            "The canary's share of prefill tokens that are bucket padding, less the stable's, at most: a bucket "
            "set that pads much more wastes the device."
        ),
    )


class Canary(K8sModel):
    """A new revision earns its traffic step by step, or is rolled back on its own."""

    admission_rules = rules.CANARY

    steps: list[CanaryStep] = Field(
        min_length=1,
        max_length=MAX_CANARY_STEPS,
        description=(
            "The new revision's shares, ascending (for example 10, then 50). After the last step passes, it "
            "rolls out to every replica as without a canary."
        ),
    )
    analysis: CanaryAnalysis = Field(
        default_factory=CanaryAnalysis,
        description=(
            "Checked all along: a canary that breaks a limit is aborted at once (its replicas go, the stable "
            "revision serves everything); one that holds them is promoted when its step's pause is over."
        ),
    )


class RolloutSettings(K8sModel):
    """How a new revision replaces the serving one."""

    admission_rules = rules.ROLLOUT

    max_surge: int = Field(1, ge=0, le=100, description="Extra replicas started during a rollout.")
    max_unavailable: int = Field(
        0,
        ge=0,
        le=100,
        description=(
            "Replicas that may be unready during a rollout. 0 (the default): surge first, "
            "never below the ready replicas."
        ),
    )
    startup_timeout_seconds: int = Field(
        1800,
        ge=60,
        le=14_400,
        description=(
            "How long a replica may take to load the model and artifact before it is restarted; at least twice "
            "the start the operator predicts for a model of known size (weights fetched, loaded and sharded)."
        ),
    )
    artifact_history_limit: int | None = Field(
        None,
        ge=0,
        le=MAX_ARTIFACT_HISTORY,
        description=(
            "Artifacts this service served before, kept with their compiled state after it moves on, so a "
            "rollback to one rolls out at once, without a compile Job. Unset: the operator's default "
            "(the chart's artifactHistoryLimit, 2)."
        ),
    )
    canary: Canary | None = Field(
        None,
        description=(
            "Roll a new revision out as a canary: beside the stable revision, through the steps, promoted or "
            "aborted by the analysis of the engines' metrics. Unset: surge-first rollout of every replica."
        ),
    )


class DrainSettings(K8sModel):
    """How a replica stops without dropping the generations it is serving."""

    admission_rules = rules.DRAIN

    pre_stop_seconds: int = Field(
        10, ge=0, le=300, description="Wait before stopping, while endpoints stop sending new requests."
    )
    drain_timeout_seconds: int = Field(
        120, ge=0, le=3600, description="How long in-flight requests may run after the stop signal."
    )
    termination_grace_period_seconds: int | None = Field(
        None,
        ge=1,
        le=7200,
        description="Pod termination grace. Default: preStopSeconds + drainTimeoutSeconds + 15.",
    )

    @property
    def grace_seconds(self) -> int:
        """The termination grace in force."""
        if self.termination_grace_period_seconds is not None:
            return self.termination_grace_period_seconds
        return self.pre_stop_seconds + self.drain_timeout_seconds + 15
