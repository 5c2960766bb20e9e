"""MODEL argument -> FTW directory: an FTW directory (or the name of a converted model in the
cache) is used as is; a HF directory or hub id is converted once into the user cache directory
and reused while its fingerprint matches. Also the cache's listing and removal."""
from __future__ import annotations

import glob
import json
import re
import shutil
from pathlib import Path
from typing import Callable

from engine.config import cache_dir, hf_offline
from engine.errors import UserError
from engine.fingerprint import fingerprint

HUB_PATTERNS = ["*.safetensors", "*.json", "*.jinja", "*.txt", "*.model"]
DEMO = Path(__file__).parent / "demo" / "model"


def is_ftw(path: Path) -> bool:
    return (path / "ftw.json").is_file()


def models_dir() -> Path:
    """Where converted models live, one FTW directory each."""
    return cache_dir() / "models"


def hf_source(model: str) -> Path:
    """A local HF directory, or a hub id downloaded (or found in the local hub cache)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists() or not re.fullmatch(r"[\w.-]+/[\w.-]+", model):
        raise UserError(f"model {model!r} not found: give an FTW directory, a HuggingFace model "
                        "directory, or a hub id like Qwen/Qwen3-30B-A3B")
    from huggingface_hub import snapshot_download
    try:
        return Path(snapshot_download(model, allow_patterns=HUB_PATTERNS, local_files_only=hf_offline()))
    except Exception as e:  # hub errors come in many types (offline, 404, gated, auth)
        raise UserError(f"cannot download {model} from the Hugging Face Hub ({type(e).__name__}); "
                        "check the id and your connection, or pass a local directory") from None


def cache_name(model: str | None) -> str:
    """The start of the names of MODEL's conversions in the cache (then -DTYPE-FINGERPRINT)."""
    return re.sub(r"[^\w.-]+", "_", (model or "demo").strip("/"))[-60:]


def model_key(model: str | None) -> str:
    """Names MODEL without downloading or converting it: the absolute path of a local directory
    (or of a converted model in the cache named MODEL), else the hub id as given."""
    path = Path(model).expanduser() if model else DEMO
    if not path.exists() and model and is_ftw(models_dir() / model):
        path = models_dir() / model
    return str(path.resolve()) if path.exists() else str(model)


def ftw_dir(model: str | None, converted: bool = False) -> Path | None:
    """MODEL's FTW directory if it is one, or names a converted model in the cache; with
    `converted`, also the conversion in the cache of an HF directory or of a hub id already
    downloaded, while its fingerprint matches. No conversion, no download, no torch; else None."""
    path = Path(model).expanduser() if model else DEMO
    if is_ftw(path):
        return path
    if model and is_ftw(models_dir() / model):
        return models_dir() / model
    if not converted:
        return None
    src = path if path.is_dir() else None
    if src is None and model and re.fullmatch(r"[\w.-]+/[\w.-]+", model):
        try:
            from huggingface_hub import snapshot_download
            src = Path(snapshot_download(model, allow_patterns=HUB_PATTERNS, local_files_only=True))
        except Exception:  # not in the local hub cache (or no hub library): nothing converted to find
            return None
    name, prints = cache_name(model), {}  # one fingerprint a dtype: it reads the side files
    for out in sorted(models_dir().glob(f"{glob.escape(name)}-*-*")) if src and models_dir().is_dir() else ():
        try:
            dt = json.loads((out / "ftw.json").read_text())["meta"]["dtype"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if dt not in prints:
            prints[dt] = fingerprint(src, dt)[:12]
        if out.name == f"{name}-{dt}-{prints[dt]}":
            return out
    return None


def ensure_ftw(model: str | None, dtype: str = "auto",
               progress: Callable[[int, int], None] | None = None) -> Path:
    """Return an FTW directory for MODEL (None = the embedded demo model), converting if needed."""
    if (found := ftw_dir(model)) is not None:
        return found
    from engine.convert import convert, target_dtype
    from engine.models import model_config, read_hf_config
    path = Path(model).expanduser() if model else DEMO
    src = hf_source(str(path))
    dt = target_dtype(model_config(read_hf_config(src)), dtype)
    out = models_dir() / f"{cache_name(model)}-{dt}-{fingerprint(src, dt)[:12]}"
    if is_ftw(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    return convert(src, out, dt, force=True, progress=progress)


def converted_models() -> list[dict]:
    """The converted models in the cache: name, source, format (the stored dtype), bytes, path.
    A directory whose index cannot be read is listed with "?" so that it can still be removed."""
    rows = []
    for path in sorted(models_dir().iterdir()) if models_dir().is_dir() else []:
        if not is_ftw(path):
            continue  # a conversion in progress or cut short
        try:
            meta = json.loads((path / "ftw.json").read_text())["meta"]
        except (ValueError, KeyError, TypeError):
            meta = {}
        rows.append({"name": path.name, "source": meta.get("source", "?"), "format": meta.get("dtype", "?"),
                     "bytes": sum(f.stat().st_size for f in path.rglob("*") if f.is_file()), "path": path})
    return rows


def remove_converted(name: str) -> Path:
    """Delete converted model NAME (as `converted_models` lists it) from the cache."""
    path = models_dir() / name
    if Path(name).name != name or name in (".", "..") or not is_ftw(path):
        raise UserError(f"no converted model {name!r} in {models_dir()}; `freetoken ls` lists them")
    shutil.rmtree(path)
    return path
