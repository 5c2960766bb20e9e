"""Page faults of a large anonymous mapping here: MADV_HUGEPAGE or not, faulted by torch's fill
(16 threads) or by O_DIRECT reads (8 threads, 16 MiB pieces, as ftw.early reads), and the
cudaHostRegister after each. argv[1]: a file of >= 4 GiB to read."""
import mmap, os, sys, threading, time
import torch
N = 4 << 30
F = sys.argv[1]
torch.zeros(1, device="cuda"); rt = torch.cuda.cudart()
def t(f):
    t0 = time.perf_counter(); f(); return time.perf_counter() - t0
def mapping(huge):
    m = mmap.mmap(-1, N)
    if huge:
        m.madvise(mmap.MADV_HUGEPAGE)
    return m
def read_into(m):
    fd = os.open(F, os.O_RDONLY | os.O_DIRECT); view = memoryview(m); P = 16 << 20
    pieces = list(range(0, N, P)); lock = threading.Lock()
    def work():
        while True:
            with lock:
                if not pieces: return
                a = pieces.pop(0)
            os.preadv(fd, [view[a:a + P]], a)
    ths = [threading.Thread(target=work) for _ in range(8)]
    [th.start() for th in ths]; [th.join() for th in ths]; os.close(fd)
def register(m):
    b = torch.frombuffer(m, dtype=torch.uint8); e = rt.cudaHostRegister(b.data_ptr(), N, 3); assert int(e) == 0
    rt.cudaHostUnregister(b.data_ptr())
for huge in (False, True, False, True):
    m = mapping(huge); b = torch.frombuffer(m, dtype=torch.uint8)
    z = t(lambda: b.zero_()); r = t(lambda: register(m)); del b; m.close()
    m = mapping(huge); rd = t(lambda: read_into(m)); r2 = t(lambda: register(m)); m.close()
    m = mapping(huge); b = torch.frombuffer(m, dtype=torch.uint8); b.zero_(); rd2 = t(lambda: read_into(m)); del b; m.close()
    print(f"huge={huge}: zero_ {z:.2f} s, register after {r:.2f} s | O_DIRECT read into fresh {rd:.2f} s ({N / rd / 1e9:.2f} GB/s), "
          f"register after {r2:.2f} s | read into zeroed {rd2:.2f} s ({N / rd2 / 1e9:.2f} GB/s)", flush=True)
p = torch.empty(N, dtype=torch.uint8, pin_memory=True); del p
print(f"torch pin_memory alloc of 4 GiB (cudaHostAlloc): {t(lambda: torch.empty(N, dtype=torch.uint8, pin_memory=True)):.2f} s")
