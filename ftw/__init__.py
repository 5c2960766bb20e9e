"""FreeToken Weight format (FTW): a directory of 4 KiB-aligned tensor shards plus a JSON index.

No model knowledge lives here: `FTWWriter` streams named tensors and side files into a
directory, `FTWReader` validates it and reads tensors (with O_DIRECT where possible).
The spec is FORMAT.md beside this file.
"""
from .format import ALIGN, FORMAT_VERSION, FTWError, TensorInfo
from .reader import FTWReader, aligned_empty
from .writer import FTWWriter

__all__ = ["ALIGN", "FORMAT_VERSION", "FTWError", "FTWReader", "FTWWriter", "TensorInfo",
           "aligned_empty"]
