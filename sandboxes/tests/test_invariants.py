"""Property tests: what goes in on stdin comes back (decoded, capped) on stdout."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parity.sandboxes import Limits, Sandbox, open_sandbox

pytestmark = pytest.mark.timeout(300)
CAP = 2048


@pytest.fixture(scope="module")
def cat_box() -> Iterator[Sandbox]:
    with open_sandbox("local", Limits(timeout_s=10, output_bytes=CAP)) as sb:
        yield sb


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=3 * CAP))
def test_stdout_is_stdin_decoded_and_capped(cat_box: Sandbox, data: bytes) -> None:
    r = cat_box.run(["cat"], stdin=data)
    assert r.stdout == data[:CAP].decode("utf-8", errors="replace")
    assert r.output_truncated == (len(data) > CAP)
    assert r.timed_out is False and r.oom is False


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(code=st.integers(min_value=0, max_value=255))
def test_exit_codes_round_trip(cat_box: Sandbox, code: int) -> None:
    assert cat_box.run(["sh", "-c", f"exit {code}"]).exit_code == code
