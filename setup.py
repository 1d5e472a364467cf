# cffi_modules is a setup() keyword only (not expressible in pyproject metadata).
"""Build: the cffi extension (build_native.py) and, when a GPU toolchain is found, the GPU backend
library next to it (build_native.build_gpu).  In-place copies (editable installs) are written to a
temporary file and renamed, so a process that has the old library mapped never sees a torn file.
Another ``_native*.so`` beside the extension (an earlier build's, under another suffix) is removed,
so that Python cannot import it instead."""

import os
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


class build_ext_with_gpu(build_ext):
    def copy_file(self, infile, outfile, preserve_mode=1, preserve_times=1, link=None, level=1):
        staged = f"{outfile}.tmp-{os.getpid()}"
        shutil.copy2(infile, staged)
        os.replace(staged, outfile)
        return outfile, 1

    def run(self):
        super().run()
        sys.path.insert(0, str(HERE))
        try:
            import build_native
        finally:
            sys.path.remove(str(HERE))
        built = Path(self.get_ext_fullpath(build_native.EXTENSION)).resolve()
        out = built.parent
        out.mkdir(parents=True, exist_ok=True)
        if built.exists():  # one extension file in the package, whichever command built the others
            build_native.remove_other_extensions(built)
        build_native.build_gpu(out)


setup(cffi_modules=["build_native.py:ffibuilder"], cmdclass={"build_ext": build_ext_with_gpu})
