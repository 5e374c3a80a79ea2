"""Loading ddpd._C, the C++/CUDA extension that registers the torch.ops.ddpd operators.

setup.py builds ddpd._C when torch is importable at build time and records what it was built
from in ddpd/_C.build.json; otherwise, or when that module is stale, `load()` compiles the same
sources on first use into a cache directory ($DDPD_EXTENSIONS_DIR), printing one line that says
why (DDPD_FORCE_JIT=1 forces it). Only one of the two may be loaded in a process.

This file imports nothing from ddpd, and torch only inside functions, because setup.py loads it
by path for the source list and the compiler flags. The two routes are described in
docs/kernels.md, section "Loading the extension".
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import sys
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import Optional

# -ffp-contract=off: no fused multiply-add, so every double operation rounds as in the
# torch references (no -ffast-math for the same reason). -O3 vectorises the loops for
# the baseline instruction set; no -march=native, so a built wheel runs on any
# x86-64 / aarch64 machine. -g0 drops the debug info Python's CFLAGS ask for: a
# fifth of the compile time and two thirds of the library size.
CXX_FLAGS = ["-O3", "-g0", "-fopenmp", "-ffp-contract=off"]
NVCC_FLAGS = ["-O3", "--fmad=false", "-std=c++17"]
LINK_FLAGS = ["-fopenmp"]
BUILD_INFO = "_C.build.json"
JIT_NAME = "ddpd_C"
_SOURCE_SUFFIXES = (".h", ".cuh", ".cpp", ".cu")
# Files of csrc/ shipped in the package as ddpd/_csrc (setup.py package_data).
PACKAGE_DATA = ["*.h", "*.cpp", "cpu/*.h", "cpu/*.cpp", "cuda/*.h", "cuda/*.cuh", "cuda/*.cu", "cuda/*.cpp"]

_lock = threading.Lock()
_module: Optional[ModuleType] = None


def source_dir() -> Path:
    """csrc/ of a source checkout (editable install), else the copy shipped as ddpd/_csrc.

    Returns:
        The directory.

    Raises:
        RuntimeError: neither holds the sources.
    """
    package = Path(__file__).resolve().parents[1]
    for candidate in (package.parent / "csrc", package / "_csrc"):
        if (candidate / "module.cpp").is_file():
            return candidate
    raise RuntimeError(f"ddpd: the C++ sources are missing "
                       f"(looked in {package.parent / 'csrc'} and {package / '_csrc'})")


def sources(root: Path, with_cuda: bool) -> list[str]:
    """Every source of ddpd._C under root, sorted; the CUDA ones only with_cuda.

    Args:
        root: the sources' directory (source_dir).
        with_cuda: include csrc/cuda.

    Returns:
        The paths, as strings.

    Raises:
        RuntimeError: two sources share a file name (torch's JIT build names objects after it).
    """
    patterns = ["*.cpp", "cpu/*.cpp"] + (["cuda/*.cu", "cuda/*.cpp"] if with_cuda else [])
    found = sorted(str(p) for pattern in patterns for p in root.glob(pattern))
    _check_object_names(found)
    return found


def _check_object_names(paths: list[str]) -> None:
    # torch's JIT build names object files after the file name alone.
    seen: dict[str, str] = {}
    for path in paths:
        name = Path(path).name
        if name in seen:
            raise RuntimeError(f"ddpd: sources {seen[name]} and {path} share a file name; rename one")
        seen[name] = path


def cxx_flags(with_cuda: bool) -> list[str]:
    """The C++ compiler flags of a build.

    Args:
        with_cuda: whether the build has the CUDA kernels (DDPD_WITH_CUDA).

    Returns:
        The flags.
    """
    return CXX_FLAGS + [f"-DDDPD_WITH_CUDA={int(with_cuda)}"]


def can_build_cuda() -> bool:
    """A CUDA build of torch, a CUDA toolkit (nvcc), and GPU architectures to compile for.
    The architectures first: importing torch's build tools with a CUDA torch and no GPU
    logs a line ("No CUDA runtime is found"), which every load of ddpd._C printed.

    Returns:
        True when the CUDA kernels can be built.
    """
    return cuda_arch_problem() is None and has_cuda_toolkit()


def has_cuda_toolkit() -> bool:
    """A CUDA build of torch and a CUDA toolkit (nvcc) are both present.

    Returns:
        True when both are.
    """
    import torch
    from torch.utils.cpp_extension import CUDA_HOME

    return torch.version.cuda is not None and CUDA_HOME is not None


def cuda_arch_problem() -> Optional[str]:
    """Why torch cannot choose the GPU architectures to compile the CUDA kernels for, or None.
    Unless TORCH_CUDA_ARCH_LIST names them it takes the visible GPUs', and with none visible
    (the CUDA build `pip install torch` gives on Linux, on a machine without a GPU) it fails
    with an IndexError before any compiler runs.

    Returns:
        The reason, or None.
    """
    if os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip() not in ("", "native"):
        return None
    import torch

    if torch.cuda.device_count() > 0:
        return None
    return f"no GPU is visible and TORCH_CUDA_ARCH_LIST is not set; {ARCH_LIST_HINT}"


COMPILER_NEEDED = "it needs a C++17 compiler and ninja"  # what a failed compile names (build_failure)
ARCH_LIST_HINT = "set TORCH_CUDA_ARCH_LIST to the GPUs' compute capabilities (e.g. '8.0;9.0') to build the CUDA kernels"


def build_info(with_cuda: bool, root: Path) -> dict:
    """What ddpd._C is built against and from, for prebuilt_problem.

    Args:
        with_cuda: whether the build has the CUDA kernels.
        root: its sources' directory.

    Returns:
        {"torch", "python", "cuda", "sources"}: the versions, with_cuda and the source digests.
    """
    import torch

    return {"torch": torch.__version__, "python": sys.version.split()[0], "cuda": with_cuda,
            "sources": source_digests(root, with_cuda)}


def source_digests(root: Path, with_cuda: bool) -> dict:
    """{path under root: sha256} of every source a build with(out) CUDA compiles or includes.
    By content, not time: an installed wheel's files all carry the time of the install, in
    whatever order pip wrote them.

    Args:
        root: the sources' directory.
        with_cuda: include csrc/cuda.

    Returns:
        The digests by relative path.
    """
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))
            if p.suffix in _SOURCE_SUFFIXES and (with_cuda or p.parent.name != "cuda")}


def _changed_source(root: Path, with_cuda: bool, built_from: dict) -> Optional[str]:
    """The first source that differs from what ddpd._C was built from, or None."""
    now = source_digests(root, with_cuda)
    for name in sorted(set(now) | set(built_from)):
        if now.get(name) != built_from.get(name):
            return f"{root / name} {'was removed' if name not in now else 'changed'} since ddpd._C was built"
    return None


def prebuilt_path() -> Optional[Path]:
    """The file of the ddpd._C built by setup.py, if any (found without loading it).

    Returns:
        Its path, or None.
    """
    spec = importlib.util.find_spec("ddpd._C")
    return Path(spec.origin) if spec is not None and spec.origin is not None else None


def prebuilt_problem() -> Optional[str]:
    """Why the ddpd._C built by setup.py cannot be used, or None if it can.

    Returns:
        The reason, or None.
    """
    if os.environ.get("DDPD_FORCE_JIT", "") not in ("", "0"):
        return "DDPD_FORCE_JIT is set"
    built = prebuilt_path()
    if built is None:
        return ("ddpd._C was not built when ddpd was installed (no C++ compiler or no torch then; "
                "the install's warning said which)")
    info_path = built.parent / BUILD_INFO
    if not info_path.is_file():
        return f"{info_path} is missing, so the torch version {built.name} was built for is unknown"
    info = _read_json(info_path)
    if not isinstance(info, dict):
        return f"{info_path} is not the JSON record of a build"
    if not isinstance(info.get("sources"), dict):
        return f"{info_path} does not record the sources {built.name} was built from"
    try:
        root = source_dir()
    except RuntimeError:  # an install that ships no sources cannot be stale
        root = None
    changed = _changed_source(root, bool(info.get("cuda")), info["sources"]) if root is not None else None
    if changed is not None:
        return changed
    import torch

    if info.get("torch") != torch.__version__:
        return f"{built.name} was built for torch {info.get('torch')}, this is torch {torch.__version__}"
    if not info.get("cuda") and can_build_cuda():
        return f"{built.name} was built without the CUDA kernels this torch and toolkit can build"
    return None


def _read_json(path: Path):
    """The JSON in `path`, or None where it cannot be read (a record cut short by a full
    disk or a kill: a build to redo, not an error that stays)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _cache_dir(with_cuda: bool, root: Path) -> Path:
    """The build directory of the sources in `root` built against this environment's torch:
    one per checkout and environment, since ninja rebuilds whenever its build file (which
    names the sources' and torch's paths) changes, so two installs sharing one directory
    rebuilt each other's extension at every switch."""
    import torch

    cache = os.environ.get("DDPD_EXTENSIONS_DIR") or _user_cache() / "ddpd" / "extensions"
    paths = f"{root.resolve()}\n{Path(torch.__file__).resolve().parent}\n{sys.prefix}"
    where = hashlib.sha256(paths.encode()).hexdigest()[:8]
    tag = (f"py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}-{'cuda' if with_cuda else 'cpu'}"
           f"-{where}")
    return Path(cache) / re.sub(r"[^A-Za-z0-9_.-]", "_", tag)


def _user_cache() -> Path:
    """$XDG_CACHE_HOME, else ~/.cache, as torch's own extension cache: where HOME cannot be
    written (a container, a cluster), XDG_CACHE_HOME is how a user moves every cache at once.
    The XDG specification ignores an empty or relative value."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"


class _ScriptsOnPath:
    """The running interpreter's scripts directory first on PATH while building: the ninja
    that ddpd installs lives there, and torch runs `ninja` from PATH, which an
    environment used without activating it (a service, cron) does not hold."""

    def __enter__(self):
        import sysconfig

        self.saved = os.environ.get("PATH")
        scripts = sysconfig.get_path("scripts")
        os.environ["PATH"] = os.pathsep.join(p for p in (scripts, self.saved) if p)

    def __exit__(self, *exc):
        if self.saved is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = self.saved


def _compile(reason: str) -> ModuleType:
    with_cuda = can_build_cuda()
    root = source_dir()
    build_dir = _cache_dir(with_cuda, root)
    try:
        build_dir.parent.mkdir(parents=True, exist_ok=True)
        # One process at a time (torchrun starts several): a stale build directory is emptied.
        lock = open(build_dir.parent / f".{build_dir.name}.lock", "w")
    except OSError as error:
        raise _unavailable(reason, build_dir, f"{error.strerror or error}: {getattr(error, 'filename', '')}",
                           "it needs a directory it can write: DDPD_EXTENSIONS_DIR or XDG_CACHE_HOME names one"
                           ) from error
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(reason, root, build_dir, with_cuda)


def _unavailable(reason: str, build_dir: Path, why: str, needs: str) -> RuntimeError:
    return RuntimeError(f"ddpd: the C++ extension is unavailable ({reason}) and compiling it in {build_dir} failed: "
                        f"{why} ({needs}; the samplers without --fused, fused=False, need no extension)")


def _build(reason: str, root: Path, build_dir: Path, with_cuda: bool) -> ModuleType:
    from torch.utils import cpp_extension

    built_from = build_dir / BUILD_INFO
    digests = source_digests(root, with_cuda)
    last = _read_json(built_from)
    if last != digests:
        print(f"ddpd: compiling the C++ extension because {reason}; building in {build_dir} (once per source "
              "change)", file=sys.stderr, flush=True)
        _remove_stale(build_dir, last, digests)
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
        with _ScriptsOnPath():
            module = cpp_extension.load(
                name=JIT_NAME,
                sources=sources(root, with_cuda),
                extra_include_paths=[str(root)],
                extra_cflags=cxx_flags(with_cuda),
                extra_cuda_cflags=list(NVCC_FLAGS),  # copies: torch appends its own flags in place
                extra_ldflags=list(LINK_FLAGS),
                build_directory=str(build_dir),
                with_cuda=with_cuda,
                verbose=False,
            )
    except Exception as error:
        raise _unavailable(reason, build_dir, *build_failure(error)) from error
    temporary = built_from.with_name(f".{BUILD_INFO}.tmp")  # whole or absent: a rename, not a write in place
    temporary.write_text(json.dumps(digests))
    os.replace(temporary, built_from)
    return module


def _remove_stale(build_dir: Path, last, digests: dict) -> None:
    """Remove the objects of the sources changed since the build recorded as `last`: ninja
    rebuilds by file times, so a source whose content changed but whose file is not newer than
    its object (restored from an archive, `cp -p`) would be skipped. A changed header, which
    any object may include, or no record empties the whole directory."""
    if not isinstance(last, dict):
        shutil.rmtree(build_dir, ignore_errors=True)
        return
    changed = [Path(name) for name in set(digests) | set(last) if digests.get(name) != last.get(name)]
    if any(path.suffix not in (".cpp", ".cu") for path in changed):
        shutil.rmtree(build_dir, ignore_errors=True)
        return
    for path in changed:  # torch's JIT build names each object after its source's file name
        (build_dir / f"{path.stem}{'.cuda.o' if path.suffix == '.cu' else '.o'}").unlink(missing_ok=True)


def build_failure(error: BaseException) -> tuple[str, str]:
    """Why a build of ddpd._C failed and what it needs, for one line. torch chooses the CUDA
    architectures before any compiler runs; a failure there names TORCH_CUDA_ARCH_LIST, not
    the compiler.

    Args:
        error: the build's exception.

    Returns:
        (why, what it needs).
    """
    if _raised_in(error, "_get_cuda_arch_flags"):
        import torch

        arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
        given = f"TORCH_CUDA_ARCH_LIST={arch_list!r}" if arch_list else "TORCH_CUDA_ARCH_LIST unset"
        return (f"torch could not choose the GPU architectures to compile for ({type(error).__name__}: {error}; "
                f"{given}, GPUs visible: {torch.cuda.device_count()})", ARCH_LIST_HINT)
    return _failure_line(error), COMPILER_NEEDED


def _raised_in(error: BaseException, function: str) -> bool:
    """Whether `function` is on the stack that raised `error`."""
    frame = error.__traceback__
    while frame is not None:
        if frame.tb_frame.f_code.co_name == function:
            return True
        frame = frame.tb_next
    return False


def _failure_line(error: BaseException) -> str:
    """The line of a failed build that says why (a compiler's error, a missing compiler),
    else its first: the message of torch's build holds ninja's whole log, in which the
    first line is only the first command."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if "error:" in line.lower() or "not found" in line or "No such file" in line:
            return line.rstrip(".")
    return lines[0].rstrip(".") if lines else type(error).__name__


def load() -> ModuleType:
    """The extension module; once it is loaded, torch.ops.ddpd.* are registered.
    The lock guards the first load only: once loaded, no call takes it.

    Returns:
        The ddpd._C module, prebuilt or compiled on first use.

    Raises:
        RuntimeError: it can be neither imported nor compiled (a one-line "ddpd: ..." message).
    """
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is None:
            reason = prebuilt_problem()
            if reason is None:
                try:
                    _module = importlib.import_module("ddpd._C")
                except ImportError as error:  # e.g. an undefined symbol after a torch upgrade
                    _module = _compile(f"ddpd._C failed to import ({error})")
            else:
                _module = _compile(reason)
        return _module


def loaded() -> bool:
    """Whether ddpd._C is loaded (by load(), or by any op that needed it).

    Returns:
        True once loaded.
    """
    return _module is not None


def ops():
    """torch.ops.ddpd with the kernels of ddpd._C registered: the per-call path of every
    op, lock-free once the extension is loaded.

    Returns:
        The torch.ops.ddpd namespace.
    """
    import torch

    if _module is None:
        load()
    return torch.ops.ddpd


def has_cuda() -> bool:
    """Whether the loaded extension carries the CUDA kernels.

    Returns:
        True when it was built with them.
    """
    return bool(load().with_cuda)


_warned_devices: set = set()


def ops_for(device):
    """torch.ops.ddpd when ddpd._C has kernels for `device`, else None: the caller then
    runs its torch reference, which gives the same results (warned once per device).

    Args:
        device: the inputs' torch.device.

    Returns:
        The torch.ops.ddpd namespace, or None.
    """

    if device.type == "cpu" or (device.type == "cuda" and has_cuda()):
        return ops()
    if device.type not in _warned_devices:
        _warned_devices.add(device.type)
        warnings.warn(
            f"ddpd._C has no {device.type} kernels (built without a CUDA toolkit?); "
            "the ddpd ops run their torch references on this device",
            stacklevel=3,
        )
    return None
