"""The command line builds its pydantic models without pydantic's plugin discovery.

The first time a model class is built, pydantic looks for plugins (third-party validation
hooks) in every installed distribution's entry points: that imports importlib.metadata (and
with it email, csv, zipfile, socket) and reads each package's metadata, about 13 ms of the
170 ms of CPU a `zlayout plan` takes, for hooks zlayout's models have no use for. zlayout.cli
imports this module before zlayout.spec builds its models; it hands pydantic an empty plugin
list. Setting PYDANTIC_DISABLE_PLUGINS (even to nothing) leaves the discovery to pydantic, and
so does a process that built a pydantic model before.
"""

from __future__ import annotations

import os
import sys
import types

LOADER = "pydantic.plugin._loader"  # pydantic.plugin._schema_validator asks it for get_plugins()


def no_plugins() -> tuple[()]:
    return ()


if LOADER not in sys.modules and "PYDANTIC_DISABLE_PLUGINS" not in os.environ:
    loader = types.ModuleType(LOADER, "pydantic's plugin loader, answering no plugins (zlayout)")
    loader.get_plugins = no_plugins  # type: ignore[attr-defined]
    sys.modules[LOADER] = loader
