"""The folder a model loads from when its LOAD carries Triton's overrides (a config, files).

``load_model(name, config=...)`` keeps the model's files in the repository and replaces its config.pbtxt;
``files`` (with a config) are the model's whole folder instead. Either way zinfer writes a fresh folder
under the runtime directory, ``overrides/<n>/<name>/``, and loads from there: the config as config.pbtxt
text (``modelconfig.config_json``), each file at its relative path, and, for a config alone, a link to
each entry of the repository's folder. A path that is absolute, climbs out (``..``), or names
config.pbtxt is refused, as is a config that is not a JSON object, and nothing is written; the error reads
"failed to load '<name>': ..." as Triton's does. A file that cannot be written (a name too long) is an
InternalError, "failed to load '<name>', failed to poll from model repository", as in Triton.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from zinfer.client.errors import ConfigError, InternalError, InvalidArgument
from zinfer.modelconfig.config_json import pbtxt_from_json
from zinfer.modelconfig.model_config import CONFIG_FILENAME

__all__ = ["override_folder"]

_serial = itertools.count(1)


def _relative(path: str) -> PurePosixPath:
    rel = PurePosixPath(path[1:] if path.startswith("/") else path)  # Triton's "file:/1/model.py" too
    if rel.is_absolute() or not rel.parts or any(p in ("", ".", "..") for p in rel.parts) or "\\" in path:
        raise InvalidArgument(f"load override: file path {path!r} must be relative, in the model's folder")
    if rel.parts == (CONFIG_FILENAME,):
        raise InvalidArgument(f"load override: give the config as 'config', not as a file {CONFIG_FILENAME}")
    return rel


def override_folder(
    runtime_dir: Path, repository_dir: Path, name: str, config: str, files: Mapping[str, bytes]
) -> Path:
    """Write the model's folder for a LOAD with overrides and return it (named ``name``)."""
    if files and not config:
        raise InvalidArgument(f"failed to load '{name}': a load with files needs the model's config too")
    try:  # Triton's texts start "failed to load '<name>'", which clients match on
        paths = {_relative(p): data for p, data in files.items()}
        text = pbtxt_from_json(config, f"the config of '{name}'")
    except (ConfigError, InvalidArgument) as exc:
        raise InvalidArgument(f"failed to load '{name}': {exc}") from None
    folder = runtime_dir / "overrides" / str(next(_serial)) / name
    try:
        if folder.parent.exists():
            shutil.rmtree(folder.parent)
        folder.mkdir(parents=True, mode=0o700)
        (folder / CONFIG_FILENAME).write_text(text)
        for rel, data in paths.items():
            target = folder.joinpath(*rel.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        if not paths and repository_dir.is_dir():  # a config alone: the repository's files, through links
            for child in repository_dir.iterdir():
                if child.name != CONFIG_FILENAME:
                    (folder / child.name).symlink_to(child.resolve())
    except OSError as exc:  # a name too long, a full disk: Triton's INTERNAL and text, and no path shown
        shutil.rmtree(folder.parent, ignore_errors=True)
        raise InternalError(
            f"failed to load '{name}', failed to poll from model repository: {exc.strerror or 'OSError'}"
        ) from None
    return folder
