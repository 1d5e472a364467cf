# cffi_modules is a setup() keyword only (not expressible in pyproject metadata).
from setuptools import setup

setup(cffi_modules=["build_native.py:ffibuilder"])
