"""Canary analysis as pure functions: the engines' metrics in, a verdict and the canary's next state out.

Each serving pod's ``/metrics`` is read into :class:`Figures` (completions answered, 5xx among them, the TTFT
and inter-token latency histograms, prefill tokens real and padded). A revision's figures over the canary are
the sum over its pods of what each counted since the canary began (:func:`since`): the canary's pods are all
new; the stable pods' counts at the start are subtracted. :func:`analyse` compares the two against
``spec.rollout.canary.analysis``, and :func:`advance` moves the canary on: abort at the first broken limit,
promote a step once its pause is over and the limits hold.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from prometheus_client.parser import text_string_to_metric_families

from neuronfleet.contract import metrics
from neuronfleet.operator import api, plan
from neuronfleet.operator.policy.conditions import Event, Reason

#: The engine's completion endpoints, as vLLM's HTTP metrics name their handler.
COMPLETION_HANDLERS = frozenset({"/v1/completions", "/v1/chat/completions"})
HTTP_REQUESTS = "http_requests"
TTFT = metrics.TIME_TO_FIRST_TOKEN
ITL = metrics.INTER_TOKEN_LATENCY
PADDING_TOKENS = metrics.PADDING_TOKENS
PREFILL_TOKENS = metrics.PREFILL_CHUNK_TOKENS

#: A histogram as Prometheus keeps it: cumulative counts by upper bound (``le``), +Inf included.
Histogram = Mapping[float, float]


@dataclass(frozen=True)
class Figures:
    """What one engine (or a revision's engines together) counted."""

    requests: float = 0
    errors: float = 0
    ttft: Histogram = field(default_factory=dict)
    itl: Histogram = field(default_factory=dict)
    padding_tokens: float = 0
    prefill_tokens: float = 0

    def __add__(self, other: Figures) -> Figures:
        return Figures(
            self.requests + other.requests,
            self.errors + other.errors,
            _merge(self.ttft, other.ttft, 1),
            _merge(self.itl, other.itl, 1),
            self.padding_tokens + other.padding_tokens,
            self.prefill_tokens + other.prefill_tokens,
        )

    def __sub__(self, other: Figures) -> Figures:
        return Figures(
            self.requests - other.requests,
            self.errors - other.errors,
            _merge(self.ttft, other.ttft, -1),
            _merge(self.itl, other.itl, -1),
            self.padding_tokens - other.padding_tokens,
            self.prefill_tokens - other.prefill_tokens,
        )

    @property
    def counted_down(self) -> bool:
        """Whether a count went below zero: as a difference, the engine restarted in between."""
        counts = (self.requests, self.errors, self.padding_tokens, self.prefill_tokens, *self.ttft.values())
        return any(count < 0 for count in (*counts, *self.itl.values()))

    @property
    def error_rate(self) -> float:
        """The share of completions answered 5xx."""
        return self.errors / self.requests if self.requests else 0.0

    @property
    def padding_share(self) -> float:
        """The share of prefill tokens computed that were bucket padding."""
        computed = self.padding_tokens + self.prefill_tokens
        return self.padding_tokens / computed if computed else 0.0


def _merge(a: Histogram, b: Histogram, sign: int) -> dict[float, float]:
    return {bound: a.get(bound, 0) + sign * b.get(bound, 0) for bound in {*a, *b}}


def parse_figures(text: str) -> Figures:
    """An engine's figures from its ``/metrics`` (Prometheus text format)."""
    requests = errors = padding = prefill = 0.0
    ttft: dict[float, float] = {}
    itl: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == f"{HTTP_REQUESTS}_total" and labels.get("handler") in COMPLETION_HANDLERS:
                requests += sample.value
                errors += sample.value if labels.get("status", "").startswith("5") else 0
            elif sample.name in (f"{TTFT}_bucket", f"{ITL}_bucket"):
                into = ttft if sample.name.startswith(TTFT) else itl
                bound = float(labels["le"])
                into[bound] = into.get(bound, 0) + sample.value
            elif sample.name == f"{PADDING_TOKENS}_total":
                padding += sample.value
            elif sample.name == f"{PREFILL_TOKENS}_sum":
                prefill += sample.value
    return Figures(requests, errors, ttft, itl, padding, prefill)


def since(start: Mapping[str, Figures], now: Mapping[str, Figures]) -> Figures:
    """What a revision's pods counted since ``start`` (by pod name): a pod absent then counts from zero, and so
    does one whose engine restarted since."""
    total = Figures()
    for pod, figures in now.items():
        delta = figures - start.get(pod, Figures())
        total += figures if delta.counted_down else delta
    return total


def quantile(histogram: Histogram, q: float) -> float | None:
    """The ``q`` quantile of a cumulative histogram, linear within its bucket (Prometheus'
    ``histogram_quantile``); None with no observations."""
    bounds = sorted(histogram)
    if not bounds or histogram[bounds[-1]] <= 0:
        return None
    rank = q * histogram[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = histogram[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return lower


class Verdict(Enum):
    """What the analysis says of the canary."""

    PASS = "pass"
    FAIL = "fail"
    #: Too few requests to say.
    WAIT = "wait"


@dataclass(frozen=True)
class Analysis:
    """A verdict and the figures behind it, in words."""

    verdict: Verdict
    message: str


def _latency_check(name: str, canary: Histogram, stable: Histogram, limit: float) -> tuple[bool, str] | None:
    """Whether the canary's p99 is within ``limit`` times the stable's, and the figures; None without both."""
    ours, theirs = quantile(canary, 0.99), quantile(stable, 0.99)
    if ours is None or theirs is None or theirs <= 0:
        return None
    ratio = ours / theirs
    words = f"{name} p99 {ours * 1e3:.0f} ms = {ratio:.2f}x the stable's {theirs * 1e3:.0f} ms (limit {limit:g}x)"
    return ratio <= limit, words


def _latency_checks(limits: api.CanaryAnalysis, canary: Figures, stable: Figures) -> list[tuple[bool, str] | None]:
    return [
        _latency_check("TTFT", canary.ttft, stable.ttft, limits.max_ttft_p99_ratio),
        _latency_check("ITL", canary.itl, stable.itl, limits.max_itl_p99_ratio),
    ]


def _failed(made: list[tuple[bool, str]], over: str) -> Analysis | None:
    """FAIL naming every broken limit of the checks ``made`` (``over``: the requests they counted); None if none."""
    broken = [text for ok, text in made if not ok]
    return Analysis(Verdict.FAIL, f"limits broken: {'; '.join(broken)} ({over})") if broken else None


def _too_slow_to_wait_for(limits: api.CanaryAnalysis, canary: Figures, stable: Figures) -> Analysis | None:
    """FAIL before ``minRequests`` completions when as many canary requests had their first token and their
    latencies already break a limit: a slow revision completes requests slowly, and its evidence is in before."""
    started = max(canary.ttft.values(), default=0.0)
    if started < limits.min_requests:
        return None
    made = [check for check in _latency_checks(limits, canary, stable) if check is not None]
    return _failed(made, f"over {started:.0f} canary requests started, {canary.requests:.0f} completed")


def analyse(limits: api.CanaryAnalysis, canary: Figures, stable: Figures) -> Analysis:
    """Compare the canary with the stable revision over the same time; FAIL names every broken limit. Nothing
    passes before ``minRequests`` canary completions; latencies can fail it once as many have started."""
    if canary.requests < limits.min_requests or stable.requests < 1:
        return _too_slow_to_wait_for(limits, canary, stable) or Analysis(
            Verdict.WAIT,
            f"{canary.requests:.0f} of the {limits.min_requests} completions the canary needs before the analysis "
            f"decides ({stable.requests:.0f} on the stable revision)",
        )
    checks = [
        *_latency_checks(limits, canary, stable),
        (
            canary.error_rate - stable.error_rate <= limits.max_error_rate_increase,
            f"5xx {canary.error_rate:.1%} against {stable.error_rate:.1%} "
            f"(limit +{limits.max_error_rate_increase:.1%})",
        ),
        (
            canary.padding_share - stable.padding_share <= limits.max_padding_share_increase,
            f"padding {canary.padding_share:.1%} of prefill tokens against {stable.padding_share:.1%} "
            f"(limit +{limits.max_padding_share_increase:.1%})",
        ),
    ]
    made = [check for check in checks if check is not None]
    over = f"over {canary.requests:.0f} canary and {stable.requests:.0f} stable completions"
    return _failed(made, over) or Analysis(Verdict.PASS, f"{'; '.join(text for _, text in made)} ({over})")


def canary_replicas(stable: int, weight: int) -> int:
    """Replicas of the new revision beside ``stable`` ones for a ``weight`` percent share by replica count."""
    return max(1, round(stable * weight / (100 - weight)))


def replicas_in_play(trial: api.CanaryStatus | None) -> int:
    """The canary's replicas serving beside the stable ones: the fleet is whole only with them Ready too."""
    return trial.canary_replicas if trial is not None and trial.phase == "Progressing" else 0


def routed_weight(spec: api.Canary, state: api.CanaryStatus, replicas_ready: bool) -> int:
    """The canary's share for the routers to send it: its step's once the step's replicas are all Ready, the
    step before's until then (0 before the first step's: no request for a canary with no replica to take it)."""
    if state.phase != "Progressing":
        return 0
    if replicas_ready:
        return state.weight
    return spec.steps[state.step - 1].weight if state.step > 0 else 0


def revision_split(stable_revision: str | None, weight: int, routed: bool) -> plan.RevisionSplit | None:
    """What the router splits requests by: behind a router (``routed``), ``weight`` percent to the canary's pool
    and the rest to the stable revision's; ``None``, one pool, with no weight for a canary."""
    if not routed or not weight or stable_revision is None:
        return None
    return plan.RevisionSplit(stable_revision, weight)


def stable_pool_revision(trial: api.CanaryStatus | None, stable_revision: str | None, routed: bool) -> str | None:
    """The revision the service's own pool holds to: the stable one while a canary behind the router is in
    progress or was aborted (its replicas, in their own pool, may still be draining); else ``None``, every
    revision (a promoted canary's revision rolls out through it)."""
    if not routed or trial is None or trial.phase == "Promoted":
        return None
    return stable_revision


def start(canary: api.Canary, revision: str, stable: int) -> api.CanaryStatus:
    """A canary of ``revision`` at its first step, waiting for its replicas."""
    weight = canary.steps[0].weight
    return api.CanaryStatus(
        revision=revision,
        phase="Progressing",
        weight=weight,
        canary_replicas=canary_replicas(stable, weight),
        stable_replicas=stable,
    )


@dataclass(frozen=True)
class CanaryInput:
    """What the canary's next state is decided on."""

    spec: api.Canary
    state: api.CanaryStatus
    #: The stable revision's replicas now (the spec's).
    stable: int
    #: Whether every canary replica of the step is Ready, and behind a router, every router pod routes by the
    #: step's split.
    ready: bool
    analysis: Analysis | None
    now: datetime.datetime


def advance(given: CanaryInput) -> tuple[api.CanaryStatus, list[Event]]:
    """The canary's next state and the events it calls for: abort on a failed analysis, start the step's
    pause once its replicas are Ready, step on (or promote after the last step) once the pause is over and the
    analysis passes."""
    state, spec, analysis = given.state, given.spec, given.analysis
    if state.phase != "Progressing":
        return state, []
    state = replace_state(state, stable_replicas=given.stable, analysis=analysis.message if analysis else None)
    if analysis is not None and analysis.verdict is Verdict.FAIL:
        # The Ready condition's transition to CanaryAborted is its event.
        return replace_state(state, phase="Aborted", canary_replicas=0), []
    step = spec.steps[state.step]
    if state.step_started_at is None:
        wanted = canary_replicas(given.stable, step.weight)
        started = given.now if given.ready and state.canary_replicas == wanted else None
        return replace_state(state, canary_replicas=wanted, step_started_at=started), []
    held = (given.now - state.step_started_at).total_seconds() >= step.pause_seconds
    if not held or analysis is None or analysis.verdict is not Verdict.PASS:
        return state, []
    if state.step + 1 == len(spec.steps):
        promoted = replace_state(state, phase="Promoted", step=len(spec.steps), weight=100)
        return promoted, [Event("Normal", Reason.CANARY_PROMOTED, _where(state, spec) + ": " + analysis.message)]
    weight = spec.steps[state.step + 1].weight
    stepped = replace_state(
        state,
        step=state.step + 1,
        weight=weight,
        canary_replicas=canary_replicas(given.stable, weight),
        step_started_at=None,
    )
    message = f"{_where(state, spec)} passed, on to {weight}%: {analysis.message}"
    return stepped, [Event("Normal", Reason.CANARY_STEPPED, message)]


def replace_state(state: api.CanaryStatus, **changes: object) -> api.CanaryStatus:
    """``state`` with ``changes`` (field names), validated again."""
    return api.CanaryStatus.model_validate({**state.model_dump(by_alias=False), **changes})


def _where(state: api.CanaryStatus, spec: api.Canary) -> str:
    return f"canary {state.revision} step {state.step + 1}/{len(spec.steps)} ({state.weight}%)"
