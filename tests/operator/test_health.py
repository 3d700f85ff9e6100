"""Neuron health: which faults quarantine a serving pod, when a quarantined pod goes, what Degraded says."""

from __future__ import annotations

import datetime
from typing import Any

from neuronfleet.contract.faults import NeuronRuntimeError, runtime_status, termination_message
from neuronfleet.contract.names import ANNOTATION_FAULT, LABEL_QUARANTINED, LABEL_SERVICE
from neuronfleet.operator import api, plan
from neuronfleet.operator.policy import canary, health
from neuronfleet.operator.policy.conditions import ConditionType, Reason, transitions
from neuronfleet.operator.policy.health import Fault, FaultKind

SERVICE = "llama"
T0 = datetime.datetime(2026, 12, 4, 12, 0, tzinfo=datetime.UTC)
HBM = termination_message(NeuronRuntimeError(runtime_status("NRT_EXEC_HW_ERR_HBM_UE"), "nc 3, step 812"))
DMA = Fault(FaultKind.NODE, "NeuronHasError_DMA_ERROR", "DMA engine error on device 2")


def node(name: str, *conditions: tuple[str, str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                *({"type": t, "status": s, "reason": r, "message": f"{r} seen"} for t, s, r in conditions),
            ]
        },
    }


def pod(
    name: str,
    on: str,
    *,
    ready: bool = True,
    last_words: str | None = None,
    quarantined: Fault | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    labels = {"app.kubernetes.io/instance": SERVICE, "app.kubernetes.io/component": "serving"}
    meta: dict[str, Any] = {"name": name, "namespace": "llm", "labels": labels}
    if quarantined is None:
        labels[LABEL_SERVICE] = SERVICE
    else:
        labels[LABEL_QUARANTINED] = str(quarantined.kind)
        meta["annotations"] = {ANNOTATION_FAULT: quarantined.describe()}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T12:00:00Z"
    container: dict[str, Any] = {"name": "engine", "state": {"running": {}}, "ready": ready}
    if last_words is not None:
        container["lastState"] = {"terminated": {"exitCode": 4, "message": last_words}}
    status = {
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [container],
    }
    return {"metadata": meta, "spec": {"nodeName": on}, "status": status}


def degraded(plan_: health.HealthPlan) -> tuple[str, str, str]:
    c = health.degraded_condition(plan_, 1, T0)
    return c.status, c.reason, c.message


def test_node_conditions_from_both_neuron_agents_are_faults_and_healthy_ones_are_not() -> None:
    npd = health.node_fault(node("n1", ("NeuronHealth", "True", "NeuronHasError_SRAM_UNCORRECTABLE_ERROR")))
    assert npd == Fault(
        FaultKind.NODE, "NeuronHasError_SRAM_UNCORRECTABLE_ERROR", "NeuronHasError_SRAM_UNCORRECTABLE_ERROR seen"
    )
    eks = health.node_fault(node("n2", ("AcceleratedHardwareReady", "False", "NeuronHBMUncorrectableError")))
    assert eks is not None
    assert eks.reason == "NeuronHBMUncorrectableError"
    assert health.node_fault(node("n3", ("NeuronHealth", "False", "NeuronHealthy"))) is None
    assert health.node_fault(node("n4", ("AcceleratedHardwareReady", "True", "Ready"))) is None
    assert health.node_fault(node("n5")) is None


def test_a_device_fault_is_read_from_the_engines_last_words_and_a_runtime_error_is_not() -> None:
    fault = health.device_fault(pod("a", "n1", last_words=HBM))
    assert fault is not None
    assert fault.kind == FaultKind.DEVICE
    assert fault.reason == "NRT_EXEC_HW_ERR_HBM_UE"
    assert fault.describe() == "NRT_EXEC_HW_ERR_HBM_UE (1201): an uncorrectable HBM error; nc 3, step 812"
    # A log tail (FallbackToLogsOnError): the line naming the status, not the last line.
    tail = "INFO loading\nERROR nrt_execute failed with status 1202 on nc 1\nINFO shutting down"
    from_logs = health.device_fault(pod("b", "n1", last_words=tail))
    assert from_logs is not None
    assert from_logs.describe().startswith("NRT_EXEC_HW_ERR_NC_UE: ERROR nrt_execute failed")
    timeout = termination_message(NeuronRuntimeError(runtime_status("NRT_TIMEOUT"), "nc 0"))
    assert health.device_fault(pod("c", "n1", last_words=timeout)) is None
    assert health.device_fault(pod("d", "n1", last_words="Killed")) is None
    assert health.device_fault(pod("e", "n1")) is None


def test_a_replica_with_a_device_fault_is_quarantined_and_the_fleet_is_degraded_until_replaced() -> None:
    faulty, healthy = pod("a", "n1", ready=False, last_words=HBM), pod("b", "n2")
    first = health.assess(SERVICE, [faulty, healthy], {}, 2, unplaceable=False)
    assert [(q.name, q.node, q.fault.reason) for q in first.quarantine] == [("a", "n1", "NRT_EXEC_HW_ERR_HBM_UE")]
    assert first.release == ()
    assert (first.ready, first.whole) == (1, False)
    status, reason, message = degraded(first)
    assert (status, reason) == ("True", Reason.NEURON_DEVICE_FAULT)
    assert message.startswith("pod a on node n1: NRT_EXEC_HW_ERR_HBM_UE (1201)")
    assert message.endswith("(1/2 replicas ready)")

    # Quarantined; its replacement starting: kept until the fleet is whole.
    held = pod("a", "n1", quarantined=first.quarantine[0].fault)
    starting = health.assess(SERVICE, [held, healthy, pod("c", "n3", ready=False)], {}, 2, unplaceable=False)
    assert (starting.quarantine, starting.release, [k.name for k in starting.kept]) == ((), (), ["a"])
    assert degraded(starting)[:2] == ("True", Reason.NEURON_DEVICE_FAULT)
    assert "pod a on node n1: NRT_EXEC_HW_ERR_HBM_UE (1201)" in degraded(starting)[2]

    whole = health.assess(SERVICE, [held, healthy, pod("c", "n3")], {}, 2, unplaceable=False)
    assert (whole.release, whole.kept) == (("a",), ())
    assert degraded(whole)[:2] == ("False", Reason.HEALTHY)


def test_a_replacement_that_cannot_be_placed_gets_a_device_quarantined_pods_devices() -> None:
    held = pod("a", "n1", quarantined=Fault(FaultKind.DEVICE, "NRT_HW_ERROR", "x"))
    stuck = health.assess(SERVICE, [held, pod("b", "n2"), pod("c", "", ready=False)], {}, 2, unplaceable=True)
    assert stuck.release == ("a",)


def test_a_node_fault_quarantines_every_replica_on_it_and_keeps_them_while_it_holds() -> None:
    pods = [pod("a", "bad"), pod("b", "good"), pod("c", "bad"), pod("d", "bad", ready=False)]
    # Its engines still serve: one Ready pod a pass while the fleet is whole; one not Ready costs nothing.
    first = health.assess(SERVICE, pods, {"bad": DMA}, 3, unplaceable=False)
    assert [q.name for q in first.quarantine] == ["a", "d"]
    assert {q.fault for q in first.quarantine} == {DMA}
    assert degraded(first)[:2] == ("True", Reason.NEURON_NODE_FAULT)
    # Short until a's replacement is Ready; then c.
    short = [pod("a", "bad", quarantined=DMA), pod("b", "good"), pod("c", "bad"), pod("e", "good", ready=False)]
    assert health.assess(SERVICE, short, {"bad": DMA}, 3, unplaceable=False).quarantine == ()
    short[-1] = pod("e", "good")
    assert [q.name for q in health.assess(SERVICE, short, {"bad": DMA}, 3, unplaceable=False).quarantine] == ["c"]

    held = [pod("a", "bad", quarantined=DMA), pod("c", "bad", quarantined=DMA)]
    replaced = [pod("b", "good"), pod("d", "good"), pod("e", "other")]
    # Whole again, the node still faulty: kept, holding new replicas off the node; the condition says so.
    avoided = health.assess(SERVICE, [*held, *replaced], {"bad": DMA}, 3, unplaceable=False)
    assert (avoided.release, sorted(k.name for k in avoided.kept)) == ((), ["a", "c"])
    status, reason, message = degraded(avoided)
    assert (status, reason) == ("False", Reason.FAULTY_NODE_AVOIDED)
    assert "pod a on node bad: NeuronHasError_DMA_ERROR: DMA engine error on device 2" in message
    # Never given to a replacement that cannot be placed while the node is faulty.
    stuck = health.assess(SERVICE, [*held, pod("b", "good")], {"bad": DMA}, 3, unplaceable=True)
    assert stuck.release == ()
    # The condition cleared: released.
    cleared = health.assess(SERVICE, [*held, *replaced], {}, 3, unplaceable=False)
    assert cleared.release == ("a", "c")
    assert degraded(cleared)[:2] == ("False", Reason.HEALTHY)


def test_a_detector_that_flags_every_node_never_empties_the_service() -> None:
    everywhere = {"n1": DMA, "n2": DMA}
    first = health.assess(SERVICE, [pod("a", "n1"), pod("b", "n2")], everywhere, 2, unplaceable=False)
    assert [q.name for q in first.quarantine] == ["a"]
    # Its replacement cannot be placed: b keeps serving.
    held = pod("a", "n1", quarantined=DMA)
    stuck = health.assess(SERVICE, [held, pod("b", "n2"), pod("c", "", ready=False)], everywhere, 2, unplaceable=True)
    assert (stuck.quarantine, stuck.release) == ((), ())
    # A device fault is out at once all the same: its engine has stopped.
    faulted = pod("b", "n2", ready=False, last_words=HBM)
    assert [q.name for q in health.assess(SERVICE, [held, faulted], everywhere, 2, unplaceable=False).quarantine] == [
        "b"
    ]


def test_a_canarys_replicas_are_wanted_beside_the_stable_ones_so_a_node_fault_never_takes_the_last_stable() -> None:
    # Two stable replicas (s2 still starting) and one canary replica: Ready, the canary stands in for none of them.
    trial = api.CanaryStatus(revision="b" * 16, phase="Progressing", weight=34, canary_replicas=1, stable_replicas=2)
    pods = [pod("s1", "bad"), pod("s2", "good", ready=False), pod("c1", "good")]
    desired = 2 + canary.replicas_in_play(trial)
    assert health.assess(SERVICE, pods, {"bad": DMA}, desired, unplaceable=False).quarantine == ()
    # Once s2 is Ready, s1 goes; an aborted canary's replicas are wanted no more.
    pods[1] = pod("s2", "good")
    assert [q.name for q in health.assess(SERVICE, pods, {"bad": DMA}, desired, unplaceable=False).quarantine] == ["s1"]
    assert canary.replicas_in_play(trial.model_copy(update={"phase": "Aborted"})) == 0
    assert canary.replicas_in_play(None) == 0


def test_pods_being_deleted_and_other_services_pods_are_left_alone() -> None:
    other = pod("x", "bad")
    other["metadata"]["labels"][LABEL_SERVICE] = "mistral"
    leaving = pod("y", "bad", deleting=True)
    held_leaving = pod("z", "n1", quarantined=DMA, deleting=True)
    assessed = health.assess(
        SERVICE, [other, leaving, held_leaving, pod("b", "good")], {"bad": DMA}, 1, unplaceable=False
    )
    assert (assessed.quarantine, assessed.release, assessed.kept) == ((), (), ())


def test_the_quarantine_patch_takes_the_pod_out_of_every_selector_and_gives_it_to_the_service() -> None:
    owner = plan.Owner("neuronfleet.io/v1alpha1", "NeuronInferenceService", SERVICE, "uid-1")
    patch = health.quarantine_patch(DMA, owner.reference())["metadata"]
    assert patch["labels"] == {LABEL_SERVICE: None, LABEL_QUARANTINED: "node"}
    assert patch["annotations"] == {ANNOTATION_FAULT: "NeuronHasError_DMA_ERROR: DMA engine error on device 2"}
    assert patch["ownerReferences"] == [owner.reference()]
    # What the annotation says comes back as the fault.
    held = pod("a", "bad", quarantined=DMA)
    assert health.QuarantinedPod.of(held).fault.describe() == DMA.describe()


def test_degraded_is_quiet_when_it_first_appears_healthy_and_speaks_on_a_fault_and_the_healing() -> None:
    def at(reason: Reason, status: bool) -> list[api.Condition]:
        return [
            api.Condition(
                type=ConditionType.DEGRADED,
                status="True" if status else "False",
                reason=reason,
                message="m",
                last_transition_time=T0,
                observed_generation=1,
            )
        ]

    assert transitions([], at(Reason.HEALTHY, False)) == []
    fault = transitions(at(Reason.HEALTHY, False), at(Reason.NEURON_DEVICE_FAULT, True))
    assert [(e.type, e.reason) for e in fault] == [("Warning", Reason.NEURON_DEVICE_FAULT)]
    healed = transitions(at(Reason.NEURON_DEVICE_FAULT, True), at(Reason.HEALTHY, False))
    assert [(e.type, e.reason) for e in healed] == [("Normal", Reason.HEALTHY)]
