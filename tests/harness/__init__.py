"""The test harness: pytest fixtures and helpers for the tests alone (no package ships them).

``tests`` is on pytest's ``pythonpath``, so tests import these as ``harness.<module>``.
"""
