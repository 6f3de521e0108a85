"""Start an IPython kernel inside a sandbox: the kernel command of graded notebooks.

`autograder/grade.py` installs two kernelspecs whose argv is
    python sandbox_kernel.py --role learner|verdict -f {connection_file}
(the learner kernel runs the submission's cells; the verdict kernel runs the tests,
see autograder/split_execute.py). Each runs under bubblewrap:

- an allow-list file system: only the system's programs and libraries (/usr, /etc),
  Python and the course's .venv, `zerocourse/`, `data/` and `autograder/` (read-only)
  exist inside; solutions/, tests/, other checkouts, home folders, the grading folder
  and every other submission do not. /tmp is private; the kernel's own folder is the
  only writable one (plus, for the two kernels, the folder of their socket);
- as root, the kernel runs as an unprivileged user of its own (ZC_<ROLE>_UID; the two
  kernels of one submission get different ones), with no capabilities and
  no_new_privs, so it cannot signal, trace or read the other kernel or anything of root;
- no network: a fresh network namespace with only loopback (gloo ranks still talk);
- its own PID namespace: when the kernel goes, every process it started goes too;
- rlimits: address space per process (ZC_SANDBOX_MEM, bytes), processes of the user
  (ZC_SANDBOX_NPROC), CPU seconds per process (ZC_SANDBOX_CPU), file size
  (ZC_SANDBOX_FSIZE); where the cgroup v1 pids controller is writable
  (ZC_SANDBOX_CGROUP, made by grade.py), a cap on the tasks of the whole submission.

The kernel talks to nbgrader over Unix sockets (transport=ipc) in its folder.
Configuration comes from the environment (set by autograder/grade.py):
    ZC_<ROLE>_WORK    the kernel's writable folder (also its cwd and HOME)
    ZC_<ROLE>_UID     the user id it runs as (only when started as root)
    ZC_SANDBOX_SHARED a folder both kernels of a submission may write (their socket)
    ZC_SANDBOX_RO     the paths shown read-only (os.pathsep-separated)
"""
from __future__ import annotations

import os
import shutil
import sys

SYSTEM = ("/usr", "/etc")            # programs, libraries, fonts, ld.so.cache
MERGED = ("bin", "lib", "lib64", "sbin")     # /bin -> usr/bin on a merged-/usr system
PASS_ENV = {"PATH", "LANG", "LC_ALL", "TZ", "PYTHONPATH", "NBGRADER_EXECUTION",
            "NBGRADER_VALIDATING", "OMP_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"}
PASS_PREFIX = ("ZEROCOURSE_", "TORCH_", "GLOO_")


def readonly_paths(root: str) -> list[str]:
    """What a kernel needs to read: Python, the .venv, the course's package and data."""
    paths = [sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))]
    paths += [os.path.join(root, d) for d in ("zerocourse", "data", "autograder")]
    paths = sorted({os.path.realpath(p) for p in paths if os.path.exists(p)})
    # A folder inside another one already shown needs no bind of its own.
    return [p for p in paths if not any(p.startswith(q + os.sep) for q in paths)]


def bwrap_command(argv_tail: list[str], env: dict, role: str) -> list[str]:
    """The bwrap (+ setpriv) + prlimit command that runs `argv_tail` sandboxed as `role`."""
    key = role.upper()
    work = env[f"ZC_{key}_WORK"]
    cmd = ["bwrap", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/dev/shm",
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
            if d not in made and d not in ("/usr", "/etc"):
                made.add(d)
                out += ["--perms", "0755", "--dir", d]
        return out

    for path in filter(None, env.get("ZC_SANDBOX_RO", "").split(os.pathsep)):
        if os.path.exists(path):
            cmd += parents(path) + ["--ro-bind", path, path]
    # Never inside, even though autograder/ is: a gradebook an instructor keeps there.
    gradebook = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gradebook.db")
    if os.path.exists(gradebook):
        cmd += ["--ro-bind", "/dev/null", gradebook]
    shared = env.get("ZC_SANDBOX_SHARED")
    if shared:
        cmd += parents(shared) + ["--bind", shared, shared]
    cmd += parents(work) + ["--bind", work, work, "--chdir", work, "--setenv", "HOME", work,
            "--setenv", "TMPDIR", "/tmp", "--setenv", "USER", "learner",
            # c10d warns on every rank that 127.0.0.1 has no host name (no resolver here).
            "--setenv", "TORCH_CPP_LOG_LEVEL", "ERROR",
            "--setenv", "MPLCONFIGDIR", os.path.join(work, ".mpl"),
            # ipykernel watches JPY_PARENT_PID, invisible from a new PID namespace;
            # --die-with-parent ties the kernel to nbgrader instead.
            "--unsetenv", "JPY_PARENT_PID",
            "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--die-with-parent", "--new-session"]
    uid = env.get(f"ZC_{key}_UID")
    if os.geteuid() == 0 and uid and shutil.which("setpriv"):
        # setpriv drops root for the kernel's own user: no capabilities, no setuid programs.
        cmd += ["--", "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all"]
    else:
        cmd += ["--cap-drop", "ALL", "--"]
    cmd += ["prlimit", f"--as={env.get('ZC_SANDBOX_MEM', 4 << 30)}",
            f"--nproc={env.get('ZC_SANDBOX_NPROC', 512)}",
            f"--cpu={env.get('ZC_SANDBOX_CPU', 900)}",
            f"--fsize={env.get('ZC_SANDBOX_FSIZE', 1 << 30)}", "--"]
    return cmd + argv_tail


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
    key = role.upper()
    work = os.environ[f"ZC_{key}_WORK"]
    uid = os.environ.get(f"ZC_{key}_UID")
    if "-f" in args:
        # The connection file lives in the runtime folder, which the sandbox does not show:
        # hand the kernel a copy inside its folder.
        i = args.index("-f") + 1
        copy = os.path.join(work, "connection.json")
        shutil.copyfile(args[i], copy)
        if uid and os.geteuid() == 0:
            os.chown(copy, int(uid), int(uid))
        os.chmod(copy, 0o600)
        args[i] = copy
    cgroup = os.environ.get("ZC_SANDBOX_CGROUP")
    if cgroup:
        # Join the submission's pids cgroup: it caps processes + threads of everything the
        # kernel starts (RLIMIT_NPROC counts per user, machine-wide).
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    tail = [sys.executable, "-m", "ipykernel_launcher", *args]
    cmd = bwrap_command(tail, dict(os.environ), role)
    # The kernel sees only the variables it needs: nothing of the instructor's environment.
    env = {k: v for k, v in os.environ.items() if k in PASS_ENV or k.startswith(PASS_PREFIX)}
    os.execvpe(cmd[0], cmd, env)


if __name__ == "__main__":
    main()
