"""deploy/agent-sandbox/ holds what its README says: the pod settings `stockade doctor` names
for the full backend, a seccomp profile that refuses none of the calls the sandbox is made
with, a Landlock-tier template, and an image whose command is a valid `stockade serve`. (No
cluster runs here: these check the files, not a pod.)"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import yaml

from stockade.cli import build_parser
from stockade.linux.doctor import CONTAINER_SYSCALLS

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "agent-sandbox"


def documents() -> dict[tuple[str, str], dict]:
    found = yaml.safe_load_all((DEPLOY / "sandbox-template.yaml").read_text())
    return {(d["kind"], d["metadata"]["name"]): d for d in found}


def image_command() -> list[str]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith("CMD "))
    return json.loads(line.removeprefix("CMD "))


def test_the_full_backends_template_has_the_settings_doctor_names():
    pod = documents()[("SandboxTemplate", "stockade")]["spec"]["podTemplate"]["spec"]
    [container] = pod["containers"]
    assert pod["hostUsers"] is False and pod["automountServiceAccountToken"] is False
    context = container["securityContext"]
    assert context["procMount"] == "Unmasked"
    assert context["seccompProfile"] == {"type": "Localhost",
                                         "localhostProfile": "stockade-seccomp.json"}
    assert context["appArmorProfile"] == {"type": "Unconfined"}
    assert container["ports"] == [{"containerPort": 8888}]
    profile = json.loads((DEPLOY / "stockade-seccomp.json").read_text())
    denied = {name for rule in profile["syscalls"] if rule["action"] != "SCMP_ACT_ALLOW"
              for name in rule["names"]}
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW" and denied
    assert not denied & {*CONTAINER_SYSCALLS, "clone3", "landlock_create_ruleset",
                         "landlock_add_rule", "landlock_restrict_self", "seccomp"}


def test_the_landlock_template_and_the_pool_and_the_image_command():
    found = documents()
    landlock = found[("SandboxTemplate", "stockade-landlock")]["spec"]["podTemplate"]["spec"]
    [container] = landlock["containers"]
    assert "hostUsers" not in landlock
    assert container["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert found[("SandboxWarmPool", "stockade")]["spec"]["sandboxTemplateRef"] == {
        "name": "stockade"}
    for argv in (image_command(), container["args"]):
        assert argv[:3] == ["stockade", "serve", "--agent-sandbox"], shlex.join(argv)
        args = build_parser("serve").parse_args(argv[1:])
        assert (args.host, args.allow_remote, args.port, args.workspace) == (
            "0.0.0.0", True, 8888, "/app")
    assert build_parser("serve").parse_args(container["args"][1:]).isolation == "landlock"
