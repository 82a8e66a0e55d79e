"""Hosts without a required layer: the refusal is typed and nothing runs, never a degraded run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import policy_for

import stockade
from stockade.linux import backend, landlock, seccomp

pytestmark = pytest.mark.usefixtures("linux")


def refused(workspace, code: str) -> None:
    marker = workspace / "ran"
    with pytest.raises(stockade.UnavailableError) as info:
        stockade.run(["touch", str(marker)], policy_for(), workspace=workspace)
    assert info.value.code == code
    assert info.value.exit_code == 70
    assert not marker.exists()


def test_no_user_namespaces_for_real(ws):
    """The owner itself runs under a seccomp filter that forbids new namespaces, as on hosts
    that disable them: the launch fails at unshare and says so."""
    workspace, _ = ws
    marker = workspace / "ran"
    code = textwrap.dedent(f"""
        import stockade
        from stockade.linux import seccomp
        from conftest import policy_for
        import ctypes; ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # no_new_privs
        seccomp.install(seccomp.compile_filter())
        try:
            stockade.run(['touch', {str(marker)!r}], policy_for(), workspace={str(workspace)!r})
        except stockade.UnavailableError as exc:
            print(exc.code)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                          timeout=60)
    assert done.stdout.strip() == "userns_unavailable", done.stderr
    assert not marker.exists()


def test_user_namespaces_disabled_by_sysctl(ws, monkeypatch):
    workspace, _ = ws
    real = backend._read
    monkeypatch.setattr(backend, "_read", lambda path: "0" if path.endswith(
        "max_user_namespaces") else real(path))
    refused(workspace, "userns_unavailable")


def test_no_landlock(ws, monkeypatch):
    workspace, _ = ws
    monkeypatch.setattr(landlock, "abi_version", lambda: 0)
    refused(workspace, "landlock_unsupported")


def test_no_libseccomp(ws, monkeypatch):
    workspace, _ = ws

    def missing():
        raise stockade.UnavailableError("seccomp_unavailable", "libseccomp.so.2 not found")

    monkeypatch.setattr(backend, "_seccomp_program", missing)
    refused(workspace, "seccomp_unavailable")
    assert seccomp.compile_filter()  # the real library is still there for other tests
