"""The quantized-weight reference (freetoken_kernels/quant.py): round trips, the packing against a second
reading of each format's published description, and the error bounds of each quantizer."""
import pytest
import torch

from freetoken_kernels.quant import E2M1, QWeight, dequant, pack_nibbles, quantize, unpack_nibbles


def test_nibbles_round_trip_and_order():
    codes = torch.randint(0, 16, (3, 8), dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.shape == (3, 4)
    assert int(packed[0, 0]) == int(codes[0, 0]) + 16 * int(codes[0, 1])  # even k: low nibble
    assert torch.equal(unpack_nibbles(packed), codes)


@pytest.mark.parametrize("fmt,group,tol", [("int8", 16, 0.01), ("int4", 16, 0.15), ("fp8", 16, 0.07),
                                           ("mxfp4", 32, 0.3)])
@pytest.mark.parametrize("symmetric", [True, False])
def test_quantize_dequant_error_is_bounded(fmt, group, tol, symmetric):
    torch.manual_seed(0)
    w = torch.randn(48, 64)
    q, s, z, block = quantize(fmt, w, group, symmetric=symmetric)
    back = dequant(fmt, q, s, z, block)
    assert back.shape == w.shape
    rel = (back - w).norm() / w.norm()
    assert rel < tol, (fmt, float(rel))
    if not symmetric:  # min/max rounding moves with the input: no fixed point to check
        return
    # quantizing the dequantized weights again is exact (the codes are a fixed point)
    again = dequant(fmt, *quantize(fmt, back, group, symmetric=symmetric))
    assert torch.allclose(again, back, atol=1e-6 if fmt != "fp8" else 1e-3 * back.abs().max())


def test_int4_asymmetric_by_the_gptq_formula():
    """Second reading: GPTQ/AWQ dequantize w = scale * (q - zero) per group of columns."""
    q = torch.tensor([[0x21, 0xF0]], dtype=torch.uint8)  # codes 1, 2, 0, 15
    s = torch.tensor([[0.5, 2.0]], dtype=torch.float16)  # groups of 2 along K
    z = torch.tensor([[1, 3]], dtype=torch.uint8)
    assert dequant("int4", q, s, z, (1, 2)).tolist() == [[0.0, 0.5, -6.0, 24.0]]


def test_fp8_blocks_and_mxfp4_by_their_descriptions():
    q = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]).to(torch.float8_e4m3fn)
    s = torch.tensor([[1.0, 10.0], [100.0, 1000.0]])      # 2 x 2 blocks, the last ones partial
    assert dequant("fp8", q, s, None, (2, 2)).tolist() == [[1, 2, 30], [4, 5, 60], [700, 800, 9000]]
    # OCP MX: e2m1 code 0b0111 = 6.0, 0b1010 = -1.0; e8m0 127 = 2**0, 129 = 2**2
    codes = torch.tensor([7, 10] + [0] * 30 + [1, 15] + [0] * 30, dtype=torch.uint8)[None]
    mx = dequant("mxfp4", pack_nibbles(codes), torch.tensor([[127, 129]], dtype=torch.uint8), None, (1, 32))
    assert mx[0, :2].tolist() == [6.0, -1.0] and mx[0, 32:34].tolist() == [2.0, -24.0]
    assert E2M1[7] == 6.0


def test_qweight_shape_and_slot_dequant():
    w = torch.randn(2, 8, 32)
    parts = [quantize("int4", w[i], 16) for i in range(2)]
    qw = QWeight("int4", *(torch.stack([p[j] for p in parts]) for j in range(3)), parts[0][3])
    assert qw.shape == (2, 8, 32)
    assert torch.equal(qw.dequant(1), dequant("int4", *parts[1]))
    assert qw.nbytes_per_slot == 8 * 16 + 8 * 2 * 2 + 8 * 2


def test_group_that_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="does not divide"):
        quantize("int4", torch.randn(4, 24), 16)
