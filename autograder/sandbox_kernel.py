"""Start an IPython kernel inside a sandbox: the kernel command of graded notebooks.

`autograder/grade.py` installs two kernelspecs whose argv is
    python sandbox_kernel.py --role learner|verdict -f {connection_file}
(the learner kernel runs the submission's cells; the verdict kernel runs the tests,
see autograder/split_execute.py). Each runs under bubblewrap, and the verdict kernel
gets a third sandbox beside it, its RANK HOST (zerocourse/rank_host.py), where the ranks
of its launches run learner code out of its reach:

- an allow-list file system: only the system's programs and libraries (/usr, /etc),
  Python and the course's .venv, `zerocourse/`, `data/`, and of `autograder/` only the
  module the kernel imports (learner_rpc.py for the learner, verdict.py for the verdict
  kernel, nothing for the rank host): no notes, rubrics, README or handout exist inside;
  solutions/, tests/, other checkouts, home folders and the grading folder do not either;
- fresh, size-limited folders at every start (a restart too): /tmp (also HOME and cwd),
  /dev/shm are new tmpfs mounts; the only host folder a kernel writes is the one its
  sockets live in (plus, for the learner, its answer socket's);
- the connection file is handed over read-only from a pipe (bwrap --ro-bind-data): root
  never copies, chowns or opens anything in a folder a sandbox can write;
- as root, each kernel runs as an unprivileged user of its own (ZC_<ROLE>_UID), with no
  capabilities and no_new_privs; the rank host runs as root in its sandbox with only
  CAP_SETUID, CAP_SETGID and CAP_KILL, and each rank it forks takes a user of its own
  (ZC_HOST_UID_BASE + rank, group ZC_HOST_GID) before it unpickles anything;
- no network: fresh network namespaces with only loopback (gloo ranks still talk); the
  verdict kernel reaches its rank host through an inherited socketpair (no path);
- its own PID, IPC and UTS namespaces: when the kernel goes, everything it started goes;
- IPython's history is off (it would hold every test cell the kernel ran);
- rlimits: address space per process (ZC_SANDBOX_MEM, bytes), processes of the user
  (ZC_SANDBOX_NPROC), CPU seconds per process (ZC_SANDBOX_CPU), file size
  (ZC_SANDBOX_FSIZE); the submission's cgroups (memory, cpu, pids: grade.py puts nbgrader
  in them, and everything it starts inherits them); the rank host makes one memory cgroup
  per rank under ZC_SANDBOX_MEMCG to measure it (zerocourse/footprint.py).

The environment is an allow-list (PASS_ENV): no grader path (gradebook, OUT, release
folder) reaches a kernel. Configuration comes from the environment (set by grade.py):
    ZC_<ROLE>_WORK    the folder of the kernel's sockets (the only host folder it writes)
    ZC_<ROLE>_UID     the user id it runs as (only when started as root)
    ZC_SANDBOX_SHARED the folder of the learner kernel's answer socket (read-only to the verdict)
    ZC_HOST_UID_BASE, ZC_HOST_GID   users of the ranks (as root)
    ZC_SANDBOX_MEMCG  a memory cgroup folder the rank host makes per-rank cgroups in
    ZC_SANDBOX_TMP    bytes of each tmpfs (/tmp; /dev/shm gets a quarter)
"""
from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SYSTEM = ("/usr", "/etc")            # programs, libraries, fonts, ld.so.cache
MERGED = ("bin", "lib", "lib64", "sbin")     # /bin -> usr/bin on a merged-/usr system
# Variables a kernel may see: nothing of the instructor's environment, no grader path.
PASS_ENV = {"PATH", "LANG", "LC_ALL", "TZ", "PYTHONPATH", "NBGRADER_EXECUTION",
            "NBGRADER_VALIDATING", "OMP_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
            "ZEROCOURSE_TIMEOUT", "ZEROCOURSE_COLLECTIVE_TIMEOUT", "ZEROCOURSE_DEVICE_PROXY",
            "ZEROCOURSE_TRUSTED", "ZEROCOURSE_WARM_UP", "ZEROCOURSE_RANK_PRELOAD",
            "ZEROCOURSE_OUTPUT_LIMIT", "ZEROCOURSE_DATA_DIR", "ZEROCOURSE_SANDBOX"}
PASS_PREFIX = ("TORCH_", "GLOO_")
# What each role imports from autograder/ (the rest of it, instructor material, stays out).
AUTOGRADER_FILES = {"learner": ("learner_rpc.py",), "verdict": ("__init__.py", "verdict.py"),
                    "host": ()}
CONNECTION = "/zc/connection.json"   # where a kernel finds its connection file (read-only)
MEMCG = "/zc/memcg"                  # where the rank host finds its cgroup folder


def readonly_paths(root: str = ROOT, role: str = "learner") -> list[str]:
    """What a kernel of `role` needs to read: Python, the .venv, the course's package and
    data, and the autograder modules that role imports (files, not the folder)."""
    paths = [sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))]
    paths += [os.path.join(root, d) for d in ("zerocourse", "data")]
    paths += [os.path.join(root, "autograder", f) for f in AUTOGRADER_FILES[role]]
    paths = sorted({os.path.realpath(p) for p in paths if os.path.exists(p)})
    # A path inside another one already shown needs no bind of its own.
    return [p for p in paths if not any(p.startswith(q + os.sep) for q in paths)]


def python_flags() -> list[str]:
    """No user site, and (3.11+) no script folder or cwd on sys.path: a kernel imports only
    from the read-only course and .venv."""
    return ["-s"] + (["-P"] if sys.version_info >= (3, 11) else [])


def bwrap_command(argv_tail: list[str], env: dict, role: str, data_fd: int | None = None) -> list[str]:
    """The bwrap (+ setpriv) + prlimit command that runs `argv_tail` sandboxed as `role`
    (learner, verdict, or host: the verdict kernel's rank host)."""
    key = role.upper()
    tmp = int(env.get("ZC_SANDBOX_TMP", 256 << 20))
    # Every role's /tmp is its own tmpfs, sticky and world-writable as a /tmp is: in the host's,
    # the ranks of successive launches (one submission's code, one group, umask 007) share
    # what they make there, e.g. a checkpoint saved at N ranks and loaded at M (09); the host
    # opens nothing in it but the launch folders it makes itself (mkdtemp: random, exclusive).
    cmd = ["bwrap", "--proc", "/proc", "--dev", "/dev",
           "--perms", "1777", "--size", str(tmp), "--tmpfs", "/tmp",
           "--perms", "1777", "--size", str(max(tmp // 4, 1 << 20)), "--tmpfs", "/dev/shm",
           "--ro-bind", "/sys", "/sys"]
    for path in SYSTEM:
        if os.path.isdir(path):
            cmd += ["--ro-bind", path, path]
    for name in MERGED:
        path = "/" + name
        if os.path.islink(path):
            cmd += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            cmd += ["--ro-bind", path, path]
    made = set()

    def parents(path):
        # bwrap makes missing parent folders 0700 (root's): the kernel's user could not pass.
        out, parts = [], path.strip("/").split("/")[:-1]
        for i in range(len(parts)):
            d = "/" + "/".join(parts[:i + 1])
            if d not in made and d not in ("/usr", "/etc", "/tmp", "/dev", "/sys", "/proc"):
                made.add(d)
                out += ["--perms", "0755", "--dir", d]
        return out

    for path in readonly_paths(ROOT, role):
        cmd += parents(path) + ["--ro-bind", path, path]
    shared = env.get("ZC_SANDBOX_SHARED")
    if shared and role in ("learner", "verdict"):
        cmd += parents(shared) + ["--bind" if role == "learner" else "--ro-bind", shared, shared]
    work = env.get(f"ZC_{key}_WORK")
    if work:
        cmd += parents(work) + ["--bind", work, work]
    memcg = env.get("ZC_SANDBOX_MEMCG")
    if role == "host" and memcg and os.path.isdir(memcg):
        cmd += ["--bind", memcg, MEMCG]
    if data_fd is not None:
        cmd += ["--perms", "0444", "--ro-bind-data", str(data_fd), CONNECTION]
    cmd += ["--chdir", "/tmp", "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp",
            "--setenv", "USER", "learner",
            "--setenv", "MPLCONFIGDIR", "/tmp/.mpl", "--setenv", "IPYTHONDIR", "/tmp/.ipython",
            # c10d warns on every rank that 127.0.0.1 has no host name (no resolver here).
            "--setenv", "TORCH_CPP_LOG_LEVEL", "ERROR",
            # ipykernel watches JPY_PARENT_PID, invisible from a new PID namespace;
            # --die-with-parent ties the kernel to nbgrader instead.
            "--unsetenv", "JPY_PARENT_PID",
            "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--die-with-parent", "--new-session"]
    uid = env.get(f"ZC_{key}_UID")
    if role == "host":
        # Root in its sandbox, only to give each rank a user of its own and to stop them.
        cmd += ["--cap-drop", "ALL"] + (["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                                         "--cap-add", "CAP_KILL"] if os.geteuid() == 0 else []) + ["--"]
    elif os.geteuid() == 0 and uid and shutil.which("setpriv"):
        # setpriv drops root for the kernel's own user: no capabilities, no setuid programs.
        cmd += ["--", "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all"]
    else:
        cmd += ["--cap-drop", "ALL", "--"]
    cmd += ["prlimit", f"--as={env.get('ZC_SANDBOX_MEM', 4 << 30)}",
            f"--cpu={env.get('ZC_SANDBOX_CPU', 900)}",
            f"--fsize={env.get('ZC_SANDBOX_FSIZE', 1 << 30)}"]
    if role != "host":                 # the host is root: its ranks get NPROC per their user
        cmd += [f"--nproc={env.get('ZC_SANDBOX_NPROC', 512)}"]
    return cmd + ["--"] + argv_tail


def kernel_env(environ: dict) -> dict:
    """The variables a sandboxed process sees (PASS_ENV, PASS_PREFIX)."""
    return {k: v for k, v in environ.items() if k in PASS_ENV or k.startswith(PASS_PREFIX)}


def read_connection_file(path: str) -> bytes:
    """The connection file nbgrader wrote (in its runtime folder, outside every sandbox),
    read without following a link and only if it is a small regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 16:
            raise SystemExit(f"sandbox_kernel: {path} is not a connection file")
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


def _data_fd(data: bytes) -> int:
    """A pipe's read end holding `data` (bwrap copies it into a read-only file)."""
    r, w = os.pipe()
    os.write(w, data)
    os.close(w)
    os.set_inheritable(r, True)
    return r


def start_rank_host(env: dict) -> int:
    """Start the verdict kernel's rank host in its own sandbox; return the verdict kernel's
    end of the socketpair between them (inheritable)."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    os.set_inheritable(theirs.fileno(), True)
    tail = [sys.executable, *python_flags(), "-m", "zerocourse.rank_host", "--fd", str(theirs.fileno())]
    if os.geteuid() == 0 and env.get("ZC_HOST_UID_BASE"):
        tail += ["--uid-base", env["ZC_HOST_UID_BASE"], "--gid", env["ZC_HOST_GID"]]
    if env.get("ZC_SANDBOX_MEMCG") and os.geteuid() == 0:
        tail += ["--memcg", MEMCG]
    host_env = kernel_env(env)
    host_env["PYTHONPATH"] = ROOT
    subprocess.Popen(bwrap_command(tail, env, "host"), env=host_env, pass_fds=(theirs.fileno(),),
                     stdin=subprocess.DEVNULL, start_new_session=False)
    theirs.close()
    fd = mine.detach()
    os.set_inheritable(fd, True)
    return fd


def main() -> None:
    if shutil.which("bwrap") is None:
        sys.exit("sandbox_kernel: bubblewrap (bwrap) is not installed: `apt-get install "
                 "bubblewrap`, or grade without the sandbox (ZEROCOURSE_SANDBOX=0)")
    args = sys.argv[1:]
    role = "learner"
    if "--role" in args:
        i = args.index("--role")
        role = args[i + 1]
        del args[i:i + 2]
    if role not in ("learner", "verdict"):
        sys.exit(f"sandbox_kernel: unknown role {role!r}")
    data_fd = None
    if "-f" in args:
        i = args.index("-f") + 1
        data_fd = _data_fd(read_connection_file(args[i]))
        args[i] = CONNECTION
    cgroup = os.environ.get("ZC_SANDBOX_CGROUP")
    if cgroup:
        # Join the submission's pids cgroup (when nbgrader is not in it already): it caps
        # processes + threads of everything the kernel starts.
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    env = kernel_env(os.environ)
    if role == "verdict" and os.environ.get("ZC_RANK_HOST", "1") != "0":
        env["ZEROCOURSE_RANK_HOST_FD"] = str(start_rank_host(dict(os.environ)))
    history = [] if any(a.startswith("--HistoryManager.enabled") for a in args) else \
        ["--HistoryManager.enabled=False"]
    tail = [sys.executable, *python_flags(), "-m", "ipykernel_launcher", *history, *args]
    cmd = bwrap_command(tail, dict(os.environ), role, data_fd)
    os.execvpe(cmd[0], cmd, env)


if __name__ == "__main__":
    main()
