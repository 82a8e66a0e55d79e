"""At launch, on the host: each credential's secret read from where the policy says, and the
launch's CA made, for the proxy (stockade/net/inspect.py, stockade/net/authority.py).

The secret goes to the proxy's memory only: never into the request (which the sandbox's pid 1
reads), the command's environment, or a file in its view. What the command gets instead: its
placeholder (compiled into the request's environment) and, to trust the interception, the CA's
certificate in a directory of its view and the variables naming it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace

from stockade.errors import PolicyError
from stockade.launch.request import CredentialSpec, LaunchRequest, PathGrant
from stockade.net.authority import Authority
from stockade.net.inspect import Injection, Inspector, secret_forms

MAX_SECRET_BYTES = 64 * 1024


def prepare(request: LaunchRequest, environ: Mapping[str, str],
            ) -> tuple[LaunchRequest, Inspector, Authority]:
    """The request with the CA's bundle granted and named, the proxy's inspector (secrets
    read now), and the authority (its `close()` removes the bundle)."""
    network = request.network
    injections = [Injection(spec.name, spec.host, spec.placeholder, _secret(spec, i, environ),
                            spec.header, spec.prefix, spec.basic_user, spec.query)
                  for i, spec in enumerate(network.credentials)]
    for injection in injections:
        # (the forms the proxy cuts from responses: base64 inside a basic-auth header value a
        # passed variable holds is the secret too, issue 34 E1)
        forms = secret_forms(injection)
        for name, value in request.env:
            lowered = value.encode("utf-8", "surrogateescape").lower()
            if any(form in lowered for form in forms):
                raise PolicyError(f"the sandbox's variable {name} holds the secret of credential "
                                  f"{injection.name!r}", key="network.credentials",
                                  code="credential_exposed")
    authority = Authority(request.request_id[:8])
    directory = authority.write_bundle()
    grants = (*request.read, PathGrant(directory, directory))
    return (replace(request, env=tuple(sorted((dict(request.env) | authority.environment())
                                              .items())),
                    read=tuple(sorted(grants, key=lambda grant: grant.path))),
            Inspector(injections, network.http),
            authority)


def _secret(spec: CredentialSpec, index: int, environ: Mapping[str, str]) -> str:
    """The secret, stripped of surrounding white space; a typed refusal (naming the key, never
    the value) when it is missing, unreadable, empty, or not fit for a request."""
    key = f"network.credentials[{index}]." + ("from_env" if spec.from_env else "from_file")
    if spec.from_env:
        if spec.from_env not in environ:
            raise PolicyError(f"credential {spec.name!r}: variable {spec.from_env} is not set in "
                              "the caller's environment", key=key, code="credential_unavailable")
        text = environ[spec.from_env]
    else:
        try:
            with open(os.open(spec.from_file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC),
                      "rb") as handle:
                data = handle.read(MAX_SECRET_BYTES + 1)
        except OSError as exc:
            raise PolicyError(f"credential {spec.name!r}: cannot read {spec.from_file} "
                              f"({exc.strerror})", key=key,
                              code="credential_unavailable") from None
        if len(data) > MAX_SECRET_BYTES:
            raise PolicyError(f"credential {spec.name!r}: {spec.from_file} is over "
                              f"{MAX_SECRET_BYTES} bytes", key=key, code="credential_invalid")
        text = data.decode("latin-1")
    text = text.strip()
    if not text:
        raise PolicyError(f"credential {spec.name!r}: the secret is empty", key=key,
                          code="credential_unavailable")
    if not all(" " <= c <= "~" for c in text):
        raise PolicyError(f"credential {spec.name!r}: the secret holds a character other than "
                          "printable ASCII, which a request header cannot carry", key=key,
                          code="credential_invalid")
    return text
