"""Child processes of the tests. The one time limit the tests use is a guard against a
hung child process or a wait that never ends, not a measure of speed. Every run it guards
takes seconds to a few minutes on 2 busy CPU cores; nothing a test asserts depends on how
long it took."""

import os
import subprocess
import sys

HANG_GUARD_SECONDS = 3600


def run_compiled(script: str, *args: str) -> subprocess.CompletedProcess:
    """Run a test file (or a benchmark script, with args) as a script in a child process
    without TRITON_INTERPRET: the test process imports the kernels for the interpreter, and
    a process holds one mode, so whatever compiles kernels for a GPU runs there. Output
    captured as text."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    # the script imports the tests' shared modules (this one, oracles) from tests/, above its folder
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(os.path.abspath(__file__)),
                                                      env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, script, *args], env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_SECONDS)


def torchrun_worker(launcher: int, rank: int) -> int:
    """The pid of the torchrun worker of `rank` among the children of `launcher`."""
    with open(f"/proc/{launcher}/task/{launcher}/children") as f:
        children = [int(pid) for pid in f.read().split()]
    for pid in children:
        with open(f"/proc/{pid}/environ", "rb") as f:
            if f"RANK={rank}".encode() in f.read().split(b"\0"):
                return pid
    raise AssertionError(f"no worker of rank {rank} among {children}")


def default_signals() -> None:
    """preexec_fn of a child a test signals: SIGINT, SIGTERM and SIGHUP at their defaults. The
    tools keep a signal that was ignored when they started (nohup), and a shell script that
    runs the tests in the background ignores SIGINT in them."""
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
