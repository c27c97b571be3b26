#!/bin/sh
# The type checker (mypy, pinned in the `test` extra; settings in pyproject's [tool.mypy]) over
# cli/, replay/ and traces/ as the package they install as: `specreplay.cli`, `.replay`, `.traces`.
# The source folders are not named `specreplay` (pyproject maps them with package-dir), and mypy
# cannot follow an editable install's import hook, so it checks them through a folder of links
# that names them as installed.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
links=$(mktemp -d)
trap 'rm -rf "$links"' EXIT
mkdir "$links/specreplay"
for part in cli replay traces; do ln -s "$root/$part" "$links/specreplay/$part"; done
cd "$links"
MYPYPATH="$links" python -m mypy --config-file "$root/pyproject.toml" --cache-dir "$links/.mypy_cache" \
    -p specreplay.traces -p specreplay.cli -p specreplay.replay "$@"
