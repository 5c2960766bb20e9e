"""cudaHostRegister of a 9 GiB anonymous mapping: unfaulted, MAP_POPULATE'd, touched by torch's fill;
and the CUDA context's creation while an unfaulted one registers on another thread."""
import mmap, sys, threading, time
N = 9 << 30
def t(f):
    t0 = time.perf_counter(); r = f(); return time.perf_counter() - t0, r
dt, m0 = t(lambda: mmap.mmap(-1, N)); print(f"mmap plain {dt:.3f} s")
dt, m1 = t(lambda: mmap.mmap(-1, N, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)); print(f"mmap populate {dt:.3f} s")
import torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
rt = torch.cuda.cudart()
def reg(m):
    b = torch.frombuffer(m, dtype=torch.uint8); return b, rt.cudaHostRegister(b.data_ptr(), N, 3)
dt, (b1, e) = t(lambda: reg(m1)); print(f"register populated {dt:.3f} s err {int(e)}")
dt, (b0, e) = t(lambda: reg(m0)); print(f"register unfaulted {dt:.3f} s err {int(e)}")
m2 = mmap.mmap(-1, N); b2 = torch.frombuffer(m2, dtype=torch.uint8)
dt, _ = t(lambda: b2.zero_()); print(f"torch zero_ {dt:.3f} s ({torch.get_num_threads()} threads)")
dt, e = t(lambda: rt.cudaHostRegister(b2.data_ptr(), N, 3)); print(f"register zeroed {dt:.3f} s err {int(e)}")
# a 2 GiB H2D copy from each registered buffer (sanity: pinned rate)
d = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
for name, b in (("populated", b1), ("unfaulted", b0), ("zeroed", b2)):
    torch.cuda.synchronize(); dt, _ = t(lambda: (d.copy_(b[:2 << 30], non_blocking=True), torch.cuda.synchronize()))
    print(f"H2D 2 GiB from {name}: {2 / dt:.1f} GiB/s")
