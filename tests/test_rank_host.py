"""The rank host and the outside measurements (issue 25, items 1 and 4).

One rank host is started for the module the way the grader starts it (autograder/
sandbox_kernel.py: its own bubblewrap sandbox, as root a block of uids of its own and a
memory cgroup per rank), and this process talks to it as the verdict kernel does
(ZEROCOURSE_TRUSTED=1 + ZEROCOURSE_RANK_HOST_FD). The tests prove:
- each rank runs as a user of its own, with no capabilities, no_new_privs, none of the
  host's descriptors (no way to the verdict kernel's socket), and cannot signal the host;
- results, errors, timeouts (with the learner's stack, not the host's frames) and a
  cancel come back as from an ordinary launch;
- the instrument: what a rank holds and sends is measured from outside, whatever the rank
  does inside (state kept in a module-level dict, in a memfd, in a tmpfs file, in a child
  process, the in-rank meters patched). The figures are printed (noise, margins).
The normal launcher (a learner's notebook, tests/harness.py) measures the same way from
the kernel: its figures are checked at the end.
"""
from __future__ import annotations

import contextlib
import importlib
import itertools
import os
import shutil
import signal
import socket
import threading
import time

import pytest

from zerocourse import launch
from zerocourse.footprint import held_at, last_launch, sent_at

L = importlib.import_module("zerocourse.launch")
PSI = 4_000_000                  # parameters of the instrument's model: 16 MB of fp32
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="per-rank users and cgroups need root "
                               "(the grader runs as root; elsewhere ranks run as its user)")


@pytest.fixture(scope="module")
def host():
    """A rank host as the grader starts it, and this process as its verdict kernel."""
    with _hosted() as h:
        yield h


_HOSTS = itertools.count()
_open_hosts = [0]                   # hosts open now (one may be started while another is)


@contextlib.contextmanager
def _hosted(extra_env: dict | None = None):
    """Start a rank host (its environment: ours plus extra_env) and talk to it from here;
    afterwards whatever host this process talked to before is its host again."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (make test installs it as root)")
    from autograder import sandbox_kernel
    from autograder.resources import UserBlock, _empty_and_remove, _make_cgroup
    from zerocourse import rank_host
    users = UserBlock.reserve(1)
    slot = users.slot(0)
    name = f"zerocourse-test-{os.getpid()}-{next(_HOSTS)}"       # one cgroup per host
    memcg = _make_cgroup("memory", name, {"memory.use_hierarchy": 1}) if os.geteuid() == 0 else None
    env = dict(os.environ, **(extra_env or {}))
    if slot:
        env.update(ZC_HOST_UID_BASE=str(slot["ranks"]), ZC_HOST_GID=str(slot["group"]))
    if memcg:
        env["ZC_SANDBOX_MEMCG"] = memcg
    import sys
    import cloudpickle
    # This module's functions travel by value, as a notebook's do (the host's sandbox shows
    # no tests/ folder to import them from).
    nested = _open_hosts[0] > 0
    if not nested:
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    _open_hosts[0] += 1
    saved = {k: os.environ.get(k) for k in ("ZEROCOURSE_TRUSTED", rank_host.ENV_FD)}
    saved_client = rank_host._CLIENT
    fd = sandbox_kernel.start_rank_host(env)
    os.environ.update({"ZEROCOURSE_TRUSTED": "1", rank_host.ENV_FD: str(fd)})
    rank_host._CLIENT = None
    try:
        yield {"uids": slot, "memcg": memcg}
    finally:
        client = rank_host._CLIENT
        if client is not None:
            client.sock.close()
        rank_host._CLIENT = saved_client
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        time.sleep(0.5)                     # the host sees the socket close and exits
        if memcg:
            _empty_and_remove(memcg)
        users.release()
        _open_hosts[0] -= 1
        if not nested:
            cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


# --------------------------------------------------------------------------
# what a rank is
# --------------------------------------------------------------------------
def _whoami(rank, world_size):
    import os
    import socket
    import stat
    from zerocourse import _rank
    status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines()
                  if ":\t" in line)
    fds = {}
    for fd in sorted(int(f) for f in os.listdir("/proc/self/fd")):
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue
        kind = "socket" if stat.S_ISSOCK(mode) else "pipe" if stat.S_ISFIFO(mode) else \
            "file" if stat.S_ISREG(mode) else "other"
        if kind == "socket":
            s = socket.socket(fileno=os.dup(fd))
            kind = {socket.AF_UNIX: "unix", socket.AF_INET: "tcp", socket.AF_INET6: "tcp"}.get(s.family, "?")
            s.close()
        fds[fd] = kind
    try:
        os.kill(os.getppid(), 0)             # the host: root, in another user
        signal_host = True
    except PermissionError:
        signal_host = False
    return {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(),
            "caps": status["CapEff"].strip(), "bounding_ok": True, "nnp": status["NoNewPrivs"].strip(),
            "fds": fds, "conn": _rank._CHANNEL.conn.fileno(), "signal_host": signal_host,
            "home": os.environ.get("HOME"), "cwd": os.getcwd(),
            # The host's /tmp is a sticky /tmp (launches share a checkpoint folder through it):
            # a rank may add to it, never move or remove what root (or another user) made there.
            "tmp_sticky": bool(os.stat("/tmp").st_mode & stat.S_ISVTX),
            "moved_launch_folder": _try_rename(os.getcwd())}


def _try_rename(path):
    import os
    try:
        os.rename(path, path + ".moved")
    except OSError:
        return False
    os.rename(path + ".moved", path)
    return True


@ROOT_ONLY
def test_each_rank_is_a_user_of_its_own_with_nothing_of_the_host(host):
    got = launch(_whoami, 3)
    uids = host["uids"]
    for rank, me in enumerate(got):
        assert me["uid"] == me["euid"] == uids["ranks"] + rank
        assert me["gid"] == uids["group"] and me["groups"] == [uids["group"]]
        assert me["caps"] == "0000000000000000" and me["nnp"] == "1"
        assert not me["signal_host"] and me["tmp_sticky"] and not me["moved_launch_folder"]
        assert me["home"] == me["cwd"]                       # the launch's folder
        # Its own pipe to the host is its only Unix socket: nothing reaches the verdict kernel.
        unix = [fd for fd, kind in me["fds"].items() if kind == "unix"]
        assert unix == [me["conn"]], me["fds"]
        assert set(me["fds"].values()) <= {"unix", "tcp", "pipe", "file", "other"}


def _preloaded(rank, world_size):
    """Which of the fork server's preloads were in this rank before its own code ran."""
    import sys
    from zerocourse.launch import FORKSERVER_PRELOAD
    return {m: m in sys.modules for m in FORKSERVER_PRELOAD}


def test_ranks_start_with_what_the_fork_server_preloads(host):
    """The host forks ranks from a process that imported what the learner-side fork server
    preloads: torch._dynamo, imported by a rank's first torch.optim step, cost 2.1-2.4 s per
    rank per launch when each rank imported it (04's graded cells: ~50 of their 64 s)."""
    for preloaded in launch(_preloaded, 2):
        assert all(preloaded.values()), preloaded


def _adam_step(rank, world_size):
    """Whether torch._dynamo was in this rank before its code ran, and one Adam step (which
    imports it)."""
    import sys
    import torch
    before = "torch._dynamo" in sys.modules
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.Adam([p], lr=0.1)
    p.grad = torch.tensor([1.0, -2.0, 3.0]) * (-1) ** rank
    opt.step()
    return before, p.detach().tolist()


def test_a_light_preload_leaves_dynamo_to_ranks_that_step_an_optimizer():
    """ZEROCOURSE_RANK_PRELOAD=light (grade.py's choice for a notebook whose source never
    mentions optim, and its preflight's): the host preloads only torch and the rank module,
    ~2 CPU-s less per host; a rank that does step an optimizer still gets its result."""
    import torch
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.Adam([p], lr=0.1)
    want = []
    for rank in range(2):                  # the oracle: the same step here, per rank's grad
        with torch.no_grad():
            p.fill_(1.0)
        opt.state.clear()
        p.grad = torch.tensor([1.0, -2.0, 3.0]) * (-1) ** rank
        opt.step()
        want.append(p.detach().tolist())
    with _hosted({"ZEROCOURSE_RANK_PRELOAD": "light"}):
        got = launch(_adam_step, 2)
    assert [before for before, _ in got] == [False, False], got
    assert [x for _, w in got for x in w] == pytest.approx([x for w in want for x in w]), (got, want)


def test_grading_preloads_light_only_for_notebooks_that_never_mention_optim():
    from autograder.grade import rank_preload
    from autograder.nbgrader_run import assignments
    chosen = {aid: rank_preload(aid) for aid in assignments()}
    assert chosen["00_setup"] == "light" and chosen["04_zero2"] == "full", chosen
    assert set(chosen.values()) == {"light", "full"}
    assert rank_preload("99_not_a_notebook") == "full"     # unknown: the safe, full preload


def _fails(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 says no")
    return rank


def _spins(rank, world_size):
    while True:
        pass


def _object(rank, world_size):
    class Mine:
        pass
    return Mine()


def test_results_errors_and_timeouts_come_back_as_from_any_launch(host):
    with pytest.raises(ValueError, match="rank 1 says no") as err:
        launch(_fails, 2)
    assert err.value.rank == 1 and isinstance(err.value, L.RankError)
    with pytest.raises(L.RankTimeoutError) as slow:
        launch(_spins, 2, timeout=3)
    text = str(slow.value)
    assert "_spins" in text and "zerocourse/rank_host.py" not in text and "run_spec" not in text, text
    with pytest.raises(L.RankError, match="cannot be pickled|cannot accept"):
        launch(_object, 1)
    assert launch(_fails, 1) == [0]                            # and the host goes on


def test_a_cancel_kills_the_ranks_and_the_host_goes_on(host):
    # Ctrl-C raises KeyboardInterrupt, as in a kernel, even when the suite itself was started
    # with SIGINT ignored (nohup, a background job of a non-interactive shell).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(2.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch(_spins, 2, timeout=60)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - t0 < 30
    assert launch(_fails, 1) == [0]


# --------------------------------------------------------------------------
# the instrument
# --------------------------------------------------------------------------
def _adam_like(rank, world_size, mode, n):
    """n fp32 parameters, an Adam-like state (master, m, v: 12 bytes per parameter), held
    sharded or not; `mode` hides the full state from the in-rank meters in some way."""
    import os
    import torch
    import torch.distributed as dist
    from zerocourse.footprint import mark
    w = torch.nn.Parameter(torch.randn(n))
    mark("model")
    shard = n if mode != "sharded" else -(-n // world_size)
    state = [torch.zeros(shard) for _ in range(3)]
    if mode == "module dict":                  # reachable from neither model nor optimizer
        import zerocourse
        zerocourse._kept = {"m": torch.zeros(n), "v": torch.zeros(n), "master": torch.zeros(n)}
        state = [torch.zeros(-(-n // world_size)) for _ in range(3)]
    elif mode == "memfd":                      # shared memory, in no process's RssAnon
        fd = os.memfd_create("kept")
        os.write(fd, bytes(12 * n))
        state = [torch.zeros(-(-n // world_size)) for _ in range(3)]
    elif mode == "tmpfs file":
        with open(f"kept-{rank}.bin", "wb") as f:         # its launch folder: the host's tmpfs
            f.write(bytes(12 * n))
        state = [torch.zeros(-(-n // world_size)) for _ in range(3)]
    elif mode == "child process":
        if os.fork() == 0:
            kept = bytearray(12 * n)
            for i in range(0, len(kept), 4096):
                kept[i] = 1
            import time
            time.sleep(600)
            os._exit(0)
        state = [torch.zeros(-(-n // world_size)) for _ in range(3)]
    elif mode == "patched meters":             # the in-rank instruments lie; nothing changes
        import zerocourse.footprint
        import zerocourse.memory
        zerocourse.memory.measure_state_bytes = lambda *a, **k: {"total": 0}
        zerocourse.footprint.return_freed_memory = lambda: None
        zerocourse.footprint.RankMeter.sample = lambda self: (0, 0)   # not the launcher's copy
        state = [torch.zeros(n) for _ in range(3)]
    for _ in range(3):
        w.grad = torch.randn(n)
        dist.all_reduce(w.grad)
        w.grad = None
        mark("between steps")
    dist.barrier()                             # no rank leaves before every rank's last mark
    return len(state)


def _persistent(figures) -> list[int]:
    return [min(held_at(f, "between steps")) - held_at(f, "model")[0] for f in figures]


def test_the_instrument_sees_what_a_rank_holds_whatever_it_does_inside(host):
    """Sharded vs unsharded state on a 4M-parameter model (issue 25, item 4): the unsharded
    state is found in a module-level dict, a memfd, a tmpfs file or a child process, with
    the in-rank meters patched. Prints the figures (bytes held above the model, per rank)."""
    n, world = PSI, 2
    full, shard = 12 * n, 12 * -(-n // world)
    figures = {}
    for mode in ("sharded", "unsharded", "module dict", "memfd", "tmpfs file", "child process",
                 "patched meters"):
        launch(_adam_like, world, "unsharded" if mode == "unsharded" else mode, n)
        runs = last_launch()
        assert runs and all(held_at(f, "model") and len(held_at(f, "between steps")) == 3
                            for f in runs), runs
        figures[mode] = _persistent(runs)
        model = [held_at(f, "model")[0] for f in runs]
        print(f"{mode:>15}: held above the model {[f'{b / 1e6:.2f} MB' for b in figures[mode]]}, "
              f"model {[f'{b / 1e6:.2f} MB' for b in model]} ({runs[0]['measured_by']})")
    noise = 2 << 20
    for held in figures["sharded"]:
        assert abs(held - shard) < noise, figures
    for mode in ("unsharded", "module dict", "memfd", "tmpfs file", "child process", "patched meters"):
        for held in figures[mode]:
            # what the rank really keeps: at least the full state (+ its shard when hidden)
            assert held > full - noise, (mode, figures)
    margin = min(min(v) for k, v in figures.items() if k != "sharded") - max(figures["sharded"])
    print(f"margin between the sharded state and the least unsharded one: {margin / 1e6:.1f} MB "
          f"(sharding saves {(full - shard) / 1e6:.1f} MB at N={world}); noise bound {noise / 1e6:.1f} MB")


def _all_reduce_bytes(rank, world_size, n):
    import torch
    import torch.distributed as dist
    from zerocourse.footprint import mark
    t = torch.ones(n)
    mark("before")
    dist.barrier()       # no rank sends its first chunk before every rank has been measured
    dist.all_reduce(t)
    mark("after")
    dist.barrier()       # every rank has received everything: all of it has crossed the loopback
    mark("end")
    dist.barrier()
    return float(t[0])


def test_bytes_sent_are_the_kernels_counters(host):
    n, world = 1_000_000, 3
    assert launch(_all_reduce_bytes, world, n) == [3.0] * world
    runs = last_launch()
    ring = 2 * (world - 1) / world * 4 * n
    for f in runs:
        sent = sent_at(f, "after")[0] - sent_at(f, "before")[0]
        assert 0.95 * ring < sent < 1.3 * ring, (sent, ring)
    if "rank host" in runs[0]["measured_by"]:
        # From rank 0's "before" (no rank had sent a chunk yet) to its "end" (every chunk had
        # been received): at "after" a peer's last segments may still wait in its queue.
        total = runs[0]["marks"][-1]["all_sent"] - runs[0]["marks"][0]["all_sent"]
        assert total > 0.95 * world * ring, total       # every rank's bytes, headers included


def test_sent_counts_what_a_socket_was_given_even_before_the_peer_acknowledges_it():
    """`sent` is what the rank's code wrote, whatever its ACKs' timing: a peer that reads nothing
    (a busy machine's extreme) leaves most bytes queued and unacknowledged, and still every
    written byte counts; the acknowledged bytes alone read as a fraction of it."""
    import socket
    from zerocourse.footprint import tcp_sockets
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        with socket.socket() as c:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
            c.connect(srv.getsockname())
            peer, _ = srv.accept()
            with peer:
                peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                c.setblocking(False)
                written = 0
                try:
                    while written < 3_000_000:
                        written += c.send(b"x" * 65536)
                except BlockingIOError:            # the send buffer is full: the peer reads nothing
                    pass
                mine = [e for e in tcp_sockets() if e["inode"] == os.fstat(c.fileno()).st_ino]
                info = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
                acked = int.from_bytes(info[120:128], "little")
    assert written > 1_000_000 and acked < written / 2, (written, acked)   # the case this is about
    assert len(mine) == 1 and mine[0]["sent"] == written, (mine, written)


def test_the_kernels_own_launcher_measures_the_same_way(monkeypatch):
    """Without the rank host (a learner's notebook, tests/harness.py): /proc of the rank's
    processes and the TCP counters of its sockets, the same figures within the noise."""
    from zerocourse import rank_host
    monkeypatch.delenv(rank_host.ENV_FD, raising=False)
    monkeypatch.delenv("ZEROCOURSE_TRUSTED", raising=False)
    n, world = PSI, 2
    shard, full = 12 * -(-n // world), 12 * n
    launch(_adam_like, world, "sharded", n)
    sharded = _persistent(last_launch())
    assert "launcher" in last_launch()[0]["measured_by"]
    launch(_adam_like, world, "module dict", n)
    hidden = _persistent(last_launch())
    print(f"launcher: sharded {[b / 1e6 for b in sharded]} MB, module dict {[b / 1e6 for b in hidden]} MB")
    assert all(abs(h - shard) < 2 << 20 for h in sharded), sharded
    assert all(h > full - (2 << 20) for h in hidden), hidden
