"""python -m ddpd.ops: which ddpd._C this process loads (the module built at install,
or the one compiled on first use) and whether it holds the CUDA kernels; with --cuda it
fails without them. (Run as `python -m ddpd.ops._ext` it would be a second copy of the
module that ddpd.ops imports, which runpy warns of.)"""
import argparse
import sys

from ddpd.ops import _ext

parser = argparse.ArgumentParser(prog="python -m ddpd.ops", description=(
    "Load ddpd's C++/CUDA extension (compiling it on first use if the install did not build it) "
    "and print which module was loaded and whether it holds the CUDA kernels."))
parser.add_argument("--cuda", action="store_true", help="exit 1 unless the extension holds the CUDA kernels "
                    "(without them the ops run their torch references on a GPU)")
args = parser.parse_args()
try:
    module = _ext.load()
except RuntimeError as error:  # the build's one-line reason, as the tools give it
    sys.exit(str(error).splitlines()[0])
loaded = f"ddpd: extension {module.__name__} from {module.__file__}"
if args.cuda and not module.with_cuda:
    sys.exit(f"{loaded} holds no CUDA kernels (--cuda)")
print(f"{loaded}, CUDA kernels: {bool(module.with_cuda)}")
