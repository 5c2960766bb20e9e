"""Experts across ranks on torch.distributed: one process (rank) per GPU, on one host or several.
Every rank holds the dense weights and its share of the routed experts (engine.moe.shard); per
MoE layer each rank computes its experts' routes for every token of the step and an all-reduce
sums the partial outputs (NCCL between GPUs, inside the decode CUDA graph; gloo on CPUs).

Rank 0 owns the tokenizer, the scheduler and the server. The others follow one kind of message,
broadcast by rank 0 over a gloo group: (function, arguments), which every rank runs on its own
state in the same order -- a step (the ForwardBatch, with the changes rank 0's scheduler made
to KV pages and hybrid models' recurrent states since the last step, which the others replay
first), a load, a cache rebuild or resize, a report of its counters, or None to leave. Rank 0 runs one message at a time (a lock), so the HTTP thread's
/v1/stats and the engine thread's steps never interleave.

Launch: with --world-size N on one host, rank 0 (the command itself) spawns ranks 1..N-1, one
per GPU of --gpus, and they meet through a file store; under torchrun the usual environment
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK, LOCAL_WORLD_SIZE) defines the group and
every rank but 0 turns follower at the start of the command. The ranks of one host split its
cores into equal blocks, so their CPU expert pools do not share cores.

Failure: a rank that dies closes its sockets, and every collective waiting on it fails at once
(gloo); rank 0 also watches the ranks it spawned (their process sentinels) and a spawned rank
watches rank 0, so a death is noticed within a second even when nothing is running. Whoever
notices writes one line to stderr and ends its process, which the others then notice in turn.
A rank alive but stuck inside a step is given up after STEP_TIMEOUT; a follower waits for rank
0's next message without a limit (a server may idle for days)."""
from __future__ import annotations

import atexit
import gc
import multiprocessing.connection
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist

from engine.config import launched
from engine.errors import UserError, user_error_types
from engine.moe import shard
from engine.moe.cache import CacheStats

STEP_TIMEOUT = timedelta(minutes=10)   # ranks wait at most this for each other inside a step
IDLE_TIMEOUT = timedelta(days=365)     # followers wait for rank 0's next message

_me: "Rank | None" = None              # this process's place in a group, once it joined one
_dying = threading.Lock()              # the first fatal error ends the process; others wait for it


class Children:
    """Ranks 1..N-1 that rank 0 spawned: watched, named when one dies, stopped."""

    def __init__(self, procs: list, world: int):
        self.procs, self.world, self.closing = procs, world, False
        self._reap = threading.Lock()  # one thread at a time collects an exit status

    def dead(self, wait: float | None = None) -> str | None:
        """The first that has exited, described; waits up to `wait` s (None: until one does)."""
        ready = multiprocessing.connection.wait([p.sentinel for p in self.procs], wait)
        for r, p in enumerate(self.procs, 1):
            if p.sentinel in ready:
                with self._reap:
                    p.join(1.0)
                    code = p.exitcode
                how = ("exited" if code is None else f"killed by {signal.Signals(-code).name}" if code < 0
                       else f"exit code {code}")
                return f"rank {r} of {self.world} (pid {p.pid}) ended ({how}); stopping every rank"
        return None

    def watch(self) -> None:
        """A thread that ends the run when a rank exits before close()."""
        def loop():
            line = self.dead()
            if not self.closing:
                die(line, self)
        threading.Thread(target=loop, name="freetoken-rank-watch", daemon=True).start()

    def stop(self) -> None:
        self.closing = True
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def die(line: str, children: Children | None = None):
    """End this process with one line on stderr (naming a spawned rank that died, if one did);
    the other ranks notice it go."""
    with _dying:
        dead = children.dead(wait=1.0) if children else None
        print(f"error: {dead or line}", file=sys.stderr, flush=True)
        for p in children.procs if children else ():
            p.kill()
        os._exit(1)


class Rank:
    """This process's place in a group: its rank, the group's size, the expert group (`data`,
    the all-reduce) and the control group (`ctl`, gloo), and its runner. Rank 0 drives the
    others (run) and watches the ranks it spawned (children)."""

    def __init__(self, rank: int, world: int, children: Children | None = None, store_dir: str | None = None):
        self.rank, self.world, self.children, self.store_dir = rank, world, children, store_dir
        self.data = dist.group.WORLD
        self.ctl = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
        self.runner = None
        self.lock = threading.Lock()
        self.stopped: str | None = None  # why run() can no longer be called
        self.log: list = []  # rank 0: what its scheduler changed in KV pages and states since the last step

    def run(self, fn: Callable, *args, here: Callable | None = None, gather: bool = False):
        """Rank 0: fn(rank, *args) on every rank. here: rank 0's own part instead of fn (it can use
        objects that do not travel). -> rank 0's result; with gather, every rank's in rank order
        (an exception of any rank is raised here, after every rank answered)."""
        with self.lock, whole():
            if self.stopped:
                raise UserError(f"the ranks have stopped ({self.stopped}); restart the command")
            try:
                self._collective(dist.broadcast_object_list, [(fn, args, gather)], src=0, group=self.ctl)
                try:
                    out = here() if here is not None else fn(self, *args)
                except Exception as e:
                    if not gather:  # the others are inside the same step: the group cannot go on
                        die(f"a step failed on rank 0: {first_line(e)}", self.children)
                    out = e
                if not gather:
                    return out
                outs = [None] * self.world
                self._collective(dist.gather_object, out, outs, dst=0, group=self.ctl)
            except BaseException:  # the others may be inside the call
                self.stopped = "a call was interrupted"
                raise
        for o in outs:
            if isinstance(o, BaseException):
                raise o
        return outs

    def step(self, runner, batch, kv):
        """Rank 0's step (ModelRunner.forward): every rank runs it on the same batch (the others'
        travels by value), the others after replaying what rank 0's scheduler changed outside a
        step since the last one: recurrent states zeroed for a new sequence, checkpointed and
        restored, KV pages copied (self.log, in order)."""
        ops = self.log[:]
        self.log.clear()
        return self.run(_step, batch.to("cpu"), ops, here=lambda: runner.step(batch, kv))

    def _collective(self, op: Callable, *args, **kw) -> None:
        try:
            op(*args, **kw)
        except RuntimeError as e:
            die(f"lost a rank ({first_line(e)}); stopping every rank", self.children)

    def leave(self) -> None:
        """Destroy the groups, and drop this object's references to them so that their threads
        are joined now: a gloo group kept alive into the interpreter's teardown may still be
        releasing its last broadcast there, which needs the GIL and aborts the process."""
        dist.destroy_process_group()
        self.data = self.ctl = None

    def close(self) -> None:
        """Rank 0, at exit: the followers leave their loop and exit, then this rank leaves."""
        global _me
        if self.children:
            self.children.closing = True
        clean = self.stopped is None and self.lock.acquire(timeout=10)  # else a step holds it, or was cut
        if clean:
            try:
                self._collective(dist.broadcast_object_list, [(None, (), False)], src=0, group=self.ctl)
                self.stopped = "the command is ending"
            finally:
                self.lock.release()
        if self.children:
            self.children.stop()
        if clean:
            self.leave()
        shard.leave()
        if self.store_dir:
            shutil.rmtree(self.store_dir, ignore_errors=True)  # the file store's directory
        _me = None


@contextmanager
def whole():
    """A Ctrl-C during a call to every rank takes effect when the call is done (the other ranks
    are inside it too); a second one ends every rank. Main thread only (signal handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hits = []

    def later(signum, frame):
        if hits:
            die("interrupted twice inside a step; stopping every rank", _me.children if _me else None)
        hits.append(signum)
    old = signal.signal(signal.SIGINT, later)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
    if hits:
        raise KeyboardInterrupt


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def one_rank(command: str) -> None:
    """Commands that measure one rank refuse torchrun (its other ranks would wait forever)."""
    if launched() is not None:
        raise UserError(f"{command} runs on one rank; start it without torchrun")


def follow_if_worker(config) -> None:
    """First thing of every command that runs a model: under torchrun a rank other than 0 joins
    the group here, follows rank 0 until it ends, and exits (it never reads input or listens)."""
    env = launched()
    if env is not None and env["rank"] != 0:
        start(config)


def start(config) -> Rank | None:
    """Join (torchrun) or start (spawning ranks 1..N-1) the group of config.world_size ranks and
    return rank 0's place in it; None for one rank. A torchrun rank other than 0 follows rank 0
    and exits instead of returning."""
    global _me
    if _me is not None:
        return _me
    env = launched()
    if env is None:
        return _spawn(config) if config.world_size > 1 else None
    if config.world_size not in (1, env["world"]):
        raise UserError(f"--world-size {config.world_size} differs from torchrun's WORLD_SIZE {env['world']}; "
                        "drop --world-size under torchrun")
    gpu = _gpus(config, env["local_world"])[env["local_rank"]] if _cuda(config) else None
    _me = _join(env["rank"], env["world"], "env://", gpu, _cpu_block(env["local_rank"], env["local_world"]))
    if env["rank"] != 0:
        _follow(_me)
        sys.exit(0)
    atexit.register(_me.close)
    return _me


def _cuda(config) -> bool:
    from engine.loader import pick_device
    return pick_device(config.device).type == "cuda"


def _gpus(config, n: int) -> tuple[int, ...]:
    """The GPU of each of this host's n ranks: --gpus, else 0..n-1."""
    gpus = config.gpus or tuple(range(n))
    have = torch.cuda.device_count()
    if len(gpus) != n or max(gpus) >= have or len(set(gpus)) != n:
        raise UserError(f"{n} ranks on this host need {n} distinct GPUs but --gpus gives {list(gpus)} and "
                        f"the host has {have}; list {n} of 0..{have - 1} with --gpus, or lower --world-size")
    return gpus


def _cpu_block(local_rank: int, local_world: int) -> list[int] | None:
    """This rank's equal block of the host's cores (None when there are fewer cores than ranks,
    or no affinity to set: not Linux)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    k = len(cpus) // local_world
    return cpus[local_rank * k:(local_rank + 1) * k] if k else None


def _join(rank: int, world: int, init: str, gpu: int | None, cpus: list[int] | None,
          children: Children | None = None, store_dir: str | None = None) -> Rank:
    if cpus:
        os.sched_setaffinity(0, cpus)
    torch.set_num_threads(len(cpus) if cpus else 1)
    if gpu is not None:
        torch.cuda.set_device(gpu)
    dist.init_process_group("nccl" if gpu is not None else "gloo", init_method=init, rank=rank,
                            world_size=world, timeout=STEP_TIMEOUT)
    me = Rank(rank, world, children, store_dir)
    shard.join(rank, world, lambda out: dist.all_reduce(out, group=me.data))  # the loader reads only this rank's experts
    return me


def _spawn(config) -> Rank:
    """Rank 0 here, ranks 1..N-1 in spawned processes, meeting through a file store."""
    global _me
    world = config.world_size
    gpus = _gpus(config, world) if _cuda(config) else (None,) * world
    store_dir = tempfile.mkdtemp(prefix="freetoken-ranks-")
    init = f"file://{store_dir}/store"
    ctx = torch.multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_follower, args=(r, world, init, gpus[r], _cpu_block(r, world), os.getpid()),
                         name=f"freetoken-rank-{r}") for r in range(1, world)]
    for p in procs:
        p.start()
    children = Children(procs, world)
    children.watch()  # from now: a rank that fails to start never joins, and must not leave rank 0 waiting
    _me = _join(0, world, init, gpus[0], _cpu_block(0, world), children, store_dir)
    atexit.register(_me.close)
    return _me


def _follower(rank: int, world: int, init: str, gpu: int | None, cpus: list[int] | None, parent: int) -> None:
    """A spawned rank: join, follow rank 0, exit with it."""
    global _me
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole terminal group: rank 0 decides

    def orphaned():
        while os.getppid() == parent:
            time.sleep(0.5)
        die(f"rank {rank}: rank 0 (pid {parent}) is gone; exiting")
    threading.Thread(target=orphaned, name="freetoken-parent-watch", daemon=True).start()
    _me = _join(rank, world, init, gpu, cpus)
    _follow(_me)


def _follow(me: Rank) -> None:
    """A follower's loop: run rank 0's messages until None."""
    while True:
        msg = [None]
        try:
            dist.broadcast_object_list(msg, src=0, group=me.ctl)
        except RuntimeError as e:
            die(f"rank {me.rank}: lost rank 0 ({first_line(e)}); exiting")
        fn, args, gather = msg[0]
        if fn is None:
            break
        try:
            out = fn(me, *args)
        except Exception as e:
            if not gather:
                traceback.print_exc()
                die(f"rank {me.rank}: a step failed: {first_line(e)}")
            if not isinstance(e, user_error_types()):
                traceback.print_exc()
            out = (UserError if isinstance(e, user_error_types()) else RuntimeError)(f"rank {me.rank}: {e}")
        if gather:
            try:
                dist.gather_object(out, None, dst=0, group=me.ctl)
            except RuntimeError as e:
                die(f"rank {me.rank}: lost rank 0 ({first_line(e)}); exiting")
    me.runner = None  # its CPU workers stop now, not in the interpreter's teardown
    gc.collect()
    me.leave()


def load(config, fn: Callable, *args, local: dict | None = None, **kwargs):
    """fn(config, *args, **kwargs) -> a ModelRunner on every rank of config's group (started
    here when needed); local: keyword arguments of rank 0's call only (progress bars, messages).
    -> rank 0's runner, through which the scheduler drives every rank."""
    me = start(config)
    if me is None:
        return fn(config, *args, **kwargs, **(local or {}))
    me.run(_load, fn, config, args, kwargs, here=lambda: _load(me, fn, config, args, {**kwargs, **(local or {})}),
           gather=True)
    me.runner.group = me
    me.log.clear()
    for pool in (me.runner.kv, me.runner.states):  # their changes between steps go to every rank
        if pool is not None:
            pool.log = me.log
    return me.runner


def _load(me: Rank, fn: Callable, config, args: tuple, kwargs: dict) -> None:
    me.runner = None  # a reload frees the old runner first
    me.runner = fn(config, *args, **kwargs)


def on_ranks(runner, fn: Callable, *args) -> list:
    """fn(runner, *args) on every rank, each with its own runner -> the results in rank order
    (one rank: [fn(runner, *args)])."""
    if runner.group is None:
        return [fn(runner, *args)]
    return runner.group.run(_on_runner, fn, args, gather=True)


def _on_runner(me: Rank, fn: Callable, args: tuple):
    return fn(me.runner, *args)


def _step(me: Rank, batch, ops: list) -> None:
    r = me.runner
    for pool, name, *args in ops:
        getattr(r.kv if pool == "kv" else r.states, name)(*args)
    r.step(batch.to(r.device), r.kv)


def cache_report(runner) -> dict:
    """One rank's expert-cache counters and state (its q*, its link and CPU estimates)."""
    rt = runner.runtime
    rt.sync_stats()
    est = rt.qstar.estimator
    return {"stats": replace(rt.cache.stats), "owned": rt.cache.tables.owned, "slots": rt.cache.n_slots,
            "bytes": rt.cache.nbytes, "q_star": rt.qstar.value, "b_p": est.b_p if est else None,
            "b_h": est.b_h if est else None}


def combine(reports: list[dict]) -> dict:
    """cache_report of every rank -> the counters, slots and bytes summed, the fill of all slots,
    and q*, B_P and B_H averaged (each rank splits its own misses)."""
    def mean(key):
        vals = [r[key] for r in reports]
        return None if None in vals else sum(vals) / len(vals)
    slots = sum(r["slots"] for r in reports)
    return {"stats": sum((r["stats"] for r in reports), CacheStats()), "slots": slots,
            "bytes": sum(r["bytes"] for r in reports),
            "occupancy": sum(r["owned"] for r in reports) / slots, "q_star": mean("q_star"),
            "b_p": mean("b_p"), "b_h": mean("b_h")}


def cache_totals(runner) -> dict:
    """combine() over every rank of runner's group."""
    return combine(on_ranks(runner, cache_report))
