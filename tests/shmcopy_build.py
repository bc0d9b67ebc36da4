"""The front door's system shm copy helper (``frontdoor/_shmcopy.c``) for tests: the installed one, else
one built from its source, since an editable install has none."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sysconfig
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).resolve().parents[1] / "frontdoor" / "_shmcopy.c"


def shmcopy_helper(build_dir: Path) -> Path | None:
    """The helper's shared library: the installed one, else one built into ``build_dir`` (None: no C
    compiler or Python headers here)."""
    spec = importlib.util.find_spec("zinfer.frontdoor._shmcopy")
    if spec is not None and spec.origin:
        return Path(spec.origin)
    cc = shutil.which("cc") or shutil.which("gcc")
    include = sysconfig.get_paths()["include"]
    if cc is None or not (Path(include) / "Python.h").exists():
        return None
    out = build_dir / f"_shmcopy{sysconfig.get_config_var('EXT_SUFFIX')}"
    cmd = [cc, "-O2", "-shared", "-fPIC", f"-I{include}", str(SOURCE), "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    return out


def load_helper(path: Path) -> ModuleType:
    """The helper module loaded from ``path`` (not installed as ``zinfer.frontdoor._shmcopy``)."""
    spec = importlib.util.spec_from_file_location("_shmcopy", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
