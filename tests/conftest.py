"""Test configuration.

Triton kernels run in the interpreter on machines without a GPU; the variable must
be set before any kernel module is imported, hence here, at collection time.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The tests run small ops, for which intra-op threads cost far more than they
# give (up to 25x slower on a loaded 2-core machine); one thread also keeps
# floating-point reductions identical from run to run.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
