"""FreeToken Weight format (FTW): a directory of 4 KiB-aligned tensor shards plus a JSON index.

No model knowledge lives here: `FTWWriter` streams named tensors and side files into a
directory, `FTWReader` validates it and reads tensors (with O_DIRECT where possible), and
`ftw.early` starts reading a directory's expert banks before torch is imported.
The spec is FORMAT.md beside this file. The names below load on first use, so that ftw.spec,
ftw.io and ftw.early stay free of torch.
"""
from importlib import import_module

_HOMES = {"ALIGN": "spec", "FORMAT_VERSION": "spec", "FTWError": "spec", "TensorInfo": "format",
          "FTWReader": "reader", "aligned_empty": "reader", "FTWWriter": "writer"}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(import_module(f".{_HOMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
