"""Persistent Python sessions: state kept between calls, errors, limits and endings."""

from __future__ import annotations

import pytest

from parity.sandboxes import Sandbox, SandboxError

pytestmark = pytest.mark.timeout(120)


def test_state_persists_and_last_expression_is_echoed(sb: Sandbox) -> None:
    with sb.python_session() as sess:
        assert sess.run("x = 20").stdout == ""
        assert sess.run("def f(y):\n    return x + y").exit_code == 0
        r = sess.run("f(22)")
        assert (r.exit_code, r.stdout) == (0, "42\n")
        assert sess.run("print('a'); None").stdout == "a\n"


def test_exception_keeps_the_session(sb: Sandbox) -> None:
    sess = sb.python_session()
    sess.run("x = 1")
    r = sess.run("1 / 0")
    assert r.exit_code == 1 and r.error is None
    assert "ZeroDivisionError: division by zero" in r.stderr
    assert sess.run("print(x)").stdout == "1\n"
    sess.close()
    sess.close()


def test_sessions_are_independent(sb: Sandbox) -> None:
    a, b = sb.python_session(), sb.python_session()
    a.run("v = 'a'")
    b.run("v = 'b'")
    assert (a.run("v").stdout, b.run("v").stdout) == ("'a'\n", "'b'\n")


def test_timeout_ends_the_session(sb: Sandbox) -> None:
    sess = sb.python_session()
    sess.run("x = 1")
    r = sess.run("while True: pass", timeout_s=1)
    assert r.timed_out and r.error is not None and "state is lost" in r.error
    with pytest.raises(SandboxError, match="session has ended"):
        sess.run("print(x)")
    assert sb.run(["echo", "ok"]).stdout == "ok\n"  # the sandbox itself is fine


def test_exit_ends_the_session(sb: Sandbox) -> None:
    sess = sb.python_session()
    r = sess.run("import sys; sys.exit(3)")
    assert r.exit_code == 3 and r.error is not None
    with pytest.raises(SandboxError, match="session has ended"):
        sess.run("1")


def test_output_cap_in_session(sb: Sandbox) -> None:
    sess = sb.python_session()
    r = sess.run("while True: print('z' * 100)")
    assert r.output_truncated and len(r.stdout) == sb.limits.output_bytes


def test_session_files_shared_with_run(sb: Sandbox) -> None:
    sess = sb.python_session()
    sess.run("open('from_session.txt', 'w').write('hi')")
    assert sb.read_file("from_session.txt") == b"hi"


def test_session_after_sandbox_close_raises(sb: Sandbox) -> None:
    sess = sb.python_session()
    sb.close()
    with pytest.raises(SandboxError, match="closed"):
        sess.run("1")
    sess.close()
