"""Where a profiled window's time went, from a torch.profiler Chrome trace: the link (HtoD copies),
the GPU's kernels (per stream), the host's blocking calls, and the link's longest idle gaps with
what the host thread was doing then. Usage: python3 traceparts.py TRACE.json [more ...]"""
import json, sys
from collections import defaultdict

SYNC = ("Synchronize", "cudaMemcpy ", "cudaStreamQuery")  # host calls that wait for the device


def union(iv):
    out = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def total(iv):
    return sum(b - a for a, b in iv)


def parts(path):
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    gpu = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not gpu:
        return f"{path}: no GPU events"
    t0, t1 = min(e["ts"] for e in ev), max(e["ts"] + e["dur"] for e in ev)
    span = t1 - t0
    h2d = [e for e in gpu if e["cat"] == "gpu_memcpy" and "HtoD" in e["name"]]
    link = union([(e["ts"], e["ts"] + e["dur"]) for e in h2d])
    nbytes = sum(int(e.get("args", {}).get("bytes", 0)) for e in h2d)
    per_stream = defaultdict(list)
    for e in gpu:
        if e["cat"] == "kernel":
            per_stream[e.get("args", {}).get("stream", e.get("tid"))].append((e["ts"], e["ts"] + e["dur"]))
    kernels = union([iv for v in per_stream.values() for iv in v])
    lines = [f"{path}: window {span / 1e3:.1f} ms",
             f"  link (HtoD) busy {total(link) / 1e3:.1f} ms ({total(link) / span:.0%}), {nbytes / 2**30:.2f} GiB"
             + (f", {nbytes / total(link) / 1e3:.1f} GB/s while busy" if nbytes and link else ""),
             f"  kernels busy {total(kernels) / 1e3:.1f} ms ({total(kernels) / span:.0%}); per stream: "
             + ", ".join(f"{s}: {total(union(v)) / 1e3:.1f} ms" for s, v in sorted(per_stream.items(), key=str))]
    host = [e for e in ev if e.get("cat") == "cuda_runtime"]
    blocking = defaultdict(float)
    for e in host:
        if any(s in e["name"] for s in SYNC) or (e["name"].startswith("cudaMemcpyAsync") and e["dur"] > 50):
            blocking[e["name"]] += e["dur"]
    lines.append("  host blocked in: " + ", ".join(f"{k} {v / 1e3:.1f} ms" for k, v in sorted(blocking.items(), key=lambda kv: -kv[1])[:6]))
    notes = [e for e in ev if e.get("cat") == "user_annotation"]
    if notes:
        ann = defaultdict(float)
        for e in notes:
            ann[e["name"]] += e["dur"]
        lines.append("  annotations: " + ", ".join(f"{k} {v / 1e3:.1f} ms" for k, v in sorted(ann.items(), key=lambda kv: -kv[1])[:8]))
    gaps = [(b[0] - a[1], a[1], b[0]) for a, b in zip(link, link[1:])]
    ops = [e for e in ev if e.get("cat") in ("cpu_op", "cuda_runtime", "user_annotation", "python_function")]
    lines.append("  the link's longest idle gaps (ms at, length ms: innermost host work at its middle):")
    for g, a, b in sorted(gaps, reverse=True)[:6]:
        mid = (a + b) / 2
        inner = [e for e in ops if e["ts"] <= mid <= e["ts"] + e["dur"]]
        inner = min(inner, key=lambda e: e["dur"])["name"][:60] if inner else "-"
        lines.append(f"    {(a - t0) / 1e3:8.1f} {g / 1e3:6.2f}  {inner}")
    return "\n".join(lines)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(parts(p))
