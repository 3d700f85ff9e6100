"""The local control plane's parts: components, PKI, KWOK and its fake fleet, a small API client, object readers."""
