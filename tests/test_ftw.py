"""FTW writer/reader: bit-exact round trips, alignment, O_DIRECT and fallback, and every
validation error a user can hit (each a single actionable line)."""
from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path

import pytest
import torch

import ftw.io
import ftw.reader
from ftw import ALIGN, FORMAT_VERSION, FTWError, FTWReader, FTWWriter, aligned_empty

FP = "ab12" * 16


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "bf16": torch.randn(3, 5, generator=g).to(torch.bfloat16),
        "fp16": torch.randn(7, generator=g).to(torch.float16),
        "fp32": torch.randn(4, 4, 2, generator=g),
        "i32": torch.randint(-2**31, 2**31 - 1, (11,), dtype=torch.int32, generator=g),
        "u8": torch.randint(0, 256, (4097,), dtype=torch.uint8, generator=g),
        "scalar": torch.tensor(3.25, dtype=torch.bfloat16),
        "empty": torch.empty(0, 5),
        "big": torch.randn(1280, 2048, generator=g),  # 10 MiB, several O_DIRECT pages + chunks
    }


def _write(out: Path, tensors: dict[str, torch.Tensor], side: Path | None = None, **kw) -> None:
    with FTWWriter(out, fingerprint=FP, meta={"model_type": "toy", "dims": (1, 2)}, **kw) as w:
        for name, t in tensors.items():
            w.add(name, t, meta={"name": name})
        if side is not None:
            w.copy_file(side)
            w.copy_file(side, "tok/nested.json")


def _config(tmp_path: Path) -> Path:
    p = tmp_path / "config.json"
    p.write_text('{"model_type": "toy"}')
    return p


def _one_line_error(exc: pytest.ExceptionInfo, *needles: str) -> None:
    msg = str(exc.value)
    assert "\n" not in msg
    for n in needles:
        assert n in msg, (n, msg)


def _direct_io_allowed(d: Path) -> bool:
    """Whether this filesystem accepts an aligned O_DIRECT read (tmpfs does not)."""
    p = d / "probe"
    p.write_bytes(b"x" * ALIGN)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    try:
        os.preadv(fd, [memoryview(aligned_empty((ALIGN,), torch.uint8).numpy())], 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        p.unlink()


def test_round_trip_bit_exact(tmp_path):
    ts = _tensors()
    _write(tmp_path / "m", ts, side=_config(tmp_path))
    with FTWReader(tmp_path / "m") as r:
        assert r.names() == list(ts)
        assert r.fingerprint == FP and r.meta == {"model_type": "toy", "dims": [1, 2]}
        for name, t in ts.items():
            got, info = r.read(name), r.info(name)
            assert got.dtype == t.dtype and got.shape == t.shape and info.meta == {"name": name}
            assert torch.equal(got.view(torch.uint8) if got.dim() else got, t.view(torch.uint8) if t.dim() else t)
        assert r.file("config.json").read_text() == '{"model_type": "toy"}'
        assert r.file("tok/nested.json").is_file()
        r.verify()


def test_offsets_and_aligned_empty_are_aligned(tmp_path):
    _write(tmp_path / "m", _tensors(), shard_bytes=2 * ALIGN)  # tiny shards force rotation
    r = FTWReader(tmp_path / "m")
    assert len({r.info(n).shard for n in r.names()}) > 2
    for n in r.names():
        assert r.info(n).offset % ALIGN == 0
    index = json.loads((tmp_path / "m" / "ftw.json").read_text())
    assert all(size % ALIGN == 0 for size in index["shards"].values())
    for shape, dtype in [((3, 5), torch.bfloat16), ((), torch.float32), ((4097,), torch.uint8)]:
        t = aligned_empty(shape, dtype)
        assert t.shape == shape and t.dtype == dtype and t.data_ptr() % ALIGN == 0
        room = t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
        assert room >= -(-t.numel() * t.element_size() // ALIGN) * ALIGN


def test_read_into_out_uses_its_storage(tmp_path):
    ts = _tensors()
    _write(tmp_path / "m", ts)
    r = FTWReader(tmp_path / "m")
    out = aligned_empty((1280 * 2048,), torch.float32)  # same numel, different shape
    ptr = out.data_ptr()
    got = r.read("big", out=out)
    assert got is out and got.data_ptr() == ptr and torch.equal(out.view(1280, 2048), ts["big"])
    # An unaligned view into a larger buffer: buffered fallback, neighbours untouched.
    buf = torch.full((4097 + 2,), 7, dtype=torch.uint8)
    r.read("u8", out=buf[1:-1])
    assert torch.equal(buf[1:-1], ts["u8"]) and buf[0] == 7 and buf[-1] == 7
    with pytest.raises(ValueError):
        r.read("big", out=torch.empty(5, dtype=torch.float32))


def test_read_rows(tmp_path, monkeypatch):
    """A rank's experts: chosen rows of a tensor, runs of consecutive rows read at once, aligned
    rows (a bank's) through O_DIRECT where the filesystem allows it; the runs' pieces all go to
    the reader's threads."""
    import threading
    g = torch.Generator().manual_seed(3)
    ts = {"bank": torch.randint(0, 256, (9, 2 * ALIGN), dtype=torch.uint8, generator=g), "fp32": _tensors()["fp32"]}
    _write(tmp_path / "m", ts)
    r = FTWReader(tmp_path / "m")
    monkeypatch.setattr(ftw.io, "PIECE_BYTES", ALIGN)
    threads, pread = [], ftw.reader.pread
    monkeypatch.setattr(ftw.reader, "pread", lambda *a: (threads.append(threading.current_thread().name), pread(*a)))
    rows = [0, 2, 3, 4, 8]
    got = r.read_rows("bank", rows, aligned_empty((5, 2 * ALIGN), torch.uint8))
    assert torch.equal(got, ts["bank"][rows])
    assert len(threads) == 10 and all(t.startswith("ftw-read") for t in threads)  # 3 runs, 2 pieces a row
    assert r.direct_bytes == (5 * 2 * ALIGN if _direct_io_allowed(tmp_path) else 0)
    assert torch.equal(r.read_rows("fp32", [1, 3], torch.empty(2, 4, 2)), ts["fp32"][[1, 3]])
    for bad in ([3, 1], [1, 1], [9]):  # descending, repeated, out of range
        with pytest.raises(ValueError):
            r.read_rows("bank", bad, torch.empty(len(bad), 2 * ALIGN, dtype=torch.uint8))


def test_direct_io_used_when_allowed(tmp_path):
    ts = _tensors()
    _write(tmp_path / "m", ts)
    r = FTWReader(tmp_path / "m")
    assert torch.equal(r.read("big"), ts["big"]) and torch.equal(r.read("u8"), ts["u8"])
    expected = ts["big"].nbytes + ALIGN if _direct_io_allowed(tmp_path) else 0  # u8: one page + a 1-byte tail
    assert r.direct_bytes == expected
    r2 = FTWReader(tmp_path / "m", direct=False)
    assert torch.equal(r2.read("big"), ts["big"]) and r2.direct_bytes == 0


def test_large_reads_in_pieces_from_several_threads(tmp_path, monkeypatch):
    """A tensor larger than a piece is read by the pool, pieces and tail in place, also while
    other threads read through the same reader."""
    from concurrent.futures import ThreadPoolExecutor
    monkeypatch.setattr(ftw.io, "PIECE_BYTES", 3 * ALIGN)
    ts = _tensors()
    _write(tmp_path / "m", ts)
    r = FTWReader(tmp_path / "m")
    names = ["big", "u8", "big", "fp32", "big"]
    with ThreadPoolExecutor(3) as ex:
        got = list(ex.map(r.read, names))
    assert all(torch.equal(g, ts[n]) for g, n in zip(got, names))
    out = aligned_empty((4097 + ALIGN,), torch.uint8)[:4097]
    assert torch.equal(r.read("u8", out=out), ts["u8"])
    if _direct_io_allowed(tmp_path):
        assert r.direct_bytes == 3 * ts["big"].nbytes + 2 * ALIGN + ts["fp32"].nbytes // ALIGN * ALIGN


@pytest.mark.parametrize("refuse", ["open", "read"])
def test_direct_io_refused_falls_back(tmp_path, monkeypatch, refuse):
    ts = _tensors()
    _write(tmp_path / "m", ts)
    real_open, real_preadv = os.open, os.preadv

    def fake_open(path, flags, *a):
        if refuse == "open" and flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a)

    def fake_preadv(fd, bufs, offset):
        if refuse == "read" and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, bufs, offset)

    monkeypatch.setattr(ftw.reader.os, "open", fake_open)
    monkeypatch.setattr(ftw.reader.os, "preadv", fake_preadv)
    r = FTWReader(tmp_path / "m")
    for name in ["big", "u8", "big"]:
        assert torch.equal(r.read(name), ts[name])
    assert r.direct_bytes == 0


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_damaged_shard_refused(tmp_path, damage):
    _write(tmp_path / "m", _tensors(), shard_bytes=64 << 10)
    shard = tmp_path / "m" / "shard-00001.ftw"
    if damage == "truncate":
        os.truncate(shard, shard.stat().st_size - 1)
    else:
        shard.unlink()
    with pytest.raises(FTWError) as e:
        FTWReader(tmp_path / "m")
    _one_line_error(e, "shard-00001.ftw", "truncated" if damage == "truncate" else "missing",
                    "freetoken convert")


@pytest.mark.parametrize("edit, needles", [
    ({"format": "safetensors"}, ["not an FTW index", "freetoken convert"]),
    ({"version": FORMAT_VERSION + 1}, [f"format v{FORMAT_VERSION + 1}", "upgrade freetoken"]),
    ({"version": 0}, ["version 0", "freetoken convert"]),
    ({"version": "1"}, ["version '1'", "freetoken convert"]),
    ({"tensors": {"x": {"dtype": "float4"}}}, ["corrupt", "freetoken convert"]),
])
def test_bad_index_refused(tmp_path, edit, needles):
    _write(tmp_path / "m", _tensors())
    p = tmp_path / "m" / "ftw.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), **edit}))
    with pytest.raises(FTWError) as e:
        FTWReader(tmp_path / "m")
    _one_line_error(e, *needles)


def test_unparseable_or_missing_index_refused(tmp_path):
    _write(tmp_path / "m", _tensors())
    (tmp_path / "m" / "ftw.json").write_text('{"format": "ftw", ')
    with pytest.raises(FTWError) as e:
        FTWReader(tmp_path / "m")
    _one_line_error(e, "corrupt", "freetoken convert")
    (tmp_path / "m" / "ftw.json").unlink()
    with pytest.raises(FTWError) as e:
        FTWReader(tmp_path / "m")
    _one_line_error(e, "not an FTW directory", "freetoken convert SRC OUT")


def test_modified_side_file_refused(tmp_path):
    _write(tmp_path / "m", _tensors(), side=_config(tmp_path))
    FTWReader(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text('{"model_type": "edited"}')
    with pytest.raises(FTWError) as e:
        FTWReader(tmp_path / "m")
    _one_line_error(e, "config.json", "modified after conversion", "--force")


def test_interrupted_write_leaves_nothing(tmp_path):
    out = tmp_path / "models" / "m"
    with pytest.raises(RuntimeError, match="boom"):
        with FTWWriter(out, fingerprint=FP) as w:
            w.add("a", torch.ones(10))
            raise RuntimeError("boom")
    assert list(out.parent.iterdir()) == []


def test_existing_out_dir_needs_force(tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(FTWError) as e:
        FTWWriter(out, fingerprint=FP)
    _one_line_error(e, str(out), "already exists", "--force")
    with pytest.raises(RuntimeError):  # a failed forced write keeps the old directory
        with FTWWriter(out, fingerprint=FP, force=True) as w:
            w.add("a", torch.ones(3))
            raise RuntimeError("boom")
    assert (out / "old.txt").read_text() == "old"
    with FTWWriter(out, fingerprint=FP, force=True) as w:
        w.add("a", torch.ones(3))
    assert not (out / "old.txt").exists() and torch.equal(FTWReader(out).read("a"), torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_verify_catches_flipped_byte(tmp_path):
    _write(tmp_path / "m", _tensors())
    r = FTWReader(tmp_path / "m")
    r.verify()
    info = r.info("fp32")
    with open(tmp_path / "m" / info.shard, "r+b") as f:
        f.seek(info.offset + 10)
        b = f.read(1)
        f.seek(info.offset + 10)
        f.write(bytes([b[0] ^ 0x01]))
    r.verify(["bf16", "big"])
    with pytest.raises(FTWError) as e:
        FTWReader(tmp_path / "m").verify()
    _one_line_error(e, "'fp32'", info.shard, "corrupt")


def test_writer_rejects_misuse(tmp_path):
    with FTWWriter(tmp_path / "m", fingerprint=FP) as w:
        w.add("a", torch.ones(2))
        with pytest.raises(FTWError, match="twice"):
            w.add("a", torch.ones(2))
        with pytest.raises(FTWError, match="cannot store dtype"):
            w.add("c", torch.ones(2, dtype=torch.complex64))
        with pytest.raises(FTWError, match="JSON"):
            w.add("d", torch.ones(2), meta={"x": object()})
        with pytest.raises(FTWError, match="side file"):
            w.copy_file(_config(tmp_path), "../escape.json")
        w.add("t", torch.arange(12).view(3, 4).t())  # non-contiguous: stored as its values
    r = FTWReader(tmp_path / "m")
    assert r.names() == ["a", "t"] and torch.equal(r.read("t"), torch.arange(12).view(3, 4).t())
