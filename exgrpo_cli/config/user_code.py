"""Loading what a command line names by `path/to/file.py:name` or `package.module:name`: the
user's reward function (`reward.function`) and replay method (`replay.method`).

Where it sits: at start-up (commands/variants.py, before any model loads: a typo is one line and
exit code 2) and again where the object is used (the reward's worker process, the trainer's
builder). Only a command's own config names a file here, never a run, checkpoint or model folder
(docs/DESIGN's "trust comes from the command"): importing a file executes it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from typing import Any

from exgrpo_cli.config.schema import ConfigError


def load_named(spec: str, key: str) -> Any:
    """The object `spec` names (`file.py:name` or `module:name`); ConfigError (exit 2) with one line
    naming `key` when the file or module does not import or the name is absent."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise ConfigError(f"invalid {key}={spec!r}: allowed path/to/file.py:name or package.module:name")
    try:
        if where.endswith(".py") or os.sep in where or "/" in where:
            path = Path(where).expanduser()
            if not path.is_file():
                raise ConfigError(f"invalid {key}={spec!r}: no such file {path}")
            # one module name per key: a reward file and a method file of one stem do not collide
            module_name = f"exgrpo_user_{key.partition('.')[0]}_{path.stem}"
            module_spec = importlib.util.spec_from_file_location(module_name, path)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except ConfigError:
        raise
    except BaseException as err:  # SyntaxError, ImportError, whatever its top level raises
        raise ConfigError(
            f"invalid {key}={spec!r}: importing it failed ({type(err).__name__}: {err})"
        ) from None
    obj = getattr(module, name, None)
    if obj is None:
        raise ConfigError(f"invalid {key}={spec!r}: {where} has no {name!r}")
    return obj
