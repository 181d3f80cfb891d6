"""Runs Kyutai's own Python client, `moshi.client` of the PyPI package moshi==0.2.13, unmodified.

`python -m moshi.client` would import torch through moshi/__init__.py; the client itself needs
only aiohttp, numpy, sphn and sounddevice. So `moshi` is registered as a bare package pointing at
the installed files, and `moshi.client.main()` runs as it is. Arguments are the client's own
(--host, --port, --https, --url).
"""
import importlib.util
import sys
import types

spec = importlib.util.find_spec("moshi")
if spec is None or not spec.submodule_search_locations:
    sys.exit("the moshi package is not installed (scripts/setup.sh --serve-e2e installs it)")
package = types.ModuleType("moshi")
package.__path__ = list(spec.submodule_search_locations)
sys.modules["moshi"] = package

import moshi.client  # noqa: E402  (after the bare package is registered)

sys.argv = ["moshi.client"] + sys.argv[1:]
moshi.client.main()
