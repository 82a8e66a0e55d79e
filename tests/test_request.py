"""LaunchRequest: canonical encoding, digest sensitivity, strict decoding; compile; manager."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import tempfile

import pytest
from conftest import only_backends

from stockade.errors import (
    PolicyError,
    RequestError,
    UnavailableError,
    UnenforceableError,
    UsageError,
)
from stockade.launch import manager, registry
from stockade.launch.compile import CompileContext, canonical_path, compile_policy, expand
from stockade.launch.request import MAX_FRAME, LaunchRequest, LimitSpec, NetworkSpec, PathGrant
from stockade.policy import preset


def base(**changes) -> LaunchRequest:
    fields = dict(
        argv=("make", "test"), cwd="/w", env=(("HOME", "/h"), ("PATH", "/usr/bin")),
        read=(PathGrant("/usr", "/usr"),), write=(PathGrant("/w", "/w"),),
        deny=(PathGrant("/h/.ssh", "/h/.ssh"),), protected=(".git",),
        network=NetworkSpec("none"), limits=LimitSpec(timeout=10.0, memory=1 << 30),
    )
    fields.update(changes)
    return LaunchRequest(**fields)


@pytest.mark.parametrize("change", [
    {"argv": ("make", "install")},
    {"cwd": "/w/sub"},
    {"env": (("HOME", "/h"), ("PATH", "/bin"))},
    {"read": (PathGrant("/opt", "/opt"),)},
    {"write": (PathGrant("/w2", "/w2"),)},
    {"deny": ()},
    {"protected": (".git", ".hg")},
    {"exec_from_write": True},
    {"network": NetworkSpec("allowlist", ("pypi.org",))},
    {"limits": LimitSpec(timeout=11.0, memory=1 << 30)},
    {"limits": LimitSpec(timeout=10.0, memory=1 << 30, pids=5)},
    {"stdin": "inherit"},
])
def test_digest_changes_with_anything_that_changes_what_runs(change):
    assert base(**change).digest != base().digest


def test_the_encoding_is_that_of_dataclasses_asdict():
    request = base(network=NetworkSpec("allowlist", ("pypi.org",), ("x.org",)),
                   limits=LimitSpec(1.5, 2, 0.5, 3, 4, 5), exec_from_write=True)
    assert json.loads(request.encode()) == json.loads(json.dumps(dataclasses.asdict(request)))


def test_digest_ignores_the_request_id_and_is_stable():
    a, b = base(), base()
    assert a.request_id != b.request_id
    assert a.digest == b.digest and len(a.digest) == 64


def test_compile_sorts_env_and_set_members_so_order_does_not_matter(tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "ws").mkdir()
    ctx = CompileContext(str(tmp_path / "ws"), str(tmp_path / "home"), str(tmp_path),
                         {"PATH": "/usr/bin", "HOME": "/h", "LANG": "C"})
    p1 = preset("workspace-write")
    fs = p1.filesystem
    p2 = dataclasses.replace(p1, filesystem=dataclasses.replace(
        fs, read=tuple(reversed(fs.read)), protected=tuple(reversed(fs.protected))),
        env=dataclasses.replace(p1.env, passthrough=tuple(reversed(p1.env.passthrough))))
    r1, r2 = compile_policy(p1, ["true"], ctx), compile_policy(p2, ["true"], ctx)
    assert r1.digest == r2.digest
    assert [k for k, _ in r1.env] == sorted(k for k, _ in r1.env)


def test_encode_decode_round_trip():
    request = base()
    assert LaunchRequest.decode(request.encode()) == request


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b.update(extra=1), "unknown request field 'extra'"),
    (lambda b: b.update(version=2), "unsupported request version"),
    (lambda b: b.pop("cwd"), "missing request field 'cwd'"),
    (lambda b: b["limits"].update(gpu=1), "unknown field limits.gpu"),
    (lambda b: b.update(argv=[]), "argv is empty"),
    (lambda b: b.update(argv=[1]), "argv items must be strings"),
    (lambda b: b.update(env=[["PATH", "/x"], ["HOME", "/h"]]), "env must be sorted"),
])
def test_decode_rejects_malformed_requests(mutate, message):
    body = json.loads(base().encode())
    mutate(body)
    with pytest.raises(RequestError, match=message):
        LaunchRequest.decode(json.dumps(body).encode())


def test_decode_rejects_oversized_frames_and_garbage():
    with pytest.raises(RequestError, match="exceeds"):
        LaunchRequest.decode(b" " * (MAX_FRAME + 1))
    with pytest.raises(RequestError, match="not valid JSON"):
        LaunchRequest.decode(b"\xff{")


def test_compile_records_canonical_target_and_lexical_alias(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "alias")
    ctx = CompileContext(str(tmp_path), str(tmp_path), str(tmp_path), {})
    policy = preset("read-only")
    policy = dataclasses.replace(policy, filesystem=dataclasses.replace(
        policy.filesystem, read=policy.filesystem.read + ("alias/../alias",)))
    request = compile_policy(policy, ["true"], ctx)
    grant = next(g for g in request.read if g.path == str(real))
    assert grant.alias == str(tmp_path / "alias")


def test_tmp_placeholder_without_a_given_temp_dir_is_the_hosts(tmp_path, monkeypatch):
    """CompileContext.current() leaves `tmp` to be looked up only when a path uses it."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # (tempfile caches what it found)
    ctx = CompileContext.current(tmp_path)
    assert ctx.tmp is None
    assert expand("{tmp}/x", ctx) == str(tmp_path / "x")


def test_compile_refuses_a_root_inside_a_denied_path(tmp_path):
    (tmp_path / "d" / "x").mkdir(parents=True)
    ctx = CompileContext(str(tmp_path), str(tmp_path), str(tmp_path), {})
    policy = preset("read-only")
    policy = dataclasses.replace(policy, filesystem=dataclasses.replace(
        policy.filesystem, read=policy.filesystem.read + ("d/x",), deny=("d",)))
    with pytest.raises(PolicyError, match="lies inside denied path"):
        compile_policy(policy, ["true"], ctx)


def test_an_empty_argument_is_valid_argv_and_each_refusal_names_the_argument(tmp_path):
    ctx = CompileContext(str(tmp_path), str(tmp_path), str(tmp_path), {})
    request = compile_policy(preset("read-only"), ["ssh-keygen", "-N", "", "-f", "k"], ctx)
    assert request.argv == ("ssh-keygen", "-N", "", "-f", "k")
    assert LaunchRequest.decode(request.encode()).argv == request.argv
    for argv, message in (
            ("echo hi", "not a string (a string is run by a shell only with shell=True)"),
            ([], "argv is empty: it must name a command"),
            (["", "x"], "argv[0], the command, is an empty string"),
            (["echo", 3], "argv[1] must be a string, got an integer"),
            (["echo", "a\0b"], "argv[1] contains a NUL byte")):
        with pytest.raises(UsageError, match=re.escape(message)):
            compile_policy(preset("read-only"), argv, ctx)


def test_compile_refuses_a_cwd_outside_every_root(tmp_path):
    ctx = CompileContext(str(tmp_path), str(tmp_path), str(tmp_path), {})
    with pytest.raises(PolicyError, match="process.cwd: working directory"):
        compile_policy(preset("read-only"), ["true"], ctx, cwd="/")


class _Refusing(manager.Backend):
    name = "refusing"

    def __init__(self, error):
        self.error = error
        self.spawned = False

    def probe(self):
        if isinstance(self.error, UnavailableError):
            raise self.error

    def check(self, request):
        if isinstance(self.error, UnenforceableError):
            raise self.error

    def spawn(self, request, stdio):  # pragma: no cover - must never be reached
        self.spawned = True
        raise AssertionError("spawned despite a refusal")

    def report(self):
        return []


@pytest.mark.parametrize("error", [
    UnavailableError("backend_unavailable", "no backend"),
    UnenforceableError("network.allowlist", "no proxy"),
])
def test_manager_refuses_and_never_runs_when_no_backend_can_enforce(monkeypatch, error):
    backend = _Refusing(error)
    only_backends(monkeypatch, backend)
    for mode, name in (("auto", None), ("require", "refusing")):
        with pytest.raises(type(error)) as info:
            manager.SandboxManager(name, mode).run(base())
        assert info.value.code == error.code and info.value.exit_code == 70
    assert not backend.spawned


def test_the_native_backend_comes_first_and_auto_picks_it_over_windows_here():
    assert registry.names(registry.NATIVE) == ["linux", "windows"]
    assert registry.native().name == "linux"
    assert [e.name for e in registry.here(registry.NATIVE)] == ["linux"]  # auto tries no other
    with pytest.raises(UnavailableError) as refused:
        manager.SandboxManager("windows", "require").select(base())
    assert refused.value.code == "backend_unavailable"


def test_auto_keeps_the_best_backends_refusal_when_all_refuse(monkeypatch):
    best, other = (UnenforceableError("network.allowlist", "no proxy"),
                   UnavailableError("backend_unavailable", "not this platform"))
    first, second = _Refusing(best), _Refusing(other)
    second.name = "other"
    only_backends(monkeypatch, first, second)
    with pytest.raises(UnenforceableError) as refused:
        manager.SandboxManager().select(base())
    assert refused.value is best


def test_a_backend_whose_import_fails_is_a_typed_refusal_and_auto_tries_only_this_host(
        monkeypatch):
    def missing() -> type:
        import stockade_no_such_module  # noqa: F401 -- as a backend needing what this host lacks

        raise AssertionError("imported")

    registry.entries()
    monkeypatch.setattr(registry, "ENTRIES", {
        "broken": registry.Entry("broken", registry.NATIVE, (sys.platform,), missing),
        "elsewhere": registry.Entry("elsewhere", registry.NATIVE, ("another-os",), missing)})
    with pytest.raises(UnavailableError) as refused:
        manager.SandboxManager().select(base())
    assert refused.value.code == "backend_unavailable" and refused.value.exit_code == 70
    assert "broken backend cannot be loaded" in refused.value.message
    assert "ModuleNotFoundError" in refused.value.message
    monkeypatch.setitem(registry.ENTRIES, "broken", registry.Entry(
        "broken", registry.NATIVE, ("another-os",), missing))
    with pytest.raises(UnavailableError, match="no backend for containment \"native\" runs on "
                                               "this host"):
        manager.SandboxManager().select(base())


def test_manager_reports_unknown_backends_and_modes():
    with pytest.raises(UnavailableError, match="unknown backend 'qemu'"):
        manager.SandboxManager("qemu", "require")
    with pytest.raises(Exception, match="mode must be"):
        manager.SandboxManager(None, "fallback")


def test_unsandboxed_is_refused_for_any_restricting_policy():
    with pytest.raises(UnenforceableError) as info:
        manager.run_unsandboxed(["true"], preset("read-only"))
    assert info.value.code == "unenforceable:unsandboxed"


def test_canonical_path_is_realpath_strict(tmp_path):
    """canonical_path (what compile resolves every root with) answers as
    os.path.realpath(strict=True) does: through absolute, relative and chained links, for
    directories and files, and an OSError for a missing path or a dangling link."""
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "real" / "file").write_text("x")
    (tmp_path / "abs").symlink_to(tmp_path / "real")
    (tmp_path / "rel").symlink_to("real/sub")
    (tmp_path / "chain").symlink_to("abs")
    (tmp_path / "dangling").symlink_to("nowhere")
    for path in ("real", "abs", "rel", "chain", "chain/sub", "abs/file", "chain/file", "."):
        full = os.path.join(tmp_path, path)
        assert canonical_path(full) == os.path.realpath(full, strict=True), path
    for path in ("missing", "dangling", "abs/missing"):
        with pytest.raises(OSError):
            canonical_path(os.path.join(tmp_path, path))

