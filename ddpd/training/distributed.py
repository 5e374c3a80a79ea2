"""Processes started by torchrun: rank, world size, device and the collectives ddpd uses.

`ddpd-train` splits batches over the processes (data parallel); `ddpd-sample` splits
samples over them by Philox row. Both join the group torchrun describes in the
environment (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR/PORT): nccl on CUDA, gloo on
the CPU. One process (WORLD_SIZE unset) needs no group, and every collective below is
then the identity.
"""
from __future__ import annotations

import inspect
import os
from contextlib import contextmanager
from typing import Optional

import torch
import torch.distributed as dist

# torch.distributed.nn.functional takes group.WORLD as a default argument of its ten functions,
# read when it is first imported; torch imports it lazily (with torch._dynamo, which building a
# network or --fused loads), so after Distributed made its group. Those defaults then keep the
# group alive past destroy_process_group, and with it gloo's worker and transport threads, until
# the interpreter's finalization frees it: a thread that takes the GIL then (a worker letting go
# of the last collective's tensors) is ended by Python inside C++, and the process aborts
# ("terminate called without an active exception") after its work was done, 1 run in ~30 of a
# loaded CI. Imported here, before any group exists, the defaults are None, and close() joins
# the threads while the interpreter is whole.
import torch.distributed.nn.functional  # noqa: F401

from ddpd.streams import stdout_to_stderr
from ddpd.validation import check_device


class PeerLost(RuntimeError):
    """A collective failed because another process of the group stopped (its own error, or
    killed); `detail` says what the tool kept."""

    def __init__(self, error: BaseException):
        # the backend's first sentence: gloo goes on with advice and an emoji
        first = str(error).strip().splitlines()[0].split(". ")[0] if str(error).strip() else type(error).__name__
        super().__init__(f"another process of the group failed or was killed ({first})")
        self.detail = ""


@contextmanager
def _collective():
    """A collective's failure as PeerLost: with gloo a dead peer is a RuntimeError of a lost
    connection, which says nothing of what happened."""
    try:
        yield
    except RuntimeError as err:
        raise PeerLost(err) from err


def data_parallel(model: torch.nn.Module) -> torch.nn.parallel.DistributedDataParallel:
    """`model` wrapped by DistributedDataParallel, without the broadcast of its buffers at
    each forward: ddpd's only buffers are the rotary tables, computed alike on every
    process (a broadcast of seq_len x head_dim floats per layer per micro-step, for
    nothing). torch 2.13 renamed the flag.

    Args:
        model: the network, on this process's device.

    Returns:
        The DistributedDataParallel wrapper.
    """
    ddp = torch.nn.parallel.DistributedDataParallel
    flag = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(ddp).parameters \
        else "broadcast_buffers"
    return ddp(model, **{flag: False})


class GradientMean:
    """DistributedDataParallel's gradient all-reduce (each process's gradient divided by
    the world size, then summed: what DDP does by itself), as a comm hook that remembers
    a failed reduction. A peer lost inside backward() then reads as PeerLost, apart from
    the step's own errors, which no message text could tell apart."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.failed = False

    def attach(self, network: torch.nn.parallel.DistributedDataParallel) -> None:
        """Register the gradient averaging as `network`'s communication hook.

        Args:
            network: the DistributedDataParallel wrapper.
        """
        network.register_comm_hook(self, GradientMean._reduce)

    @staticmethod
    def _reduce(state, bucket):  # (no annotations: DDP checks them against its own types)
        gradients = bucket.buffer().div_(state.world_size)

        def reduced(future: torch.futures.Future) -> torch.Tensor:
            try:
                return future.value()[0]
            except RuntimeError:
                state.failed = True
                raise

        return dist.all_reduce(gradients, async_op=True).get_future().then(reduced)


def _environ_int(variable: str, default: int, low: int, high: Optional[int] = None) -> int:
    """An int environment variable of torchrun's, in [low, high]; ValueError naming it."""
    text = os.environ.get(variable)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        span = f"in [{low}, {high}]" if high is not None else f">= {low}"
        below = " (below WORLD_SIZE, which is 1 when unset)" if variable == "RANK" else ""
        raise ValueError(f"environment variable {variable} must be an int {span}{below}, got {text!r}")
    return value


class Distributed:
    """Rank, world size and device of this process; joins the torchrun process group
    when WORLD_SIZE > 1 (nccl on CUDA, gloo otherwise). `name` is the device argument's
    name in error messages."""

    def __init__(self, device: str, name: str = "device"):
        self.world_size = _environ_int("WORLD_SIZE", 1, 1)
        # A RANK without a group (set by hand, or left from another job) made a lone process
        # act as a helper of process 0: it wrote nothing and exited 0.
        self.rank = _environ_int("RANK", 0, 0, self.world_size - 1)
        local_rank = _environ_int("LOCAL_RANK", self.rank, 0)
        self.device = check_device(name, device, local_rank if self.world_size > 1 else None)
        self.owns_group = False
        if self.world_size > 1 and not dist.is_initialized():
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            with stdout_to_stderr():
                dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
            self.owns_group = True

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_gather(self, value):
        """[value of rank 0, value of rank 1, ...] on every rank (any picklable value).

        Args:
            value: any picklable value.

        Returns:
            A list with every rank's value, in rank order.
        """
        if self.world_size == 1:
            return [value]
        gathered = [None] * self.world_size
        with _collective():
            dist.all_gather_object(gathered, value)
        return gathered

    def sum(self, values: list[float]) -> list[float]:
        """The element-wise sum of `values` over every process.

        Args:
            values: this process's floats (the same length on every process).

        Returns:
            The sums.
        """
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: list[float]) -> list[float]:
        """The element-wise maximum of `values` over every process.

        Args:
            values: this process's floats (the same length on every process).

        Returns:
            The maxima.
        """
        return self._reduce(values, dist.ReduceOp.MAX)

    def _reduce(self, values: list[float], op) -> list[float]:
        if self.world_size == 1:
            return values
        total = torch.tensor(values, dtype=torch.float64, device=self.device)
        with _collective():
            dist.all_reduce(total, op=op)
        return total.tolist()

    def barrier(self) -> None:
        if self.world_size > 1:
            with _collective():
                dist.barrier()

    def close(self, wait: bool = True) -> None:
        """Leave the group. wait=False skips the final barrier: after a failure the other
        processes may never reach it (torchrun stops them).

        Args:
            wait: wait for the other processes at a final barrier.

        Raises:
            PeerLost: another process stopped before the final barrier (the group is left all the same).
        """
        if self.owns_group:
            try:
                if wait:
                    self.barrier()  # no process tears the group down while another still uses it
            finally:  # a lost peer too: a group left to the interpreter's exit aborts it (gloo's threads)
                dist.destroy_process_group()
                self.owns_group = False
