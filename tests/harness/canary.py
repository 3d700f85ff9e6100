"""The canary analysis' latency checks as the operator words them, read back as figures.

Each check reads "TTFT p99 41 ms = 2.10x the stable's 19 ms (limit 12x)", in the canary's ``analysis`` while it
runs or once promoted, and in the service's message when a check aborts it.
"""

from __future__ import annotations

import re

_LATENCY_CHECK = re.compile(r"(TTFT|ITL) p99 \d+ ms = ([\d.]+)x the stable's \d+ ms \(limit (\d+)x\)")

#: Latency limits (canary p99 over the stable's) that a good canary passes on the rig with room to spare and a
#: device 6x slower breaks: good canaries measured up to 5.2x (two cores, four engines, the load; a fresh replica's
#: first requests up to 3.9x), a 6x-slower device 30x (``test_promises_under_load``).
GOOD_CANARY_LATENCY_LIMIT = 12


def latency_checks(text: str) -> list[tuple[str, float, int]]:
    """Each latency check ``text`` states: the figure's name (TTFT, ITL), its ratio and its limit."""
    return [(name, float(ratio), int(limit)) for name, ratio, limit in _LATENCY_CHECK.findall(text)]
