#!/usr/bin/env bash
# Install what the tests need and run the whole suite. As root (on a Debian-like machine) it
# first installs the system packages: Python's venv, git and a C compiler (tools the sandbox must
# not break), libseccomp, pasta and nftables (network "any"), bubblewrap (benchmarks), QEMU, a
# kernel with 9p and a static busybox (VM containment), and mingw-w64 (the Windows backend's ABI checked against the SDK's
# headers). Then a virtual environment with Stockade and its test tools, ruff,
# and the suite. As root, the suite also runs as an unprivileged user (created if missing),
# from a world-readable copy, at the same time, because most users are not root: both must pass.
# Every Linux test must run: on Linux a test that cannot fails with its reason, never skips.
# The suite also installs Stockade as a new user would (the README's step 1, not editable, in a
# fresh copy) and runs the demo, the documentation's examples and the evidence matrix from it.
# Then the integrations (tests/integrations): Stockade's wheel is built (scripts/build_wheel.sh)
# and installed with every framework it adapts, binaries only and with no compiler on PATH, into
# .venv-integrations (and the MCP Inspector's CLI from npm, pinned, into .mcp-inspector); their
# tests run against that install, beside the suites.
#
# The test venv is .venv-test, never the README's step-1 .venv, which may have been made by
# another python3 (a venv made over another interpreter's breaks both). `--setup-only` makes
# that venv and stops: no system packages, no suite (tests/test_docs.py runs it so).
set -euo pipefail
# The suites run as a new user's shell runs them: a developer's PYTHONUNBUFFERED once hid a
# test that blocked forever reading a child's buffered first line.
unset PYTHONUNBUFFERED PYTHONDONTWRITEBYTECODE

here="$(cd "$(dirname "$0")/.." && pwd)"
python="${STOCKADE_PYTHON:-$(command -v /usr/bin/python3 || command -v python3)}"
test_user="${STOCKADE_TEST_USER:-stockade-test}"
venv=.venv-test

setup() {  # setup DIR: a venv in DIR/$venv with Stockade and the test tools
    local interpreter
    interpreter="$("$python" -c 'import os, sys; print(os.path.realpath(sys.executable))')"
    if [ "$(realpath "$1/$venv/bin/python" 2>/dev/null)" != "$interpreter" ]; then
        rm -rf "${1:?}/$venv"  # made by another interpreter (or not at all): made afresh
    fi
    "$python" -m venv "$1/$venv"
    "$1/$venv/bin/pip" install --quiet --disable-pip-version-check -e "$1[test]"
}

# A second MCP client, nobody's here: the MCP Inspector's CLI (npm; its newest releases need
# Node >= 22, this one runs on 20), in DIR/.mcp-inspector beside the venv (npm's cache kept).
MCP_INSPECTOR=@modelcontextprotocol/inspector@0.15.0

integrations_setup() {  # integrations_setup DIR: the wheel and DIR/.venv-integrations from it
    local wheel
    wheel="$(bash "$here/scripts/build_wheel.sh" "$1/dist" | tail -1)"
    rm -rf "${1:?}/.venv-integrations"
    "$python" -m venv "$1/.venv-integrations"
    env PATH="$1/.venv-integrations/bin" "$1/.venv-integrations/bin/pip" install --quiet \
        --disable-pip-version-check --only-binary :all: "$wheel[integrations-test]"
    chmod -R a+rX "$1/.venv-integrations"
    if [ "$(cat "$1/.mcp-inspector/pinned" 2>/dev/null)" != "$MCP_INSPECTOR" ]; then
        rm -rf "${1:?}/.mcp-inspector"
        npm install --silent --no-audit --no-fund --prefix "$1/.mcp-inspector" "$MCP_INSPECTOR"
        echo "$MCP_INSPECTOR" >"$1/.mcp-inspector/pinned"
    fi
    chmod -R a+rX "$1/.mcp-inspector"
}

integrations() {  # integrations DIR VENV_DIR [runner...]: the integration tests, from the wheel
    (cd "$1" && "${@:3}" "$2/.venv-integrations/bin/python" -P -m pytest -q -rs \
        -o asyncio_mode=auto -o asyncio_default_fixture_loop_scope=function \
        -p no:cacheprovider tests/integrations)
}

suite() {  # suite DIR [runner...]: lint, then the tests (explicit &&: errexit is off in a ||)
    (cd "$1" && "${@:2}" "$venv/bin/ruff" check --no-cache stockade tests \
        && "${@:2}" "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider)
}

if [ "${1:-}" = --setup-only ]; then
    setup "$here"
    exit 0
fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3-venv git gcc libc6-dev libseccomp2 \
        bubblewrap qemu-system-x86 linux-image-amd64 busybox-static mingw-w64 passt nftables \
        iproute2 >/dev/null
    # (npm, for the MCP Inspector: the machine's own Node.js where it has one)
    command -v npm >/dev/null || apt-get install -y -qq --no-install-recommends npm >/dev/null
fi

setup "$here"
if [ "$(id -u)" != 0 ]; then
    echo "== tests as $(id -un)"
    integrations_setup "$here" >"$here/.integrations-setup.log" 2>&1 &
    made=$!
    suite "$here"
    wait "$made" || { cat "$here/.integrations-setup.log"; exit 1; }
    echo "== integration tests as $(id -un)"
    integrations "$here" "$here"
    exit 0
fi

# As root, the rootless run goes alongside the root run (the suite waits on sandboxes far more
# than it computes: together they take little longer than the longer one). Each line says whose.
id "$test_user" >/dev/null 2>&1 || useradd --create-home --shell /bin/sh "$test_user"
copy="$(mktemp -d /tmp/stockade-rootless.XXXXXX)"
trap 'rm -rf "$copy"' EXIT
(cd "$here" && git ls-files -z --cached --others --exclude-standard \
    | xargs -0 cp --parents -t "$copy" 2>/dev/null) || cp -a "$here/." "$copy/"
rm -rf "$copy/.venv" "$copy/$venv"
setup "$copy"
chmod -R a+rX "$copy"
chown -R "$test_user" "$copy"
# A setuid binary owned by another user: the rootless run checks it grants nothing.
install -o 65534 -g 65534 -m 4755 "$(command -v id)" "$copy/.setuid-id"
# A directory of another user's that the rootless run may enter and write but not list
# (outside the copy: a write root inside the code the host runs is refused).
unlisted="$(mktemp -d /tmp/stockade-unlisted.XXXXXX)"
trap 'rm -rf "$copy" "$unlisted"' EXIT
chmod 755 "$unlisted"
install -d -o 65534 -g 65534 -m 0733 "$unlisted/dir"
ln -s dir/linked "$unlisted/link"  # (root's link to a directory the rootless run makes there)
# Another user's directory this user may not search, a part of it bound where it may read.
install -d -o 65534 -g 65534 -m 0700 "$unlisted/nob" "$unlisted/nob/keys"
chmod 755 "$unlisted/nob/keys"
echo unsearched-bind-secret >"$unlisted/nob/keys/id"
chmod 644 "$unlisted/nob/keys/id"
mkdir -p "$unlisted/ro/view" "$unlisted/mine/m" "$unlisted/nob/inner"
mount --bind "$unlisted/nob/keys" "$unlisted/ro/view"
mount --bind "$unlisted/nob/keys" "$unlisted/nob/inner"  # (out of the rootless run's reach)
# ... and bound below a directory of the rootless user's (which its test makes mode 000 while
# it runs: a launch reading the whole tree meanwhile would be refused).
mount --bind "$unlisted/nob/keys" "$unlisted/mine/m"
chown "$test_user" "$unlisted/mine"
trap 'umount -l "$unlisted/ro/view" "$unlisted/mine/m" "$unlisted/nob/inner"
      rm -rf "$copy" "$unlisted"' EXIT
# The integrations (their set-up, then their tests, root and rootless) run beside the suites.
(
    integrations_setup "$copy" >"$copy/integrations-setup.log" 2>&1 \
        || { cat "$copy/integrations-setup.log"; exit 1; }
    integrations "$copy" "$copy" runuser -u "$test_user" -- env \
        HOME="$(getent passwd "$test_user" | cut -d: -f6)" 2>&1 \
        | sed -u 's/^/[integrations rootless] /' &
    rootless=$!
    root_status=0
    integrations "$here" "$copy" 2>&1 | sed -u 's/^/[integrations root] /' || root_status=$?
    rootless_status=0
    wait "$rootless" || rootless_status=$?
    echo "== integrations, from the wheel: root exit $root_status; rootless exit $rootless_status"
    [ "$root_status" = 0 ] && [ "$rootless_status" = 0 ]
) &
integrations_run=$!
echo "== tests as root [root] and as $test_user, rootless [rootless], at once"
suite "$copy" runuser -u "$test_user" -- env HOME="$(getent passwd "$test_user" | cut -d: -f6)" \
    STOCKADE_TEST_SUID="$copy/.setuid-id" STOCKADE_TEST_UNLISTED_DIR="$unlisted/dir" \
    STOCKADE_TEST_ROOT_LINK="$unlisted/link" STOCKADE_TEST_UNSEARCHED="$unlisted" 2>&1 | sed -u 's/^/[rootless] /' &
rootless=$!
root_status=0
suite "$here" 2>&1 | sed -u 's/^/[root] /' || root_status=$?
rootless_status=0
wait "$rootless" || rootless_status=$?
integrations_status=0
wait "$integrations_run" || integrations_status=$?
echo "== root: exit $root_status; rootless: exit $rootless_status; integrations: exit" \
    "$integrations_status"
[ "$root_status" = 0 ] && [ "$rootless_status" = 0 ] && [ "$integrations_status" = 0 ]
