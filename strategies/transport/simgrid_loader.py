"""SimGrid's Python module, found and loaded: from the environment, else Debian's python3-simgrid (the venv does not
see dist-packages), with SimGrid's start-up chatter on file descriptor 2 silenced."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

# Debian's python3-simgrid installs the extension module here; the venv does not see dist-packages.
DEBIAN_MODULE_DIR = Path("/usr/lib/python3/dist-packages")
INSTALL_HINT = ("install SimGrid's Python bindings: as root on Debian/Ubuntu `apt-get install -y python3-simgrid` "
                "(SimGrid 3.32; `make install` and .ci/run do this when they can); PyPI's simgrid is a source "
                "package that needs a long C++ build")



class SimGridMissing(ImportError):
    """SimGrid's Python module is not installed where syncbench looks for it."""


def load_simgrid():
    """The `simgrid` module: from the current environment, else Debian's python3-simgrid for this Python."""
    if "simgrid" in sys.modules:
        return sys.modules["simgrid"]
    spec = importlib.util.find_spec("simgrid")
    if spec is None:
        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]  # e.g. .cpython-311-x86_64-linux-gnu.so
        path = DEBIAN_MODULE_DIR / f"simgrid{suffix}"
        if not path.exists():
            raise SimGridMissing(f"SimGrid's Python module is not importable and {path} does not exist: "
                                 f"{INSTALL_HINT}")
        spec = importlib.util.spec_from_file_location("simgrid", path)
    try:
        with _quiet_stderr():  # the module announces "contexts/factory: thread" when it initializes
            module = importlib.util.module_from_spec(spec)
            sys.modules["simgrid"] = module
            spec.loader.exec_module(module)
    except ImportError as e:
        sys.modules.pop("simgrid", None)
        raise SimGridMissing(f"SimGrid's Python module did not load ({e}): {INSTALL_HINT}") from e
    return module


def simgrid_available() -> str:
    """'' when SimGrid can be used here, else why not (for pytest skip reasons and error messages)."""
    try:
        load_simgrid()
    except SimGridMissing as e:
        return str(e)
    return ""


class _quiet_stderr:
    """Silence file descriptor 2 (SimGrid's C++ logging writes there, below Python's sys.stderr)."""

    def __enter__(self):
        sys.stderr.flush()
        self._saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)

    def __exit__(self, *exc):
        os.dup2(self._saved, 2)
        os.close(self._saved)
