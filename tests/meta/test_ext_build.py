"""The ddpd._C build chain: source discovery, the staleness check that decides
between the module built by setup.py and compiling on first use, the compile call
itself (mocked here; a real compile in a fresh cache is the slow test at the end),
and the sources shipped with the package."""
import importlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from ddpd.cli.common import one_line
from ddpd.ops import _ext
from hang_guard import HANG_GUARD_SECONDS

ROOT = Path(__file__).resolve().parents[2]
# a CUDA build of torch and nvcc without a GPU add this warning (its own test below) to any build
NO_GPU = "building ddpd._C without its CUDA kernels"


def test_load_registers_the_ops():
    module = _ext.load()
    assert module is _ext.load()  # loaded once per process
    for name in ("multinomial_kernel", "compact_fixed_kernel", "scatter_back_kernel", "sample_categorical_cpu",
                 "sample_from_hidden_cpu", "planner_select_cpu", "planner_mask_cpu", "bernoulli_cpu"):
        assert hasattr(torch.ops.ddpd, name)
    assert _ext.has_cuda() in (True, False)
    assert _ext.ops_for(torch.device("cpu")) is torch.ops.ddpd


def test_devices_without_kernels_fall_back_with_one_warning(monkeypatch):
    if _ext.has_cuda():
        pytest.skip("this build has CUDA kernels")
    monkeypatch.setattr(_ext, "_warned_devices", set())
    with pytest.warns(UserWarning, match="no cuda kernels"):
        assert _ext.ops_for(torch.device("cuda")) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _ext.ops_for(torch.device("cuda")) is None  # warned once only


def test_sources_cover_every_cpp_and_cuda_file():
    root = _ext.source_dir()
    assert root == ROOT / "csrc"
    cpu = _ext.sources(root, with_cuda=False)
    assert cpu == sorted(str(p) for p in list(root.glob("*.cpp")) + list(root.glob("cpu/*.cpp")))
    assert str(root / "module.cpp") in cpu and str(root / "cpu" / "multinomial.cpp") in cpu
    cuda = _ext.sources(root, with_cuda=True)
    assert set(cuda) - set(cpu) == {str(p) for p in list(root.glob("cuda/*.cu")) + list(root.glob("cuda/*.cpp"))}
    assert str(root / "cuda" / "multinomial.cu") in cuda


def test_sources_with_the_same_file_name_are_rejected(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "ops.cpp").write_text("")
    (tmp_path / "cpu" / "ops.cpp").write_text("")
    with pytest.raises(RuntimeError, match="share a file name"):
        _ext.sources(tmp_path, with_cuda=False)


def test_package_ships_every_source():
    root = _ext.source_dir()
    shipped = {p for pattern in _ext.PACKAGE_DATA for p in root.glob(pattern)}
    sources = {p for p in root.rglob("*") if p.suffix in (".h", ".cuh", ".cpp", ".cu")}
    assert sources <= shipped


@pytest.fixture
def compile_calls(monkeypatch):
    """cpp_extension.load's keyword arguments, recorded in place of a build (which returns "module")."""
    from torch.utils import cpp_extension

    calls = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kwargs: calls.append(kwargs) or "module")
    return calls


@pytest.fixture
def fake_build(tmp_path, monkeypatch):
    """A fake ddpd._C and source tree whose times and build info the test controls."""
    monkeypatch.delenv("DDPD_FORCE_JIT", raising=False)
    sources = tmp_path / "csrc"
    sources.mkdir()
    (sources / "module.cpp").write_text("")
    built = tmp_path / "ddpd" / "_C.so"
    built.parent.mkdir()
    built.write_text("")
    _write_info(built, sources, _ext.can_build_cuda())
    monkeypatch.setattr(_ext, "source_dir", lambda: sources)
    monkeypatch.setattr(_ext, "prebuilt_path", lambda: built)
    return sources, built


def _write_info(built, sources, cuda, torch_version=None):
    info = {"torch": torch_version or torch.__version__, "cuda": cuda, "sources": _ext.source_digests(sources, cuda)}
    (built.parent / _ext.BUILD_INFO).write_text(json.dumps(info))


def test_a_current_build_is_used(fake_build):
    assert _ext.prebuilt_problem() is None


def test_sources_newer_than_the_build_but_the_same_are_current(fake_build):
    """An installed wheel: pip gives every file the time of the install, the shipped sources
    after the library (zip order), which read as stale and were compiled again on first use."""
    sources, built = fake_build
    later = time.time() + 100
    os.utime(sources / "module.cpp", (later, later))
    assert _ext.prebuilt_problem() is None


def test_force_jit(fake_build, monkeypatch):
    monkeypatch.setenv("DDPD_FORCE_JIT", "1")
    assert _ext.prebuilt_problem() == "DDPD_FORCE_JIT is set"


def test_missing_build(fake_build, monkeypatch):
    monkeypatch.setattr(_ext, "prebuilt_path", lambda: None)
    assert "was not built" in _ext.prebuilt_problem()


def test_changed_added_or_removed_sources_make_the_build_stale(fake_build):
    sources, built = fake_build
    header = sources / "cpu" / "new_op.h"
    header.parent.mkdir()
    header.write_text("")
    assert _ext.prebuilt_problem() == f"{header} changed since ddpd._C was built"
    _write_info(built, sources, _ext.can_build_cuda())
    assert _ext.prebuilt_problem() is None
    header.write_text("// an edit")
    assert _ext.prebuilt_problem() == f"{header} changed since ddpd._C was built"
    header.unlink()
    assert _ext.prebuilt_problem() == f"{header} was removed since ddpd._C was built"


def test_cuda_sources_do_not_make_a_cpu_build_stale(fake_build):
    sources, built = fake_build
    _write_info(built, sources, False)
    kernel = sources / "cuda" / "op.cu"
    kernel.parent.mkdir()
    kernel.write_text("")
    if not _ext.can_build_cuda():
        assert _ext.prebuilt_problem() is None
    _write_info(built, sources, True)
    kernel.write_text("// an edit")
    assert _ext.prebuilt_problem() == f"{kernel} changed since ddpd._C was built"


def test_build_for_another_torch(fake_build):
    sources, built = fake_build
    _write_info(built, sources, False, torch_version="1.0.0")
    assert _ext.prebuilt_problem() == f"_C.so was built for torch 1.0.0, this is torch {torch.__version__}"


def test_build_without_info(fake_build):
    sources, built = fake_build
    (built.parent / _ext.BUILD_INFO).write_text(json.dumps({"torch": torch.__version__, "cuda": False}))
    assert "does not record the sources" in _ext.prebuilt_problem()  # a build of an older ddpd
    (built.parent / _ext.BUILD_INFO).write_text(json.dumps({"torch": torch.__version__, "sources": None}))
    assert "does not record the sources" in _ext.prebuilt_problem()  # was a TypeError
    (built.parent / _ext.BUILD_INFO).write_text("")  # cut short: stale, not a JSONDecodeError at every call
    assert _ext.prebuilt_problem().endswith("is not the JSON record of a build")
    (built.parent / _ext.BUILD_INFO).unlink()
    assert _ext.prebuilt_problem() == (f"{built.parent / _ext.BUILD_INFO} is missing, so the torch version _C.so "
                                       "was built for is unknown")


def test_compile_route_calls_torch_load(monkeypatch, tmp_path, capsys):
    from torch.utils import cpp_extension

    calls = []
    monkeypatch.setattr(cpp_extension, "load",
                        lambda **kwargs: calls.append({**kwargs, "PATH": os.environ["PATH"]}) or "module")
    monkeypatch.setenv("PATH", "/usr/bin")  # an environment used without activating it
    monkeypatch.setenv("DDPD_EXTENSIONS_DIR", str(tmp_path))
    assert _ext._compile("a test asked for it") == "module"
    (kwargs,) = calls
    with_cuda = _ext.can_build_cuda()
    assert kwargs["name"] == _ext.JIT_NAME
    assert kwargs["sources"] == _ext.sources(_ext.source_dir(), with_cuda)
    assert kwargs["extra_cflags"] == _ext.cxx_flags(with_cuda) and "-O3" in kwargs["extra_cflags"]
    assert not any("march=native" in f or "fast-math" in f for f in kwargs["extra_cflags"])
    assert Path(kwargs["build_directory"]).parent == tmp_path and Path(kwargs["build_directory"]).is_dir()
    import sysconfig  # the ninja ddpd installs is in the interpreter's scripts directory

    assert kwargs["PATH"].split(os.pathsep) == [sysconfig.get_path("scripts"), "/usr/bin"]
    assert os.environ["PATH"] == "/usr/bin"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "compiling the C++ extension because a test asked for it" in err[0]
    build_dir = Path(kwargs["build_directory"])
    (build_dir / "module.o").write_text("an object of these sources")
    assert _ext._compile("a test asked for it") == "module"  # the same sources: ninja has nothing to do
    assert capsys.readouterr().err == "" and (build_dir / "module.o").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "more.cpp").write_text("")
    monkeypatch.setattr(_ext, "source_dir", lambda: other)
    monkeypatch.setattr(_ext, "sources", lambda root, with_cuda: [])
    assert _ext._compile("a test asked for it") == "module"  # another checkout: a build directory of its own
    other_dir = Path(calls[-1]["build_directory"])
    assert other_dir != build_dir and (build_dir / "module.o").exists()  # two installs no longer rebuild each other
    assert "compiling the C++ extension" in capsys.readouterr().err
    (other_dir / "more.o").write_text("an object of the old sources")
    (other / "more.cpp").write_text("int changed;")
    assert _ext._compile("a test asked for it") == "module"  # changed sources: said again, and built anew
    assert "compiling the C++ extension" in capsys.readouterr().err
    assert not (other_dir / "more.o").exists()  # ninja goes by file times: a restored older file was skipped
    (other_dir / _ext.BUILD_INFO).write_text("")  # a record cut short (a full disk, a kill): built again
    assert _ext._compile("a test asked for it") == "module" and "compiling" in capsys.readouterr().err
    monkeypatch.setenv("DDPD_EXTENSIONS_DIR", str(other / "more.cpp"))  # a file where the cache should be
    with pytest.raises(RuntimeError, match=r"compiling it in .* failed: .*more.cpp \(it needs a directory it can"):
        _ext._compile("a test asked for it")


def test_a_changed_source_rebuilds_its_own_object_and_a_changed_header_every_object(compile_calls, monkeypatch,
                                                                                   tmp_path):
    """ninja goes by file times, so the objects of changed sources are removed (a restored older
    file would be skipped); the others stay, so editing one kernel does not rebuild them all."""
    monkeypatch.setenv("DDPD_EXTENSIONS_DIR", str(tmp_path / "cache"))
    root = tmp_path / "csrc"
    (root / "cpu").mkdir(parents=True)
    for name in ("module.cpp", "cpu/kernel.cpp", "cpu/kernel.h"):
        (root / name).write_text("")
    monkeypatch.setattr(_ext, "source_dir", lambda: root)
    monkeypatch.setattr(_ext, "sources", lambda root, with_cuda: [])
    _ext._compile("a test asked for it")
    build_dir = Path(compile_calls[-1]["build_directory"])
    objects = [build_dir / name for name in ("module.o", "kernel.o", "build.ninja")]
    for path in objects:
        path.write_text("built")
    (root / "cpu" / "kernel.cpp").write_text("int changed;")
    _ext._compile("a test asked for it")
    assert [path.exists() for path in objects] == [True, False, True]
    objects[1].write_text("built")
    (root / "cpu" / "kernel.h").write_text("int changed;")
    _ext._compile("a test asked for it")
    assert not any(path.exists() for path in objects)
    build_dir.mkdir(exist_ok=True)
    for path in ("kernel.o", "kernel.cuda.o"):  # a .cu file's object is .cuda.o
        (build_dir / path).write_text("built")
    _ext._remove_stale(build_dir, {"cuda/kernel.cu": "old", "cpu/kernel.cpp": "same"},
                       {"cuda/kernel.cu": "new", "cpu/kernel.cpp": "same"})
    assert (build_dir / "kernel.o").exists() and not (build_dir / "kernel.cuda.o").exists()


def test_compile_failure_is_explained(monkeypatch, tmp_path):
    from torch.utils import cpp_extension

    def fail(**kwargs):
        raise OSError("no compiler")

    monkeypatch.setattr(cpp_extension, "load", fail)
    monkeypatch.setenv("DDPD_EXTENSIONS_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"unavailable \(the reason\) and compiling it .* failed: no compiler \("):
        _ext._compile("the reason")

    def fail_in_ninja(**kwargs):  # as torch reports it: ninja's log, the first line its first command
        raise RuntimeError("Error building extension 'ddpd_C': [1/9] c++ -MMD -MF bernoulli.o.d -c bernoulli.cpp\n"
                           "FAILED: bernoulli.o\nc++ -MMD -MF bernoulli.o.d -c bernoulli.cpp\n"
                           "/bin/sh: 1: c++: not found\nninja: build stopped: subcommand failed.\n")

    monkeypatch.setattr(cpp_extension, "load", fail_in_ninja)
    with pytest.raises(RuntimeError) as raised:
        _ext._compile("the reason")
    assert "failed: /bin/sh: 1: c++: not found (it needs a C++17 compiler" in str(raised.value)
    assert "without --fused" in one_line(raised.value)


@pytest.mark.integration
def test_an_install_without_a_compiler_leaves_the_build_to_first_use(tmp_path):
    """setup.py with a compiler that fails: the install goes on without ddpd._C, saying that
    its first use will compile it (`pip install --no-build-isolation` used to end in a
    traceback from torch's build)."""
    copy = _copy_of_the_checkout(tmp_path)
    env = dict(os.environ, CC="/bin/false", CXX="/bin/false")
    proc = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=copy, env=env,
                          capture_output=True, text=True, timeout=HANG_GUARD_SECONDS,
                          start_new_session=True)  # no terminal: its progress lines stay off the one running pytest
    assert proc.returncode == 0, proc.stderr
    # a warning, which pip shows (in one line: no source line follows it)
    lines = proc.stderr.splitlines()
    (at,) = [i for i, line in enumerate(lines)
             if line.startswith("setup.py:0: UserWarning: ddpd: building ddpd._C") and NO_GPU not in line]
    assert lines[at].startswith("setup.py:0: UserWarning: ddpd: building ddpd._C failed (")
    assert "it needs a C++17 compiler" in lines[at] and lines[at].endswith("compile it on first use")
    assert at + 1 == len(lines) or not lines[at + 1].startswith(" ")
    assert not list((copy / "ddpd").glob("_C*.so"))


@pytest.mark.integration
@pytest.mark.slow
def test_compile_on_first_use_in_a_fresh_cache(tmp_path):
    """The real compile route, in a subprocess: one process cannot hold both builds."""
    script = (
        "import torch\n"
        "from ddpd.ops import _ext\n"
        "from ddpd.ops.multinomial import multinomial, multinomial_reference\n"
        "from ddpd.ops.compact import compact_fixed\n"
        "module = _ext.load()\n"
        "w = torch.rand(8, 500)\n"
        "assert torch.equal(multinomial(w, 4, seed=1).tokens, multinomial_reference(w, 4, seed=1).tokens)\n"
        "active = torch.tensor([True, False] * 4)\n"
        "assert torch.equal(compact_fixed(active, 4, w)[0][0], w[active])\n"
        "print(module.__file__)\n"
    )
    env = dict(os.environ, DDPD_FORCE_JIT="1", DDPD_EXTENSIONS_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                            timeout=HANG_GUARD_SECONDS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(str(tmp_path))
    assert "compiling the C++ extension because DDPD_FORCE_JIT is set" in result.stderr


@pytest.mark.integration
def test_python_m_ddpd_ops_names_the_module_without_a_warning():
    """`python -m ddpd.ops._ext`, which the README gave, ran a second copy of a module that
    ddpd.ops imports (a runpy RuntimeWarning)."""
    done = subprocess.run([sys.executable, "-W", "error", "-m", "ddpd.ops"], capture_output=True, text=True,
                          timeout=HANG_GUARD_SECONDS)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith("ddpd: extension ddpd") and "CUDA kernels: " in done.stdout


@pytest.mark.integration
def test_python_m_ddpd_ops_cuda_fails_without_the_cuda_kernels():
    """--cuda, which the device scripts give before they time or train on a GPU: an extension
    built without its CUDA kernels runs the ops' torch references there, and would be timed as ddpd."""
    done = subprocess.run([sys.executable, "-m", "ddpd.ops", "--cuda"], capture_output=True, text=True,
                          timeout=HANG_GUARD_SECONDS)
    if _ext.has_cuda():
        assert done.returncode == 0 and "CUDA kernels: True" in done.stdout, done.stdout + done.stderr
        return
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("ddpd: extension ddpd") and done.stderr.endswith(
        "holds no CUDA kernels (--cuda)\n"), done.stderr


@pytest.mark.integration
def test_python_m_ddpd_ops_answers_help_without_loading(tmp_path):
    (tmp_path / "a-file").write_text("")
    env = {**os.environ, "DDPD_FORCE_JIT": "1", "DDPD_EXTENSIONS_DIR": str(tmp_path / "a-file")}  # a load fails
    done = subprocess.run([sys.executable, "-m", "ddpd.ops", "--help"], capture_output=True, text=True, env=env,
                          timeout=HANG_GUARD_SECONDS)
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m ddpd.ops"), done.stdout + done.stderr


def test_one_cache_directory_per_checkout_and_environment(monkeypatch, tmp_path):
    """Two environments of one checkout shared a directory, and ninja (whose build file
    names torch's paths) silently rebuilt the extension at every switch."""
    here = _ext._cache_dir(False, ROOT / "csrc")
    assert here == _ext._cache_dir(False, ROOT / "csrc")
    assert _ext._cache_dir(False, tmp_path) != here
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "another-venv"))
    assert _ext._cache_dir(False, ROOT / "csrc") != here


def test_the_cache_follows_xdg_cache_home(monkeypatch, tmp_path):
    """Where HOME cannot be written (a container, a cluster), XDG_CACHE_HOME names the cache,
    as it does for torch's own extensions; unset, empty or relative it is ignored."""
    monkeypatch.delenv("DDPD_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _ext._cache_dir(False, ROOT / "csrc").parent == tmp_path / "xdg" / "ddpd" / "extensions"
    for ignored in ("", "relative/cache"):
        monkeypatch.setenv("XDG_CACHE_HOME", ignored)
        assert _ext._cache_dir(False, ROOT / "csrc").parent == tmp_path / "home" / ".cache" / "ddpd" / "extensions"
    monkeypatch.setenv("DDPD_EXTENSIONS_DIR", str(tmp_path / "own"))
    assert _ext._cache_dir(False, ROOT / "csrc").parent == tmp_path / "own"


def test_what_a_failed_build_needs_is_written_once_and_always_given():
    """A failed compile names the compiler and ninja by _ext.COMPILER_NEEDED, and each caller of
    _unavailable says what it needs: no default there could put a second, drifting copy in a message."""
    why, needs = _ext.build_failure(OSError("no compiler"))
    assert (why, needs) == ("no compiler", _ext.COMPILER_NEEDED) and "C++17 compiler and ninja" in needs
    assert inspect.signature(_ext._unavailable).parameters["needs"].default is inspect.Parameter.empty


def test_a_cache_that_cannot_be_written_is_not_blamed_on_the_compiler(monkeypatch, tmp_path):
    """The line named a C++17 compiler and ninja, which were there: the directory was the problem."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("DDPD_EXTENSIONS_DIR", str(tmp_path / "a-file"))
    with pytest.raises(RuntimeError) as raised:
        _ext._compile("a test asked for it")
    message = str(raised.value)
    assert "compiler" not in message and "ninja" not in message
    assert message.endswith("(it needs a directory it can write: DDPD_EXTENSIONS_DIR or XDG_CACHE_HOME names one; "
                            "the samplers without --fused, fused=False, need no extension)")


@pytest.mark.integration
def test_python_m_ddpd_ops_says_why_in_one_line(tmp_path):
    (tmp_path / "a-file").write_text("")
    env = {**os.environ, "DDPD_FORCE_JIT": "1", "DDPD_EXTENSIONS_DIR": str(tmp_path / "a-file")}
    done = subprocess.run([sys.executable, "-m", "ddpd.ops"], capture_output=True, text=True, env=env,
                          timeout=HANG_GUARD_SECONDS)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("ddpd: the C++ extension is unavailable (DDPD_FORCE_JIT is set)")


@pytest.fixture
def cuda_torch_without_a_gpu(monkeypatch, tmp_path):
    """What `pip install torch` gives on Linux, with nvcc, on a machine without a GPU: a CUDA
    build of torch (mocked here where the build is a CPU one) that sees no device."""
    from torch.utils import cpp_extension

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(_fake_cuda_home(tmp_path)))
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    with pytest.raises(IndexError):  # torch's own choice of architectures, as on such a machine
        cpp_extension._get_cuda_arch_flags()


def _fake_cuda_home(tmp_path):
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(0o755)
    return home


def test_a_cuda_torch_without_a_gpu_builds_the_cpu_extension(compile_calls, cuda_torch_without_a_gpu, monkeypatch,
                                                              tmp_path):
    """torch takes the architectures to compile for from the visible GPUs; with none, its
    build failed with an IndexError that the message blamed on the compiler and ninja."""
    monkeypatch.setenv("DDPD_EXTENSIONS_DIR", str(tmp_path / "cache"))
    assert _ext._compile("a test asked for it") == "module"
    assert compile_calls[0]["with_cuda"] is False
    assert compile_calls[0]["sources"] == _ext.sources(_ext.source_dir(), with_cuda=False)
    assert _ext.has_cuda_toolkit() and not _ext.can_build_cuda()
    assert "no GPU is visible and TORCH_CUDA_ARCH_LIST is not set" in _ext.cuda_arch_problem()
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "native")  # torch reads it as "the visible GPUs'"
    assert not _ext.can_build_cuda()
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")  # named: built for them, no GPU needed
    assert _ext.can_build_cuda() and _ext.cuda_arch_problem() is None


def test_a_failed_choice_of_cuda_architectures_names_torch_cuda_arch_list(cuda_torch_without_a_gpu, monkeypatch,
                                                                         tmp_path):
    """torch fails to choose them before any compiler runs: the message names what it read."""
    from torch.utils import cpp_extension

    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "sm_90")  # torch wants "9.0"
    monkeypatch.setattr(cpp_extension, "load", lambda **kwargs: cpp_extension._get_cuda_arch_flags())
    monkeypatch.setenv("DDPD_EXTENSIONS_DIR", str(tmp_path / "cache"))
    with pytest.raises(RuntimeError) as raised:
        _ext._compile("a test asked for it")
    message = one_line(raised.value)
    assert "failed: torch could not choose the GPU architectures" in message
    assert "TORCH_CUDA_ARCH_LIST='sm_90'" in message
    assert "compiler" not in message and "set TORCH_CUDA_ARCH_LIST to the GPUs' compute capabilities" in message
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    with pytest.raises(IndexError) as raised:  # none named, none visible
        cpp_extension._get_cuda_arch_flags()
    why, needs = _ext.build_failure(raised.value)
    assert why.startswith("torch could not choose the GPU architectures to compile for (IndexError: ")
    assert "TORCH_CUDA_ARCH_LIST unset, GPUs visible: 0" in why and "TORCH_CUDA_ARCH_LIST" in needs


_FAKE_COMPILER = """#!{python}
# Writes the object (and the dependency file ninja reads) that each command names, at once.
import sys
args = sys.argv[1:]
named = lambda flag: args[args.index(flag) + 1] if flag in args else None
if named("-MF"):
    open(named("-MF"), "w").write(named("-o") + ": \\n")
if named("-o"):
    open(named("-o"), "w").write("")
"""

_AS_CUDA_TORCH_WITHOUT_A_GPU = """
import runpy, sys, torch
from torch.utils import cpp_extension
torch.version.cuda = "13.0"
torch.cuda.device_count = lambda: 0
torch.cuda.is_available = lambda: False
cpp_extension.CUDA_HOME = sys.argv[1]
sys.argv = ["setup.py", "build_ext", "--inplace"]
runpy.run_path("setup.py", run_name="__main__")
"""


def _copy_of_the_checkout(tmp_path):
    copy = tmp_path / "src"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", "build", "*.so", _ext.BUILD_INFO, "__pycache__",
                                                              "*.egg-info", "tests", "benchmarks", "docs"))
    return copy


def _run_with_a_terminal(command, **kwargs):
    """Run `command` with its output captured (as pip runs a build) and a terminal of its
    own: what it writes there comes back as the second value."""
    import pty
    import select

    terminal, child_side = pty.openpty()
    name = os.ttyname(child_side)

    def own_terminal():  # a session's leader takes the first terminal it opens for its own
        os.setsid()
        os.close(os.open(name, os.O_RDWR))

    try:
        done = subprocess.run(command, capture_output=True, text=True, preexec_fn=own_terminal,
                              timeout=HANG_GUARD_SECONDS, **kwargs)
        shown = b""
        while select.select([terminal], [], [], 0.5)[0]:
            shown += os.read(terminal, 65536)
    finally:
        os.close(terminal)
        os.close(child_side)
    return done, shown.decode(errors="replace")


@pytest.mark.integration
def test_setup_with_a_cuda_torch_without_a_gpu_builds_the_cpu_extension_and_says_so(tmp_path):
    """setup.py, as `pip install -e . --no-build-isolation` runs it with the torch that `pip
    install torch` gives on Linux, on a machine without a GPU: the build failed (an IndexError
    from torch's choice of architectures) and pip said nothing of it. Now it builds ddpd._C
    without the CUDA kernels, says why in one warning line, and shows its progress on the
    terminal (a compiler that writes empty objects stands in for the real one)."""
    copy = _copy_of_the_checkout(tmp_path)
    compiler = tmp_path / "fake-c++"
    compiler.write_text(_FAKE_COMPILER.format(python=sys.executable))
    compiler.chmod(0o755)
    env = {**os.environ, "CC": str(compiler), "CXX": str(compiler)}
    env.pop("TORCH_CUDA_ARCH_LIST", None)
    done, terminal = _run_with_a_terminal(
        [sys.executable, "-c", _AS_CUDA_TORCH_WITHOUT_A_GPU, str(_fake_cuda_home(tmp_path))], cwd=copy, env=env)
    assert done.returncode == 0, done.stderr
    (warning,) = [line for line in done.stderr.splitlines() if "UserWarning: ddpd:" in line]
    assert warning.startswith("setup.py:0: UserWarning: ddpd: building ddpd._C without its CUDA kernels: no GPU is "
                              "visible and TORCH_CUDA_ARCH_LIST is not set; set TORCH_CUDA_ARCH_LIST")
    assert "failed" not in done.stderr
    (built,) = (copy / "ddpd").glob("_C*.so")
    assert json.loads((copy / "ddpd" / _ext.BUILD_INFO).read_text())["cuda"] is False
    total = len(_ext.sources(copy / "csrc", with_cuda=False))
    assert f"ddpd: compiling ddpd._C from {total} C++ sources" in terminal
    assert f"ddpd: compiled {total} of {total} sources of ddpd._C (" in terminal
    assert "ddpd: built ddpd._C in " in terminal


@pytest.mark.integration
def test_pip_shows_in_one_line_that_the_extension_was_not_built(tmp_path):
    """`pip install` without -v showed nothing of a failed build of ddpd._C (setup.py's line
    went to the output pip hides); a warning it shows. Also none of setuptools' warnings about
    ddpd's own configuration (196 lines of them at each install)."""
    hooks = pytest.importorskip("pip._vendor.pyproject_hooks")
    if not hasattr(hooks, "BuildBackendWarning"):
        pytest.skip("this pip does not show a build's warnings")
    copy = _copy_of_the_checkout(tmp_path)
    env = dict(os.environ, CC="/bin/false", CXX="/bin/false", PIP_NO_INDEX="1")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w",
                           str(tmp_path / "wheels"), str(copy)], env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_SECONDS, start_new_session=True)
    assert done.returncode == 0, done.stdout + done.stderr
    shown = (done.stdout + done.stderr).splitlines()
    (line,) = [line for line in shown if "ddpd._C" in line and NO_GPU not in line]
    assert "BuildBackendWarning: ddpd: building ddpd._C failed (" in line and "compile it on first use" in line
    assert not [line for line in shown if "Setuptools" in line or "absent from the `packages`" in line], shown


@pytest.mark.integration
def test_an_editable_build_warns_of_nothing_in_ddpds_own_configuration(tmp_path):
    """pip shows a local checkout's build warnings: setuptools gave 196 lines of them at each
    `pip install -e .` (a license table it deprecates, data folders missing from `packages`,
    the editable finder's note), which buried the one line about ddpd._C."""
    copy = _copy_of_the_checkout(tmp_path)
    build = "import sys\nfrom setuptools import build_meta\nbuild_meta.build_editable(sys.argv[1])\n"
    done = subprocess.run([sys.executable, "-c", build, str(tmp_path / "wheel")], cwd=copy, capture_output=True,
                          text=True, env=dict(os.environ, CC="/bin/false", CXX="/bin/false"),
                          timeout=HANG_GUARD_SECONDS, start_new_session=True)
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines()
              if re.match(r"\S+:\d+: \w+: ", line) and NO_GPU not in line]  # file:line: Kind: ...
    assert len(warned) == 1 and "UserWarning: ddpd: building ddpd._C failed" in warned[0], warned


@pytest.mark.integration
def test_an_old_setuptools_is_named_in_one_line():
    """`--no-build-isolation` builds with whatever setuptools the environment has; one older
    than the SPDX license string of pyproject.toml failed with a schema error."""
    script = ("import runpy, sys, setuptools\nsetuptools.__version__ = '65.5.0'\nsys.argv = ['setup.py', '--name']\n"
              "runpy.run_path('setup.py', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=HANG_GUARD_SECONDS)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == ("ddpd: building needs setuptools >= 77.0, this is setuptools 65.5.0; "
                           "`pip install --upgrade setuptools wheel` first\n")


@pytest.mark.integration
def test_a_build_without_torch_warns_once_that_first_use_compiles(tmp_path):
    """A plain `pip install -e .` builds in an environment of its own, without torch: its
    line went to the output pip hides, at each of pip's three calls of setup.py."""
    without_torch = ("import runpy, sys\nsys.modules['torch'] = None\nsys.argv = ['setup.py', *sys.argv[1:]]\n"
                     "runpy.run_path('setup.py', run_name='__main__')\n")
    copy = _copy_of_the_checkout(tmp_path)

    def run(*args):
        done = subprocess.run([sys.executable, "-c", without_torch, *args], cwd=copy, capture_output=True, text=True,
                              timeout=HANG_GUARD_SECONDS, start_new_session=True)
        assert done.returncode == 0, done.stderr
        return [line for line in done.stderr.splitlines() if "ddpd._C" in line]

    assert run("-q", "egg_info", "--egg-base", str(tmp_path)) == []  # pip's metadata call: nothing to say yet
    (line,) = run("-q", "build_py", "-d", str(tmp_path / "lib"))  # in every build of a wheel
    assert line.startswith("setup.py:0: UserWarning: ddpd: ddpd._C is not built: torch is not importable at build "
                           "time (`pip install --no-build-isolation` builds against the installed torch)")


@pytest.mark.integration
def test_loading_with_a_cuda_torch_without_a_gpu_leaves_torchs_build_tools_alone():
    """Importing torch.utils.cpp_extension with a CUDA torch and no GPU logs "No CUDA runtime
    is found" (torch's own line): the staleness check imported it at every load of ddpd._C,
    so every `ddpd-sample --fused` on such a machine began with it."""
    script = ("import sys, torch\n"
              "torch.version.cuda = '13.0'\n"
              "torch.cuda.device_count = lambda: 0\n"
              "from ddpd.ops import _ext\n"
              "assert not _ext.can_build_cuda()\n"
              "print('torch.utils.cpp_extension' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_GUARD_SECONDS)
    assert done.returncode == 0 and done.stdout == "False\n", done.stderr


@pytest.mark.integration
def test_a_failed_build_ends_its_progress_lines_on_the_terminal(tmp_path):
    """An older pip (23.2) shows a build's warnings only with -v: the terminal showed
    "compiling ddpd._C" and then pip's "done", never that the build had failed."""
    copy = _copy_of_the_checkout(tmp_path)
    done, terminal = _run_with_a_terminal([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=copy,
                                          env=dict(os.environ, CC="/bin/false", CXX="/bin/false"))
    assert done.returncode == 0, done.stderr
    shown = [line.strip() for line in re.sub(r"\x1b\[K", "", terminal).splitlines() if line.strip()]
    assert shown[0].startswith("ddpd: compiling ddpd._C from ")
    assert shown[-1].startswith("ddpd: building ddpd._C failed (") and shown[-1].endswith("compile it on first use")


def test_the_sources_are_the_checkouts_else_the_packages_else_an_error_naming_both(monkeypatch, tmp_path):
    package = tmp_path / "ddpd"
    (package / "ops").mkdir(parents=True)
    monkeypatch.setattr(_ext, "__file__", str(package / "ops" / "_ext.py"))
    with pytest.raises(RuntimeError, match="C\\+\\+ sources are missing") as raised:
        _ext.source_dir()
    assert str(tmp_path / "csrc") in str(raised.value) and str(package / "_csrc") in str(raised.value)
    for root in (package / "_csrc", tmp_path / "csrc"):
        root.mkdir()
        (root / "module.cpp").write_text("")
    assert _ext.source_dir() == tmp_path / "csrc"  # an editable install builds what the checkout holds
    shutil.rmtree(tmp_path / "csrc")
    assert _ext.source_dir() == package / "_csrc"


def test_a_cuda_toolkit_needs_both_a_cuda_torch_and_nvcc(monkeypatch, tmp_path):
    from torch.utils import cpp_extension

    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(tmp_path))
    assert not _ext.has_cuda_toolkit()
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    assert not _ext.has_cuda_toolkit()
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(tmp_path))
    assert _ext.has_cuda_toolkit()


def test_one_visible_gpu_is_enough_to_choose_the_architectures(monkeypatch):
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert _ext.cuda_arch_problem() is None


def test_ddpd_force_jit_set_to_0_uses_the_build(fake_build, monkeypatch):
    monkeypatch.setenv("DDPD_FORCE_JIT", "0")
    assert _ext.prebuilt_problem() is None


def test_a_build_without_cuda_kernels_is_stale_where_they_can_be_built(fake_build, monkeypatch):
    sources, built = fake_build
    monkeypatch.setattr(_ext, "can_build_cuda", lambda: True)
    _write_info(built, sources, False)
    assert _ext.prebuilt_problem() == "_C.so was built without the CUDA kernels this torch and toolkit can build"
    _write_info(built, sources, True)
    assert _ext.prebuilt_problem() is None


def test_an_install_that_ships_no_sources_is_never_stale(fake_build, monkeypatch):
    def missing():
        raise RuntimeError("ddpd: the C++ sources are missing")

    monkeypatch.setattr(_ext, "source_dir", missing)
    assert _ext.prebuilt_problem() is None


def test_the_cache_directory_names_python_torch_the_kernels_and_the_paths(monkeypatch, tmp_path):
    monkeypatch.setenv("DDPD_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(torch, "__version__", "2.8.0+cu128")
    py = f"py{sys.version_info[0]}{sys.version_info[1]}"
    assert re.fullmatch(py + r"-torch2\.8\.0_cu128-cpu-[0-9a-f]{8}", _ext._cache_dir(False, ROOT / "csrc").name)
    assert re.fullmatch(py + r"-torch2\.8\.0_cu128-cuda-[0-9a-f]{8}", _ext._cache_dir(True, ROOT / "csrc").name)


def test_building_without_path_set_leaves_it_unset(monkeypatch):
    import sysconfig

    monkeypatch.delenv("PATH", raising=False)
    with _ext._ScriptsOnPath():
        assert os.environ["PATH"] == sysconfig.get_path("scripts")
    assert "PATH" not in os.environ


def test_a_failed_build_is_told_by_its_error_line_else_its_first():
    log = "[1/2] c++ -c ops.cpp\nops.cpp:3:1: Error: expected ';'.\nninja: build stopped."
    assert _ext._failure_line(RuntimeError(log)) == "ops.cpp:3:1: Error: expected ';'"
    missing = "[1/2] c++ -c ops.cpp\nc++: fatal: ops.h: No such file or directory\nninja: build stopped."
    assert _ext._failure_line(RuntimeError(missing)) == "c++: fatal: ops.h: No such file or directory"
    assert _ext._failure_line(RuntimeError("\n  the first line.\nthe second.\n")) == "the first line"
    assert _ext._failure_line(OSError()) == "OSError"


def test_a_build_that_fails_to_import_is_compiled_instead(monkeypatch):
    monkeypatch.setattr(_ext, "_module", None)
    monkeypatch.setattr(_ext, "prebuilt_problem", lambda: None)

    def broken(name):
        raise ImportError("undefined symbol: _ZN2at")

    reasons = []
    monkeypatch.setattr(importlib, "import_module", broken)
    monkeypatch.setattr(_ext, "_compile", lambda reason: reasons.append(reason) or "module")
    assert not _ext.loaded()
    assert _ext.load() == "module" and _ext.loaded()
    assert reasons == ["ddpd._C failed to import (undefined symbol: _ZN2at)"]


def test_only_cuda_devices_use_the_cuda_kernels(monkeypatch):
    monkeypatch.setattr(_ext, "has_cuda", lambda: True)
    monkeypatch.setattr(_ext, "_warned_devices", set())
    assert _ext.ops_for(torch.device("cuda")) is torch.ops.ddpd
    with pytest.warns(UserWarning, match="no meta kernels"):
        assert _ext.ops_for(torch.device("meta")) is None


def _an_op(device):
    return _ext.ops_for(device)


def test_the_fallback_warning_points_at_the_line_that_called_the_op(monkeypatch):
    monkeypatch.setattr(_ext, "has_cuda", lambda: False)
    monkeypatch.setattr(_ext, "_warned_devices", set())
    with pytest.warns(UserWarning, match="no cuda kernels") as record:
        line = sys._getframe().f_lineno + 1
        _an_op(torch.device("cuda"))
    assert (record[0].filename, record[0].lineno) == (__file__, line)


def test_the_record_setup_writes_makes_its_build_current(fake_build, monkeypatch):
    """setup.py writes build_info beside the module it built; prebuilt_problem reads it back."""
    sources, built = fake_build
    kernel = sources / "cuda" / "op.cu"
    kernel.parent.mkdir()
    kernel.write_text("")
    for with_cuda in (False, True):
        monkeypatch.setattr(_ext, "can_build_cuda", lambda: with_cuda)
        info = _ext.build_info(with_cuda, sources)
        assert info == {"torch": torch.__version__, "python": sys.version.split()[0], "cuda": with_cuda,
                        "sources": _ext.source_digests(sources, with_cuda)}
        assert ("cuda/op.cu" in info["sources"]) == with_cuda
        (built.parent / _ext.BUILD_INFO).write_text(json.dumps(info))
        assert _ext.prebuilt_problem() is None


def test_the_compile_call_passes_the_include_path_flags_and_quiet_build(compile_calls, monkeypatch, tmp_path):
    monkeypatch.setenv("DDPD_EXTENSIONS_DIR", str(tmp_path))
    _ext._compile("a test asked for it")
    (kwargs,) = compile_calls
    assert kwargs["extra_include_paths"] == [str(_ext.source_dir())]
    assert kwargs["extra_cuda_cflags"] == ["-O3", "--fmad=false", "-std=c++17"]
    assert kwargs["extra_ldflags"] == ["-fopenmp"]
    assert kwargs["verbose"] is False
    assert _ext.cxx_flags(False)[-1] == "-DDDPD_WITH_CUDA=0" and _ext.cxx_flags(True)[-1] == "-DDDPD_WITH_CUDA=1"


def test_a_second_compile_passes_the_same_flags(monkeypatch, tmp_path):
    """cpp_extension.load appends its own flags (-L torch/lib, -ltorch, ...) to the lists it is
    handed: the module's constants must not be those lists, or each compile of a process
    would pass the flags of the ones before it."""
    from torch.utils import cpp_extension

    calls = []

    def load(**kwargs):
        calls.append({name: list(value) for name, value in kwargs.items() if name.startswith("extra_")})
        kwargs["extra_ldflags"].append("-ltorch")
        kwargs["extra_cuda_cflags"].append("-gencode")
        return "module"

    monkeypatch.setattr(cpp_extension, "load", load)
    monkeypatch.setenv("DDPD_EXTENSIONS_DIR", str(tmp_path))
    _ext._compile("a test asked for it")
    _ext._compile("a test asked for it again")
    assert calls[0] == calls[1]
    assert _ext.LINK_FLAGS == ["-fopenmp"] and _ext.NVCC_FLAGS == ["-O3", "--fmad=false", "-std=c++17"]


def test_has_cuda_is_a_bool():
    assert _ext.has_cuda() is bool(_ext.load().with_cuda)


def test_another_torch_at_another_path_gets_its_own_cache_directory(monkeypatch, tmp_path):
    here = _ext._cache_dir(False, ROOT / "csrc")
    monkeypatch.setattr(torch, "__file__", str(tmp_path / "torch" / "__init__.py"))
    assert _ext._cache_dir(False, ROOT / "csrc") != here


def test_a_cache_directory_that_does_not_exist_yet_is_made_with_its_parents(compile_calls, monkeypatch, tmp_path):
    monkeypatch.setenv("DDPD_EXTENSIONS_DIR", str(tmp_path / "not" / "yet" / "made"))
    assert _ext._compile("a test asked for it") == "module"
    assert Path(compile_calls[0]["build_directory"]).parent == tmp_path / "not" / "yet" / "made"


def test_the_build_holds_the_lock_of_its_directory(monkeypatch, tmp_path):
    """torchrun starts several processes: one builds while the others wait on the lock."""
    import fcntl

    from torch.utils import cpp_extension

    def load(**kwargs):
        build_dir = Path(kwargs["build_directory"])
        with open(build_dir.parent / f".{build_dir.name}.lock", "w") as other:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return "module"

    monkeypatch.setattr(cpp_extension, "load", load)
    monkeypatch.setenv("DDPD_EXTENSIONS_DIR", str(tmp_path))
    assert _ext._compile("a test asked for it") == "module"


def test_a_build_directory_without_a_record_is_emptied(tmp_path):
    (tmp_path / "module.o").write_text("built from unknown sources")
    _ext._remove_stale(tmp_path, None, {"module.cpp": "new"})
    assert not tmp_path.exists()


def test_a_cache_that_cannot_be_written_is_named_with_the_os_reason(monkeypatch, tmp_path):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("DDPD_EXTENSIONS_DIR", str(tmp_path / "a-file"))
    with pytest.raises(RuntimeError) as raised:
        _ext._compile("a test asked for it")
    assert f"failed: File exists: {tmp_path / 'a-file'} (it needs a directory" in str(raised.value)


def test_a_blank_cuda_arch_list_is_as_unset(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "  ")
    assert "TORCH_CUDA_ARCH_LIST is not set" in _ext.cuda_arch_problem()
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", " native ")
    assert "TORCH_CUDA_ARCH_LIST is not set" in _ext.cuda_arch_problem()


def _run_python_m_ddpd_ops(monkeypatch, *args):
    import runpy

    monkeypatch.setattr(sys, "argv", ["python -m ddpd.ops", *args])
    runpy.run_module("ddpd.ops", run_name="__main__")


def test_python_m_ddpd_ops_prints_the_modules_file_and_a_bool(monkeypatch, capsys):
    from types import SimpleNamespace

    module = SimpleNamespace(__name__="ddpd._C", __file__="/site/ddpd/_C.so", with_cuda=0)  # an int, as in C++
    monkeypatch.setattr(_ext, "load", lambda: module)
    _run_python_m_ddpd_ops(monkeypatch)
    assert capsys.readouterr().out == "ddpd: extension ddpd._C from /site/ddpd/_C.so, CUDA kernels: False\n"
    module.with_cuda = 1
    _run_python_m_ddpd_ops(monkeypatch, "--cuda")
    assert capsys.readouterr().out == "ddpd: extension ddpd._C from /site/ddpd/_C.so, CUDA kernels: True\n"


def test_python_m_ddpd_ops_exits_with_the_first_line_of_a_failed_load(monkeypatch):
    def fail():
        raise RuntimeError("ddpd: the C++ extension is unavailable\nninja's log")

    monkeypatch.setattr(_ext, "load", fail)
    with pytest.raises(SystemExit) as raised:
        _run_python_m_ddpd_ops(monkeypatch)
    assert raised.value.code == "ddpd: the C++ extension is unavailable"


def test_load_compiles_for_the_reason_the_build_cannot_be_used(monkeypatch):
    monkeypatch.setattr(_ext, "_module", None)
    monkeypatch.setattr(_ext, "prebuilt_problem", lambda: "DDPD_FORCE_JIT is set")
    reasons = []
    monkeypatch.setattr(_ext, "_compile", lambda reason: reasons.append(reason) or "module")
    assert _ext.load() == "module" and reasons == ["DDPD_FORCE_JIT is set"]


def test_ops_loads_the_extension_first(monkeypatch):
    monkeypatch.setattr(_ext, "_module", None)
    calls = []
    monkeypatch.setattr(_ext, "load", lambda: calls.append("load"))
    assert _ext.ops() is torch.ops.ddpd and calls == ["load"]


def test_a_record_that_is_json_but_not_an_object_is_stale(fake_build):
    sources, built = fake_build
    (built.parent / _ext.BUILD_INFO).write_text("[]")
    assert _ext.prebuilt_problem().endswith("is not the JSON record of a build")


def test_the_compile_builds_the_cuda_kernels_where_they_can_be_built(compile_calls, monkeypatch, tmp_path):
    monkeypatch.setattr(_ext, "can_build_cuda", lambda: True)
    monkeypatch.setenv("DDPD_EXTENSIONS_DIR", str(tmp_path))
    _ext._compile("a test asked for it")
    (kwargs,) = compile_calls
    assert kwargs["with_cuda"] is True and kwargs["extra_cflags"] == _ext.cxx_flags(True)
    assert kwargs["sources"] == _ext.sources(_ext.source_dir(), with_cuda=True)
    assert "-cuda-" in Path(kwargs["build_directory"]).name


def test_a_changed_header_beside_a_changed_source_empties_the_build_directory(tmp_path):
    (tmp_path / "kernel.o").write_text("built")
    (tmp_path / "module.o").write_text("built")
    _ext._remove_stale(tmp_path, {"cpu/kernel.cpp": "old", "cpu/kernel.h": "old", "module.cpp": "same"},
                       {"cpu/kernel.cpp": "new", "cpu/kernel.h": "new", "module.cpp": "same"})
    assert not tmp_path.exists()


def test_a_loaded_extension_is_returned_without_taking_the_lock(monkeypatch):
    class Taken:
        def __enter__(self):
            raise AssertionError("the lock was taken")

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(_ext, "_module", "module")
    monkeypatch.setattr(_ext, "_lock", Taken())
    assert _ext.load() == "module"


def test_a_changed_cuda_header_makes_a_cuda_build_stale(fake_build):
    sources, built = fake_build
    header = sources / "cuda" / "common.cuh"
    header.parent.mkdir()
    header.write_text("")
    _write_info(built, sources, True)
    header.write_text("// an edit")
    assert _ext.prebuilt_problem() == f"{header} changed since ddpd._C was built"


def test_no_visible_gpu_is_told_with_the_hint_to_name_the_architectures(monkeypatch):
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert _ext.cuda_arch_problem() == f"no GPU is visible and TORCH_CUDA_ARCH_LIST is not set; {_ext.ARCH_LIST_HINT}"


def test_of_several_changed_sources_the_first_by_name_is_told(fake_build):
    sources, built = fake_build
    for name in ("b.cpp", "a.cpp"):
        (sources / name).write_text("")
    assert _ext.prebuilt_problem() == f"{sources / 'a.cpp'} changed since ddpd._C was built"
