"""GPU tests: everything under tests/gpu is marked ``gpu`` and skipped unless CuPy sees a CUDA device."""

from __future__ import annotations

import pytest


def _gpu_available() -> bool:
    try:
        import cupy  # type: ignore[import-not-found]

        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    available = _gpu_available()
    for item in items:
        if "tests/gpu/" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)
            if not available:
                item.add_marker(pytest.mark.skip(reason="needs CuPy and a CUDA device"))
