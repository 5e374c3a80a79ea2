"""Tensors on a device the machine may lack, for the ops' checks that two arguments share
a device: fake tensors (torch's FakeTensorMode) have a shape, a dtype and a device, cuda:0
without a GPU, and no values. A meta tensor does not do: the ops refuse it earlier, as on
neither cpu nor cuda."""
import contextlib

import torch

# (the input's device, the other argument's): a mismatch in each direction.
MISMATCHES = [("cpu", "cuda:0"), ("cuda:0", "cpu")]


@contextlib.contextmanager
def fake_tensors(device: str):
    """Fake tensors, made on `device` unless a call names another.

    Args:
        device: "cpu" or "cuda:0".

    Yields:
        Nothing: tensors made inside are fake.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), torch.device(device):
        yield


def moved(t: torch.Tensor, device: str) -> torch.Tensor:
    """A fake tensor of t's shape and dtype on `device` (inside fake_tensors).

    Args:
        t: the tensor, fake or real (made outside, as a test's parameter).
        device: where the copy lives.

    Returns:
        The fake tensor.
    """
    return torch.empty(t.shape, dtype=t.dtype, device=device)
