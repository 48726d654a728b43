#!/usr/bin/env bash
# setup_env.sh - create a virtual environment with this package's pinned requirements and
# check the NVIDIA driver / CUDA against the recorded machine.
#
# Usage: ./setup_env.sh [--venv DIR] [--python PYTHON] [--check-only] [--strict]
#
#   --venv DIR       where to create the venv (default: ./.venv next to this script)
#   --python PYTHON  interpreter to build it with (default: python3)
#   --check-only     only compare driver / CUDA / GPUs / Python; install nothing
#   --strict         treat a driver, CUDA or GPU difference as an error
#
# Reads env/expected.txt (KEY=value) and env/requirements.txt (pip freeze, pinned).
# Exit codes: 0 ok (differences are printed as warnings), 1 a check failed or pip failed,
# 2 usage error.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
python="python3"
check_only=0
strict=0

usage() {
    sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
    case "$1" in
        --venv) [ $# -ge 2 ] || { echo "error: --venv needs a directory" >&2; exit 2; }; venv="$2"; shift 2 ;;
        --python) [ $# -ge 2 ] || { echo "error: --python needs an interpreter" >&2; exit 2; }; python="$2"; shift 2 ;;
        --check-only) check_only=1; shift ;;
        --strict) strict=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

expected_driver=""
expected_cuda=""
expected_gpu_count=""
expected_gpu_name=""
expected_python=""
while IFS='=' read -r key value; do
    case "$key" in
        DRIVER_VERSION) expected_driver="$value" ;;
        CUDA_DRIVER_VERSION) expected_cuda="$value" ;;
        GPU_COUNT) expected_gpu_count="$value" ;;
        GPU_NAME) expected_gpu_name="$value" ;;
        PYTHON_VERSION) expected_python="$value" ;;
    esac
done < "$here/env/expected.txt"

problems=0
differ() {
    echo "difference: $*" >&2
    if [ "$strict" -eq 1 ]; then problems=$((problems + 1)); fi
}

if [ -n "$expected_driver" ]; then
    if command -v nvidia-smi >/dev/null 2>&1; then
        driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1 | tr -d ' ')"
        count="$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l | tr -d ' ')"
        name="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
        cuda="$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)"
        [ "$driver" = "$expected_driver" ] || differ "NVIDIA driver $driver, recorded $expected_driver"
        [ -z "$expected_cuda" ] || [ "$cuda" = "$expected_cuda" ] || differ "CUDA driver version $cuda, recorded $expected_cuda"
        [ -z "$expected_gpu_count" ] || [ "$count" = "$expected_gpu_count" ] || differ "$count GPU(s), recorded $expected_gpu_count"
        [ -z "$expected_gpu_name" ] || [ "$name" = "$expected_gpu_name" ] || differ "GPU $name, recorded $expected_gpu_name"
        echo "driver $driver, CUDA $cuda, $count x $name"
    else
        differ "nvidia-smi not found; the recorded machine had driver $expected_driver and $expected_gpu_count x $expected_gpu_name"
    fi
else
    echo "the recorded machine had no NVIDIA GPU; skipping the driver check"
fi

py_version="$("$python" -c 'import platform; print(platform.python_version())' 2>/dev/null || true)"
if [ -z "$py_version" ]; then
    echo "error: $python is not a working Python interpreter (use --python)" >&2
    exit 1
fi
if [ -n "$expected_python" ] && [ "${py_version%.*}" != "${expected_python%.*}" ]; then
    differ "Python $py_version, recorded $expected_python (use --python to pick another interpreter)"
fi

if [ "$problems" -gt 0 ]; then
    echo "error: $problems difference(s) with --strict" >&2
    exit 1
fi
if [ "$check_only" -eq 1 ]; then
    echo "check only: nothing installed"
    exit 0
fi

"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --upgrade pip
"$venv/bin/python" -m pip install -r "$here/env/requirements.txt"
echo "done: activate with  . $venv/bin/activate"
