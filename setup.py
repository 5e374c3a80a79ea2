"""Build script: the Python package plus the ddpd._C extension.

ddpd._C is built here only when torch is importable at build time (use
`pip install -e . --no-build-isolation` with torch already installed); otherwise
ddpd.ops._ext compiles the same sources on first use.
"""
from setuptools import find_packages, setup

packages = find_packages(include=["ddpd", "ddpd.*"]) + ["ddpd.kernels"]
# The Triton kernels live in the top-level kernels/ folder but install as
# ddpd.kernels, never as a generic top-level `kernels` module.
package_dir = {"ddpd.kernels": "kernels"}

setup(packages=packages, package_dir=package_dir)
