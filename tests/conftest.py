"""Test configuration.

Triton kernels run in the interpreter on machines without a GPU; the variable must
be set before any kernel module is imported, hence here, at collection time.
"""
import os
import signal
from importlib.metadata import PackageNotFoundError, version

import pytest
import torch
from packaging.version import Version

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _interpreter_reads_scalars_under_numpy_2_4() -> None:
    """Triton's interpreter before 3.7 reads a runtime integer (a loop's bound) as int() of a
    one-element array, which numpy 2.4 refuses: every kernel test on CPU tensors failed with
    torch <= 2.11's triton (triton-lang/triton#9171). Upstream's fix, for those versions."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:  # the versions from the metadata: triton is imported only where it needs the fix
        if Version(version("triton")).release >= (3, 7) or Version(version("numpy")).release < (2, 4):
            return
    except PackageNotFoundError:
        return
    from triton.runtime import interpreter

    patch = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


_interpreter_reads_scalars_under_numpy_2_4()

# The tests run small ops, for which intra-op threads cost far more than they
# give (many times slower on a loaded machine); one thread also keeps
# floating-point reductions identical from run to run.
torch.set_num_threads(1)


# Names that end like a kernel's but launch none (the flash-attn lookup of ddpd.models.attention).
NOT_TRITON = {"load_flash_kernel"}


def _launches_triton_on_cpu(item) -> bool:
    """Tests that call a Triton launcher (`*_triton`, `triton_*`) or a test kernel
    (`*_kernel`) directly on CPU tensors: they need the interpreter."""
    fn = getattr(item, "function", None)
    fn = getattr(getattr(fn, "hypothesis", None), "inner_test", fn)
    names = getattr(getattr(fn, "__code__", None), "co_names", ())
    return any((n.startswith("triton_") or n.endswith(("_triton", "_kernel"))) and n not in NOT_TRITON for n in names)


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)
        return
    if os.environ.get("TRITON_INTERPRET") != "1":
        # With a GPU, Triton compiles for it and cannot run kernels on CPU tensors;
        # one process cannot hold both modes. Run these with TRITON_INTERPRET=1.
        skip_cpu_triton = pytest.mark.skip(reason="runs a Triton kernel on CPU tensors: set TRITON_INTERPRET=1")
        for item in items:
            if _launches_triton_on_cpu(item):
                item.add_marker(skip_cpu_triton)


class SignalStop(Exception):
    """What the signal_raises fixture's SIGTERM handler raises."""


@pytest.fixture
def signal_raises():
    """SIGTERM raises SignalStop (yielded), as a tool's handler raises Interrupted: a test that
    signals its own process from inside a step sees where the exception surfaces."""
    def stop(signum, frame):
        raise SignalStop()

    previous = signal.signal(signal.SIGTERM, stop)
    yield SignalStop
    signal.signal(signal.SIGTERM, previous)
