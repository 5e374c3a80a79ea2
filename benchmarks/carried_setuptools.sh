# Sourced by benchmarks/gpu_check.sh and docs/text8/gpu_train.sh before they build ddpd on a
# device machine, which has no network: pyproject.toml's license needs setuptools >= 77, and
# an older image's setuptools would refuse the build. A setuptools wheel carried in .whl/
# (git-ignored; `python3 -m pip download --no-deps -d .whl "setuptools>=77"` here, then
# carry ".whl") is then put first on PYTHONPATH.
#
# use_carried_setuptools PYTHON: print the setuptools in use; take the carried one if needed
use_carried_setuptools() {
    local py=$1 wheel
    "$py" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)" 2>/dev/null &&
        return 0
    wheel=$(ls .whl/setuptools-*.whl 2>/dev/null | head -n 1)
    if [ -z "$wheel" ]; then
        echo "setuptools: older than 77 and no .whl/setuptools-*.whl carried: the build will fail"
        return 1
    fi
    "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/carried-site "$wheel" || return 1
    export PYTHONPATH=/tmp/carried-site${PYTHONPATH:+:$PYTHONPATH}
    echo "setuptools: $("$py" -c 'import setuptools; print(setuptools.__version__)') from $wheel"
}
