"""Requests attributed to the endpoint their connection reached, from conntrack's events (``harness.connections``)."""

from __future__ import annotations

from harness.connections import OPEN_WITHIN_S, Connection, match_requests, parse_events

#: What ``conntrack -E -e NEW -o timestamp`` printed on the real node for three requests to a Service, then at exit.
EVENTS = """\
[1796640912.511680]\t    [NEW] tcp      6 120 SYN_SENT src=10.240.255.254 dst=10.96.34.230 sport=36712 dport=8000 \
[UNREPLIED] src=10.245.0.6 dst=10.245.0.1 sport=8000 dport=22976
[1796640912.827063]\t    [NEW] tcp      6 120 SYN_SENT src=10.240.255.254 dst=10.96.34.230 sport=36716 dport=8000 \
[UNREPLIED] src=10.245.0.6 dst=10.245.0.1 sport=8000 dport=25261
[1796640913.160264]\t    [NEW] tcp      6 120 SYN_SENT src=10.240.255.254 dst=10.96.34.230 sport=36728 dport=8000 \
[UNREPLIED] src=10.245.0.5 dst=10.245.0.1 sport=8000 dport=8055
conntrack v1.4.7 (conntrack-tools): 3 flow events have been shown.
"""


def test_each_new_connection_is_read_with_its_time_client_port_and_the_endpoint_it_was_sent_to() -> None:
    assert parse_events(EVENTS) == [
        Connection(1796640912.511680, 36712, "10.245.0.6"),
        Connection(1796640912.827063, 36716, "10.245.0.6"),
        Connection(1796640913.160264, 36728, "10.245.0.5"),
    ]


def test_a_request_that_knows_its_port_gets_that_connection_whatever_its_time() -> None:
    connections = parse_events(EVENTS)
    assert match_requests([(0.0, 36728), (0.0, 36712)], connections) == [connections[2], connections[0]]


def test_a_refused_request_gets_the_first_unclaimed_connection_opened_after_it_was_sent() -> None:
    first, second, third = parse_events(EVENTS)
    # The second request was refused (no port): the connection opened just after it, not the first request's.
    requests = [(1796640912.51, 36712), (1796640912.82, None), (1796640913.15, 36728)]
    assert match_requests(requests, [first, second, third]) == [first, second, third]
    # Two refused ones sent together take a connection each, in order.
    assert match_requests([(1796640912.5, None), (1796640912.5, None)], [first, second]) == [first, None]
    assert match_requests([(1796640912.8, None), (1796640912.8, None)], [second, Connection(1796640912.9, 1, "x")]) == [
        second,
        Connection(1796640912.9, 1, "x"),
    ]


def test_a_request_with_no_connection_opened_soon_enough_after_it_is_left_unattributed() -> None:
    (first, *_) = parse_events(EVENTS)
    assert match_requests([(first.opened_at - OPEN_WITHIN_S - 0.01, None)], [first]) == [None]
    assert match_requests([(first.opened_at + 0.01, None)], [first]) == [None]
