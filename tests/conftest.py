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


def _interpreter_patches_each_device_function_once() -> None:
    """Under TRITON_INTERPRET=1 every call of a @triton.jit helper from a kernel re-patches
    triton.language (_patch_lang: inspect.getmembers of its modules), about half of what a
    kernel test costs on CPU. Within one launch the patches the helper's first call made are
    still in place (the launch restores them when it ends), so a later call of the same helper
    re-patches nothing that is not patched already: here it skips that work. The launch's own
    patching, and each helper's first call in each launch, run as before."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    patch_lang = getattr(interpreter, "_patch_lang", None)
    grid_call = getattr(getattr(interpreter, "GridExecutor", None), "__call__", None)
    device_call = getattr(getattr(interpreter, "InterpretedFunction", None), "__call__", None)
    # Only the structure this was written for: launches and helper calls that call _patch_lang.
    if patch_lang is None or getattr(patch_lang, "patches_once", False) or not all(
            "_patch_lang" in getattr(getattr(f, "__code__", None), "co_names", ()) for f in (grid_call, device_call)):
        return
    launches = []  # per launch running (innermost last): the functions patched for already

    def patch_once(fn):
        if launches and fn in launches[-1]:
            return interpreter._LangPatchScope() if hasattr(interpreter, "_LangPatchScope") else None
        if launches:
            launches[-1].add(fn)
        return patch_lang(fn)

    def launch(self, *args, **kwargs):
        launches.append(set())
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            launches.pop()

    patch_once.patches_once = True
    interpreter._patch_lang = patch_once
    interpreter.GridExecutor.__call__ = launch


_interpreter_patches_each_device_function_once()

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
