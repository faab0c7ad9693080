"""The server process's own limits that need no connection to check: the descriptor limit
it raises at start-up and the connection cap kept below it."""

from __future__ import annotations

import resource

from service.server import RESERVED_DESCRIPTORS, connection_cap, raise_descriptor_limit


def test_the_open_file_limit_is_raised_to_the_hard_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 512), hard))
        raised = raise_descriptor_limit()
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == raised
        assert raised == hard or hard == resource.RLIM_INFINITY
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_connection_cap_is_the_setting_when_descriptors_allow_it():
    assert connection_cap(2048, 65536) == 2048


def test_the_connection_cap_stays_below_the_descriptor_limit_by_the_reserve():
    assert connection_cap(2048, 1024) == 1024 - RESERVED_DESCRIPTORS
