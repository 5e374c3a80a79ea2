"""Build script: the Python package plus the ddpd._C extension.

ddpd._C is built here only when torch is importable at build time (use
`pip install -e . --no-build-isolation` with torch already installed); otherwise
ddpd.ops._ext compiles the same sources on first use. With a CUDA build of torch
and a CUDA toolkit the CUDA kernels (csrc/cuda) are compiled in as well, for the
visible GPUs or those TORCH_CUDA_ARCH_LIST names (with neither, ddpd._C is built
without them). The source list and the flags come from ddpd/ops/_ext.py, shared by
both routes.

pip shows a build's output only when the build fails or with -v. What a user must
know (ddpd._C not built, or built without its CUDA kernels, and why) is a warning,
which pip shows in one line; the compile's progress, and its failure, go to the
terminal pip runs in.
"""
import importlib.util
import json
import sys
import threading
import time
import warnings
from pathlib import Path

import setuptools
from setuptools import find_namespace_packages, find_packages, setup

ROOT = Path(__file__).resolve().parent
CSRC = "csrc"
SETUPTOOLS = (77, 0)  # pyproject.toml's `license = "MIT"` (an SPDX string, PEP 639)


def _check_setuptools(version: str) -> None:
    """`--no-build-isolation` builds with the environment's setuptools, whatever its age
    (Python 3.11's venv brings 65): one line, not setuptools' schema error."""
    found = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    if found < SETUPTOOLS:
        sys.exit(f"ddpd: building needs setuptools >= {'.'.join(map(str, SETUPTOOLS))}, this is setuptools {version}; "
                 "`pip install --upgrade setuptools wheel` first")


_check_setuptools(setuptools.__version__)
# An editable install of a package whose folders are mapped (kernels/ -> ddpd.kernels) goes
# through an import finder, and setuptools then warns, in nine lines at every install, that a
# folder named like the package in the working directory may shadow it: here that folder is
# the package.
from setuptools.warnings import InformationOnly  # noqa: E402 (after the version check)

warnings.filterwarnings("ignore", message="Editable installation", category=InformationOnly)

packages = find_packages(include=["ddpd", "ddpd.*"]) + ["ddpd.kernels", "ddpd._csrc"]
# Folders of data alone (the C++ sources, the pretrained bundle) are named as packages too:
# setuptools warns, forty lines for each, about a folder it installs but was not told of.
packages += [f"ddpd._csrc.{name}" for name in find_namespace_packages(str(ROOT / CSRC))]
packages += [f"ddpd.pretrained.{name}" for name in find_namespace_packages(str(ROOT / "ddpd" / "pretrained"))]
# The Triton kernels live in the top-level kernels/ folder but install as
# ddpd.kernels, never as a generic top-level `kernels` module. The C++ sources ship
# as ddpd/_csrc so that an install built without torch can compile them on first use.
package_dir = {"ddpd.kernels": "kernels", "ddpd._csrc": CSRC}


def _load_ext_config():
    spec = importlib.util.spec_from_file_location("_ddpd_ext_config", ROOT / "ddpd" / "ops" / "_ext.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONFIG = _load_ext_config()  # ddpd/ops/_ext.py, without importing ddpd or torch
# The default sampling bundle (ddpd.pretrained): weights and configs only, never a
# training state that a copied checkpoint directory might still hold, nor the backup
# (text8.previous) that replacing it keeps. The shipped data (ddpd.assets): the books
# corpus, the GPT-2 ranks and their licences. py.typed: type checkers read ddpd's annotations (PEP 561).
package_data = {"ddpd": ["py.typed"], "ddpd._csrc": CONFIG.PACKAGE_DATA,
                "ddpd.pretrained": ["text8/*/*.safetensors", "text8/*/*.json"],
                "ddpd.assets": ["books.txt", "gpt2.tiktoken", "NOTICE.md"]}
exclude_package_data = {"ddpd.pretrained": ["**/train_state.*"]}


def _warn(line: str) -> None:
    """A line that reaches the user. pip shows a build's output only when the build fails or
    runs with -v, but it shows the build's warnings (pip 26.3 does, installing a local
    checkout). At line 0 no source line follows it."""
    warnings.warn_explicit(line, UserWarning, "setup.py", 0)


class _Terminal:
    """Progress lines onto the terminal pip runs in, if there is one: a warning would only
    show once the build is over."""

    def __init__(self):
        self.lines = 0

    def say(self, line: str) -> None:
        if sys.stderr.isatty():  # run by hand
            print(line, file=sys.stderr, flush=True)
            return
        self._write(line)

    def echo(self, warned: str) -> None:
        """A line also given as a warning, which an older pip (23.2 here) shows only with -v."""
        if not sys.stderr.isatty():  # by hand, the warning is on the terminal already
            self._write(warned)

    def _write(self, line: str) -> None:
        try:
            with open("/dev/tty", "w") as tty:
                # pip's spinner ends its line ("... |"), then draws at the start of the line
                # after ours: the first line starts a line, the next ones clear the spinner's.
                tty.write(("\r\033[K" if self.lines else "\n") + line + "\n")
            self.lines += 1
        except OSError:  # no terminal (CI, a service): `pip -v` shows ninja's own progress
            pass


TERMINAL = _Terminal()


class _Progress:
    """Says how many sources of ddpd._C are compiled as each object lands in the build
    folder: the compile takes minutes on a small machine, under pip's silent spinner."""

    def __init__(self, folder: Path, total: int):
        self.folder, self.total = folder, total
        self.start = time.time()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def _compiled(self) -> int:
        # objects of this run only: ninja leaves those an earlier run made up to date alone
        count = 0
        for path in self.folder.rglob("*.o"):
            try:
                count += path.stat().st_mtime >= self.start - 1
            except OSError:  # gone since the listing
                pass
        return count

    def _watch(self):
        said = 0
        while True:
            stopping = self.stop.wait(1.0)
            compiled = self._compiled()
            if compiled > said:
                said = compiled
                TERMINAL.say(f"ddpd: compiled {compiled} of {self.total} sources of ddpd._C "
                             f"({_elapsed(self.start)})")
            if stopping:
                return


def _elapsed(start: float) -> str:
    seconds = round(time.time() - start)
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


def _without_torch():
    """No torch to build against: build_py (it runs in every build of a wheel, never for the
    metadata) says that the first use compiles ddpd._C."""
    from setuptools.command.build_py import build_py

    class BuildPyTellingWhy(build_py):
        def run(self):
            _warn("ddpd: ddpd._C is not built: torch is not importable at build time (`pip install "
                  "--no-build-isolation` builds against the installed torch); its first use compiles it")
            super().run()

    return {"cmdclass": {"build_py": BuildPyTellingWhy}}


def _extension_kwargs():
    try:
        import torch  # noqa: F401
        from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension
    except ImportError:
        return _without_torch()
    config = CONFIG
    with_cuda = config.can_build_cuda()
    extension = CUDAExtension if with_cuda else CppExtension
    # setuptools wants source paths relative to this file.
    sources = [str(Path(p).relative_to(ROOT)) for p in config.sources(ROOT / CSRC, with_cuda)]

    class BuildExtensionWithInfo(BuildExtension):
        """Says what it builds, how far it is and whether it failed; records what ddpd._C was
        built against, for the staleness check in _ext.py."""

        def run(self):
            if not with_cuda and config.has_cuda_toolkit():  # a CUDA torch and nvcc, no GPU to build for
                _warn(f"ddpd: building ddpd._C without its CUDA kernels: {config.cuda_arch_problem()}")
            kind = "C++ and CUDA" if with_cuda else "C++"
            TERMINAL.say(f"ddpd: compiling ddpd._C from {len(sources)} {kind} sources (minutes on a small machine)")
            start = time.time()
            try:
                with _Progress(Path(self.build_temp), len(sources)):
                    super().run()  # builds in build_lib, then copies the module into the source tree if inplace
            except Exception as error:  # no compiler, a failed compile: the first-use route remains
                why, needs = config.build_failure(error)
                failed = f"ddpd: building ddpd._C failed ({why}; {needs}); ddpd.ops._ext will compile it on first use"
                _warn(failed)
                TERMINAL.echo(failed)  # the end of the progress lines
                return
            folders = {Path(self.get_ext_fullpath("ddpd._C")).parent}
            if self.inplace:
                folders.add(ROOT / self.get_finalized_command("build_py").get_package_dir("ddpd"))
            for folder in folders:
                (folder / config.BUILD_INFO).write_text(json.dumps(config.build_info(with_cuda, ROOT / CSRC)))
            TERMINAL.say(f"ddpd: built ddpd._C in {_elapsed(start)}")

    return {
        "ext_modules": [
            extension(
                "ddpd._C",
                sources=sources,
                include_dirs=[str(ROOT / CSRC)],
                extra_compile_args={"cxx": config.cxx_flags(with_cuda), "nvcc": config.NVCC_FLAGS},
                extra_link_args=config.LINK_FLAGS,
            )
        ],
        "cmdclass": {"build_ext": BuildExtensionWithInfo},
    }


setup(packages=packages, package_dir=package_dir, package_data=package_data,
      exclude_package_data=exclude_package_data, **_extension_kwargs())
