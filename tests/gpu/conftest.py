"""GPU tests: everything under tests/gpu is marked ``gpu`` and skipped unless CuPy sees a CUDA device.

"No GPU" means CuPy is not installed, or CUDA reports no device (no driver, none visible). Anything else is
a real failure and must fail, not skip: a CuPy that raises at import, or one that warns at import (two CuPy
packages over each other, say), is imported here with its warnings shown, not turned into errors by
``filterwarnings = error`` and then into "no GPU".
"""

from __future__ import annotations

import importlib.util
import warnings

import pytest

_REASON = ""
_IMPORT_WARNINGS: list[str] = []


def _gpu_available() -> bool:
    global _REASON
    if importlib.util.find_spec("cupy") is None:
        _REASON = "CuPy is not installed"
        return False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import cupy  # type: ignore[import-not-found]  # raising here fails the run, as it should
    _IMPORT_WARNINGS.extend(f"{w.category.__name__}: {w.message}" for w in caught)
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except cupy.cuda.runtime.CUDARuntimeError as exc:  # no driver, no device: not a failure of ours
        _REASON = f"CUDA reports no usable device ({exc})"
        return False
    _REASON = "CUDA reports no device"
    return count > 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "tests/gpu/" in str(item.fspath)]
    if not gpu_items:
        return
    available = _gpu_available()
    for item in gpu_items:
        item.add_marker(pytest.mark.gpu)
        if not available:
            item.add_marker(pytest.mark.skip(reason=f"needs CuPy and a CUDA device: {_REASON}"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for text in _IMPORT_WARNINGS:  # shown, never hidden: two CuPy packages installed over each other, say
        terminalreporter.write_line(f"tests/gpu: CuPy warned at import: {text}", yellow=True)
