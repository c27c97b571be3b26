# Sourced by scripts/vllm-wheel.sh and scripts/sglang.sh: the start every side environment shares.
#
# side_env DIR PACKAGE VERSION: create the virtual environment DIR with the CPU torch and
# PACKAGE==VERSION's wheel without its dependencies (the wheel on the package index pins a CUDA
# torch and its stack, which the scheduler path does not need). Sets `pip` (DIR's) and `wheels`
# (a temporary folder, removed on exit, where the caller writes its constraints file).
side_env() {
    local dir=$1 package=$2 version=$3
    python3 -m venv "$dir"
    pip="$dir/bin/pip"
    "$pip" install -q torch==2.13.0
    wheels=$(mktemp -d)
    trap 'rm -rf "$wheels"' EXIT
    "$pip" download -q --no-deps "$package==$version" -d "$wheels"
    "$pip" install -q --no-deps "$wheels/$package-$version"-*.whl
}
