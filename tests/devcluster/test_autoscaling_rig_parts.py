"""The autoscaling rig's pure parts: the adapter's objects, KEDA's certificates, the scrape job (no cluster)."""

from __future__ import annotations

import base64
import ipaddress
from pathlib import Path

from cryptography import x509

from neuronfleet.devcluster.addons.autoscaling_rig import (
    ADAPTER_SERVICE,
    KEDA_NAMESPACE,
    KedaCerts,
    adapter_objects,
    prometheus_config,
)
from neuronfleet.devcluster.realnode.node import NODE_IP


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _alt_names(cert: x509.Certificate) -> set[str]:
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(n) for n in names.get_values_for_type(x509.IPAddress)} | set(names.get_values_for_type(x509.DNSName))


def test_the_apiservice_is_backed_by_the_adapter_on_the_node_address() -> None:
    service, endpoints, api_service = adapter_objects(4567, b"the CA")
    assert (service["metadata"]["name"], service["metadata"]["namespace"]) == (ADAPTER_SERVICE, KEDA_NAMESPACE)
    assert "selector" not in service["spec"]  # its endpoints are the rig's, not a pod's
    assert service["spec"]["ports"][0]["targetPort"] == 4567
    assert endpoints["metadata"]["labels"]["kubernetes.io/service-name"] == ADAPTER_SERVICE
    assert endpoints["endpoints"][0]["addresses"] == [NODE_IP]
    assert endpoints["ports"][0]["port"] == 4567
    spec = api_service["spec"]
    assert spec["service"] == {"name": ADAPTER_SERVICE, "namespace": KEDA_NAMESPACE, "port": 443}
    assert (spec["group"], spec["version"]) == ("external.metrics.k8s.io", "v1beta1")
    assert base64.b64decode(spec["caBundle"]) == b"the CA"


def test_keda_certs_name_where_each_side_is_dialed_and_share_one_ca(tmp_path: Path) -> None:
    certs = KedaCerts.issue(tmp_path)
    ca = _cert(certs.ca)
    for directory in (certs.operator_dir, certs.adapter_dir):
        assert sorted(p.name for p in directory.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
        assert (directory / "ca.crt").read_bytes() == certs.ca.read_bytes()
        _cert(directory / "tls.crt").verify_directly_issued_by(ca)
    # The adapter dials the operator's gRPC service at 127.0.0.1; the aggregator dials the adapter by Service name.
    assert _alt_names(_cert(certs.operator_dir / "tls.crt")) == {"127.0.0.1"}
    serving = _cert(certs.adapter_serving.cert)
    assert _alt_names(serving) == {f"{ADAPTER_SERVICE}.{KEDA_NAMESPACE}.svc", str(ipaddress.ip_address(NODE_IP))}
    serving.verify_directly_issued_by(ca)


def test_the_scrape_job_keeps_the_selected_running_pods_at_the_named_port() -> None:
    config = prometheus_config(Path("/k/admin.kubeconfig"), "app=gauge", "http", "2s")
    assert config["global"]["scrape_interval"] == "2s"
    (job,) = config["scrape_configs"]
    (discovery,) = job["kubernetes_sd_configs"]
    assert discovery == {
        "role": "pod",
        "kubeconfig_file": "/k/admin.kubeconfig",
        "selectors": [{"role": "pod", "label": "app=gauge"}],
    }
    keeps = {tuple(r["source_labels"]): r["regex"] for r in job["relabel_configs"] if r.get("action") == "keep"}
    copied = {r["source_labels"][0]: r["target_label"] for r in job["relabel_configs"] if "target_label" in r}
    assert copied["__meta_kubernetes_pod_label_neuronfleet_io_service"] == "neuronfleet_io_service"
    assert keeps == {
        ("__meta_kubernetes_pod_container_port_name",): "http",
        ("__meta_kubernetes_pod_phase",): "Running",
    }
