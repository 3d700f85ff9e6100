"""The operator's cache: it never goes back to an older object, and it tells which applies would change nothing."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from neuronfleet.contract.names import LABEL_INSTANCE, LABEL_SERVICE
from neuronfleet.operator.cluster.cache import (
    APPLIED_ANNOTATION,
    ObjectCache,
    contains,
    digest,
    parse_selector,
    stamped,
    would_change,
)
from neuronfleet.operator.cluster.kube import CONFIGMAPS, DEPLOYMENTS, PODS

Obj = dict[str, Any]


def deployment(name: str, version: str, uid: str = "uid-1", **labels: str) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": version, "labels": labels},
        "spec": {"replicas": 1},
    }


INTENT: Obj = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "llama-engine", "namespace": "ns", "labels": {"a": "b"}},
    "data": {"engine.yaml": "max_num_seqs: 8\n"},
}


def test_an_intent_the_live_object_holds_with_server_fields_added_is_contained() -> None:
    applied = stamped(INTENT)
    live = {
        **applied,
        "metadata": {**applied["metadata"], "uid": "u", "resourceVersion": "7", "managedFields": [{}]},
    }
    assert contains(live, INTENT)
    assert not would_change(INTENT, live)


def test_a_changed_value_a_changed_list_or_a_missing_field_would_change_the_object() -> None:
    assert not contains({"a": [1, 2]}, {"a": [1, 2, 3]})
    assert not contains({"a": {"b": 1}}, {"a": {"b": 2}})
    assert not contains({"a": {}}, {"a": {"b": 1}})
    assert contains({"a": [{"x": 1, "y": 2}]}, {"a": [{"x": 1}]})
    assert would_change(INTENT, None)
    drifted = {**stamped(INTENT), "data": {"engine.yaml": "max_num_seqs: 4\n"}}
    assert would_change(INTENT, drifted)


def test_a_field_the_operator_stops_setting_is_applied_though_the_live_object_holds_the_rest() -> None:
    # The live object holds the label the new intent dropped: only the digest of the last apply tells.
    smaller = {**INTENT, "metadata": {**INTENT["metadata"], "labels": {}}}
    live = stamped(INTENT)
    assert contains(live, smaller)
    assert would_change(smaller, live)


def test_what_the_operator_applied_is_known_from_the_object_itself_so_a_restart_applies_nothing_again() -> None:
    live = stamped(INTENT)
    assert live["metadata"]["annotations"] == {APPLIED_ANNOTATION: digest(INTENT)}
    assert "annotations" not in INTENT["metadata"]
    assert not would_change(INTENT, live)
    # Made by hand, or by an operator that did not stamp: applied once.
    assert would_change(INTENT, {**INTENT})
    # The stamp says what was applied, not what the object holds: someone's edit of it is applied over.
    forged = {**live, "metadata": {**live["metadata"], "annotations": {APPLIED_ANNOTATION: "0" * 64}}}
    assert would_change(INTENT, forged)


def test_the_cache_keeps_the_newest_version_of_each_object() -> None:
    cache = ObjectCache()
    cache.observe(deployment("llama", "10"))
    cache.observe(deployment("llama", "9"))  # a late event, or a stale read
    found = cache.get(DEPLOYMENTS, "ns", "llama")
    assert found is not None
    assert found["metadata"]["resourceVersion"] == "10"
    cache.observe(deployment("llama", "11"))
    found = cache.get(DEPLOYMENTS, "ns", "llama")
    assert found is not None
    assert found["metadata"]["resourceVersion"] == "11"


def test_a_deletion_forgets_only_the_object_it_names() -> None:
    cache = ObjectCache()
    cache.observe(deployment("llama", "10", uid="new"))
    cache.forget(deployment("llama", "5", uid="old"))  # an earlier object of the same name
    assert cache.get(DEPLOYMENTS, "ns", "llama") is not None
    cache.forget(deployment("llama", "12", uid="new"))
    assert cache.get(DEPLOYMENTS, "ns", "llama") is None


def test_a_fresh_list_drops_what_was_deleted_unseen_but_keeps_what_is_newer_than_the_list() -> None:
    cache = ObjectCache()
    cache.observe(deployment("gone", "5"))
    cache.observe(deployment("kept", "6"))
    cache.observe(deployment("created-after-the-list", "30"))
    cache.replace(DEPLOYMENTS, "ns", [deployment("kept", "6")], version="20")
    assert [d["metadata"]["name"] for d in cache.list(DEPLOYMENTS, "ns")] == ["kept", "created-after-the-list"]


def test_lists_filter_by_namespace_kind_and_equality_selector() -> None:
    cache = ObjectCache()
    cache.observe(deployment("a", "1", app="x"))
    cache.observe(deployment("b", "2", app="y"))
    cache.observe(
        {
            **deployment("c", "3", app="x"),
            "metadata": {**deployment("c", "3", app="x")["metadata"], "namespace": "other"},
        }
    )
    assert [d["metadata"]["name"] for d in cache.list(DEPLOYMENTS, "ns", "app=x")] == ["a"]
    assert len(cache.list(DEPLOYMENTS, None, "app")) == 3
    assert cache.list(CONFIGMAPS, "ns") == []
    assert parse_selector("a=b,c") == {"a": "b", "c": None}


def pod(name: str, version: int, **labels: str) -> Obj:
    meta = {"name": name, "namespace": "ns", "uid": name, "resourceVersion": str(version), "labels": labels}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta}


LABELS = st.fixed_dictionaries(
    {},
    optional={
        LABEL_SERVICE: st.sampled_from(["llama", "mistral"]),
        LABEL_INSTANCE: st.sampled_from(["llama", "mistral"]),
        "app.kubernetes.io/component": st.sampled_from(["serving", "router"]),
    },
)
# Observe a pod (its labels may change from one version to the next, as a quarantine's do), or forget it.
STEPS = st.lists(st.tuples(st.sampled_from("abcdef"), st.booleans(), LABELS), max_size=40)


@given(STEPS)
def test_a_list_by_an_indexed_label_finds_what_a_scan_of_every_object_finds(steps: list[tuple[str, bool, Obj]]) -> None:
    cache = ObjectCache()
    latest: dict[str, Obj] = {}
    for version, (name, deleted, labels) in enumerate(steps, start=1):
        if deleted and name in latest:
            cache.forget(latest.pop(name))
        elif not deleted:
            latest[name] = pod(name, version, **labels)
            cache.observe(latest[name])
    for selector in (
        f"{LABEL_SERVICE}=llama",
        f"{LABEL_INSTANCE}=mistral,app.kubernetes.io/component=serving",
        f"{LABEL_SERVICE}=llama,{LABEL_INSTANCE}=llama",
        "app.kubernetes.io/component=router",
    ):
        wanted = parse_selector(selector)
        scanned = [
            body["metadata"]["name"]
            for body in latest.values()
            if all(body["metadata"]["labels"].get(key) == value for key, value in wanted.items())
        ]
        found = [body["metadata"]["name"] for body in cache.list(PODS, "ns", selector)]
        assert sorted(found) == sorted(scanned), selector


def test_the_cache_keeps_no_managed_fields_and_the_rest_of_the_object_as_it_came() -> None:
    cache = ObjectCache()
    live = deployment("llama", "7", app="x")
    live["metadata"]["managedFields"] = [{"manager": "neuronfleet", "operation": "Apply", "fieldsV1": {"f:spec": {}}}]
    cache.observe(live)
    found = cache.get(DEPLOYMENTS, "ns", "llama")
    assert found is not None
    assert "managedFields" not in found["metadata"]
    assert found == {**live, "metadata": {k: v for k, v in live["metadata"].items() if k != "managedFields"}}
    # What was handed in is left as it was (a write's caller still reads its answer whole).
    assert live["metadata"]["managedFields"]


def test_a_childs_read_is_a_copy_of_its_own_so_a_reader_cannot_change_the_cache() -> None:
    cache = ObjectCache()
    cache.observe(deployment("llama", "7", app="x"))
    read = cache.get(DEPLOYMENTS, "ns", "llama")
    assert read is not None
    read["spec"]["replicas"] = 5
    read["metadata"]["labels"]["app"] = "y"
    again = cache.get(DEPLOYMENTS, "ns", "llama")
    assert again == deployment("llama", "7", app="x")
    assert [d["metadata"]["name"] for d in cache.list(DEPLOYMENTS, "ns", "app=x")] == ["llama"]
