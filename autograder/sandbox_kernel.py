"""Start an IPython kernel inside a sandbox: the kernel command of graded notebooks.

`make grade` installs a kernelspec named python3 whose argv is
    python sandbox_kernel.py -f {connection_file}
so every submission's kernel (and the ranks it launches) runs under bubblewrap:

- no network: a fresh network namespace with only loopback (gloo ranks still talk);
- its own PID namespace: when the kernel goes, every process it started goes too;
- a read-only view of the machine, with the course's secrets hidden (solutions/,
  tests/, the grading folder with the gradebook and other students' work, the
  submissions folder) and a private /tmp; the only writable folder is its own;
- no capabilities, and rlimits: address space per process (ZC_SANDBOX_MEM, bytes),
  processes of the user (ZC_SANDBOX_NPROC), CPU seconds per process (ZC_SANDBOX_CPU),
  file size (ZC_SANDBOX_FSIZE);
- where the cgroup v1 pids controller is writable (ZC_SANDBOX_CGROUP, made by grade.py),
  a cap on the processes and threads of the whole submission: RLIMIT_NPROC alone does
  not stop a fork bomb run by root.

The kernel talks to nbgrader over Unix sockets (transport=ipc) in its folder, since
TCP on the host's loopback is out of reach from its network namespace.
Configuration comes from the environment (set by autograder/grade.py):
    ZC_SANDBOX_WORK   the submission's writable folder (also the kernel's cwd and HOME)
    ZC_SANDBOX_HIDE   paths to hide, separated by os.pathsep
    ZC_SANDBOX_KEEP   paths the kernel needs (the course, its Python), shown read-only even
                      when they are under /tmp
"""
from __future__ import annotations

import os
import shutil
import sys


def _under(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def bwrap_command(argv_tail: list[str], env: dict) -> list[str]:
    """The bwrap + prlimit command that runs `argv_tail` sandboxed."""
    work = env["ZC_SANDBOX_WORK"]
    cmd = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
           "--tmpfs", "/tmp", "--tmpfs", "/dev/shm"]
    # The course and its Python may live under /tmp (a CI clone): show them again, read-only.
    keep = [p for p in env.get("ZC_SANDBOX_KEEP", "").split(os.pathsep) if p and os.path.exists(p)]
    for path in keep:
        if _under(path, "/tmp"):
            cmd += ["--ro-bind", path, path]
    for path in filter(None, env.get("ZC_SANDBOX_HIDE", "").split(os.pathsep)):
        if _under(path, "/tmp") and not any(_under(path, k) for k in keep):
            continue                                   # the private /tmp hides it already
        if os.path.isdir(path):
            cmd += ["--tmpfs", path, "--remount-ro", path]     # an empty, read-only folder
        elif os.path.exists(path):
            cmd += ["--ro-bind", "/dev/null", path]
    cmd += ["--bind", work, work, "--chdir", work, "--setenv", "HOME", work,
            "--setenv", "TMPDIR", "/tmp",
            # c10d warns on every rank that 127.0.0.1 has no host name (no resolver here).
            "--setenv", "TORCH_CPP_LOG_LEVEL", "ERROR", "--setenv", "MPLCONFIGDIR", os.path.join(work, ".mpl"),
            # ipykernel watches JPY_PARENT_PID, invisible from a new PID namespace;
            # --die-with-parent ties the kernel to nbgrader instead.
            "--unsetenv", "JPY_PARENT_PID",
            "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--"]
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
    if "-f" in args:
        # The connection file lives in the host's /tmp, which the sandbox replaces by its
        # own: hand the kernel a copy inside its folder.
        i = args.index("-f") + 1
        copy = os.path.join(os.environ["ZC_SANDBOX_WORK"], "connection.json")
        shutil.copyfile(args[i], copy)
        args[i] = copy
    cgroup = os.environ.get("ZC_SANDBOX_CGROUP")
    if cgroup:
        # Join the submission's pids cgroup: it caps processes + threads of everything the
        # kernel starts, root or not (RLIMIT_NPROC does not bind root).
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    tail = [sys.executable, "-m", "ipykernel_launcher", *args]
    cmd = bwrap_command(tail, dict(os.environ))
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
