# Sourced by the device-run scripts (gpu_session.sh, gpu_followup.sh) from the repository root: installs
# the carried wheels (.whl/, docs/bench.md says which) to /tmp/site and puts them, then this checkout's
# src/, on PYTHONPATH. Returns 3 when the wheels do not install or gpupool.main does not import.
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || { echo "the carried wheels did not install"; return 3; }
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import gpupool.main" || { echo "gpupool.main does not import: see above"; return 3; }
