"""Load overrides (Triton's ``load_model(name, config=..., files=...)``): refusals read as Triton's."""

from __future__ import annotations

from pathlib import Path

import pytest

from zinfer.broker.load_override import override_folder
from zinfer.client.errors import InternalError, InvalidArgument


@pytest.mark.parametrize(
    ("config", "files"),
    [
        ('"parameters": {"config": {{"max_batch_size": "16"}}}', {}),  # tritonclient's example: not JSON
        ("[1, 2]", {}),  # JSON, but not an object
        ('{"backend": "python"}', {"../escape.py": b"x"}),  # a file outside the model's folder
        ('{"backend": "python"}', {"/etc/passwd/../../x": b"x"}),
    ],
)
def test_a_refused_override_reads_failed_to_load_and_writes_nothing(
    tmp_path: Path, config: str, files: dict[str, bytes]
) -> None:
    runtime, repo = tmp_path / "rt", tmp_path / "repo" / "simple"
    repo.mkdir(parents=True)
    with pytest.raises(InvalidArgument) as err:
        override_folder(runtime, repo, "simple", config, files)
    assert str(err.value).startswith("failed to load 'simple': ")
    assert not runtime.exists()
    assert not (tmp_path / "escape.py").exists()


def test_a_config_override_keeps_the_repositorys_files(tmp_path: Path) -> None:
    repo = tmp_path / "repo" / "simple"
    (repo / "1").mkdir(parents=True)
    (repo / "config.pbtxt").write_text('name: "simple"')
    folder = override_folder(tmp_path / "rt", repo, "simple", '{"max_batch_size": 16}', {})
    assert "max_batch_size: 16" in (folder / "config.pbtxt").read_text()
    assert (folder / "1").resolve() == (repo / "1").resolve()


def test_a_file_that_cannot_be_written_is_tritons_internal_error_and_leaves_nothing(tmp_path: Path) -> None:
    """tritonclient's simple_grpc_model_control.py sends a 256-character file name and expects INTERNAL
    with "failed to poll from model repository"; the runtime path is not shown."""
    runtime, repo = tmp_path / "rt", tmp_path / "repo" / "simple"
    repo.mkdir(parents=True)
    with pytest.raises(InternalError) as err:
        override_folder(runtime, repo, "simple", "{}", {"A" * 256: b"a"})
    assert str(err.value).startswith("failed to load 'simple', failed to poll from model repository")
    assert str(tmp_path) not in str(err.value)
    assert not any((runtime / "overrides").iterdir())
