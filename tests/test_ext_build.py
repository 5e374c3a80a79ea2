"""The ddpd._C build chain: source discovery, the staleness check that decides
between the module built by setup.py and compiling on first use, the compile call
itself (mocked here; a real compile in a fresh cache is the slow test at the end),
and the sources shipped with the package."""
import json
import os
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

ROOT = Path(__file__).resolve().parents[1]


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
    assert "is missing" in _ext.prebuilt_problem()


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
    with pytest.raises(RuntimeError, match=r"compiling it in .* failed: .*more.cpp \(DDPD_EXTENSIONS_DIR sets"):
        _ext._compile("a test asked for it")


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


def test_an_install_without_a_compiler_leaves_the_build_to_first_use(tmp_path):
    """setup.py with a compiler that fails: the install goes on without ddpd._C, saying that
    its first use will compile it (`pip install --no-build-isolation` used to end in a
    traceback from torch's build)."""
    root = Path(__file__).resolve().parents[1]
    copy = tmp_path / "src"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".git", "build", "*.so", _ext.BUILD_INFO, "__pycache__",
                                                              "*.egg-info", "tests", "benchmarks", "docs"))
    env = dict(os.environ, CC="/bin/false", CXX="/bin/false")
    proc = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=copy, env=env,
                          capture_output=True, text=True, timeout=HANG_GUARD_SECONDS)
    assert proc.returncode == 0, proc.stderr
    assert "ddpd: building ddpd._C failed (" in proc.stderr and "compile it on first use" in proc.stderr
    assert not list((copy / "ddpd").glob("_C*.so"))


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
        "assert torch.equal(multinomial(w, 4, seed=1), multinomial_reference(w, 4, seed=1))\n"
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


def test_python_m_ddpd_ops_names_the_module_without_a_warning():
    """`python -m ddpd.ops._ext`, which the README gave, ran a second copy of a module that
    ddpd.ops imports (a runpy RuntimeWarning)."""
    done = subprocess.run([sys.executable, "-W", "error", "-m", "ddpd.ops"], capture_output=True, text=True,
                          timeout=HANG_GUARD_SECONDS)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith("ddpd: extension ddpd") and "CUDA kernels: " in done.stdout


def test_one_cache_directory_per_checkout_and_environment(monkeypatch, tmp_path):
    """Two environments of one checkout shared a directory, and ninja (whose build file
    names torch's paths) silently rebuilt the extension at every switch."""
    here = _ext._cache_dir(False, ROOT / "csrc")
    assert here == _ext._cache_dir(False, ROOT / "csrc")
    assert _ext._cache_dir(False, tmp_path) != here
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "another-venv"))
    assert _ext._cache_dir(False, ROOT / "csrc") != here


def test_python_m_ddpd_ops_says_why_in_one_line(tmp_path):
    (tmp_path / "a-file").write_text("")
    env = {**os.environ, "DDPD_FORCE_JIT": "1", "DDPD_EXTENSIONS_DIR": str(tmp_path / "a-file")}
    done = subprocess.run([sys.executable, "-m", "ddpd.ops"], capture_output=True, text=True, env=env,
                          timeout=HANG_GUARD_SECONDS)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("ddpd: the C++ extension is unavailable (DDPD_FORCE_JIT is set)")
