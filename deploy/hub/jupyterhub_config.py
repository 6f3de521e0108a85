"""JupyterHub for "ZeRO by hand": one hub, PAM logins, one Linux user per learner.

Read by `deploy/hub/setup.sh` (through hub.sh) with the deployment's settings in
$ZEROCOURSE_HUB_ROOT/hub.json (written by setup.sh; see deploy/hub/README.md):

    {"ip", "port", "hub_port", "proxy_api_port", "venv", "repo", "learners", "instructor",
     "exchange", "mem_limit", "cpu_limit", "nproc_limit", "cull_idle_s", "proxy"}
"""
import json
import os
import resource
import sys

from jupyterhub.spawner import LocalProcessSpawner

HUB_ROOT = os.environ["ZEROCOURSE_HUB_ROOT"]
with open(os.path.join(HUB_ROOT, "hub.json")) as f:
    S = json.load(f)

c = get_config()  # noqa: F821 - provided by JupyterHub

c.JupyterHub.bind_url = f"http://{S['ip']}:{S['port']}"
# The hub's own API and the proxy's API on loopback, on ports setup.sh checked were free.
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{S['hub_port']}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{S['proxy_api_port']}"
c.ConfigurableHTTPProxy.command = [S["proxy"]]
c.ConfigurableHTTPProxy.auth_token = open(os.path.join(HUB_ROOT, "proxy_token")).read().strip()
c.JupyterHub.cookie_secret_file = os.path.join(HUB_ROOT, "jupyterhub_cookie_secret")
c.JupyterHub.db_url = "sqlite:///" + os.path.join(HUB_ROOT, "jupyterhub.sqlite")
c.JupyterHub.pid_file = os.path.join(HUB_ROOT, "jupyterhub.pid")
# Stopping the hub stops the proxy and every learner's server (teardown relies on it).
c.JupyterHub.cleanup_servers = True
c.JupyterHub.cleanup_proxy = True

# Logins: the Linux accounts setup.sh created (passwords set with passwd/chpasswd).
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.open_sessions = False        # no pam_systemd/logind on most servers
c.Authenticator.allowed_users = set(S["learners"]) | {S["instructor"]}
c.Authenticator.admin_users = {S["instructor"]}


def _cgroup_dirs(user):
    """This user's cgroup folders: v2 (one tree) or v1 (memory, cpu, pids trees)."""
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        return {"v2": f"/sys/fs/cgroup/zerocourse-hub/{user}"}
    return {k: f"/sys/fs/cgroup/{k}/zerocourse-hub/{user}" for k in ("memory", "cpu", "pids")}


def _write(path, value):
    with open(path, "w") as f:
        f.write(str(value))


class LimitedSpawner(LocalProcessSpawner):
    """LocalProcessSpawner plus limits it does not apply itself.

    LocalProcessSpawner only *advertises* mem_limit/cpu_limit (as MEM_LIMIT/CPU_LIMIT in the
    server's environment). Here the hub (root) puts each server in a cgroup of its own with a
    memory cap, a CPU quota and a task cap, which the kernel and every rank it forks inherit;
    and RLIMIT_NPROC caps the user's processes where cgroups are not writable.
    """

    def make_preexec_fn(self, name):
        switch_user = super().make_preexec_fn(name)
        nproc = int(S["nproc_limit"])

        def preexec():
            # Before dropping root: a learner cannot raise a hard limit afterwards.
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
            switch_user()
        return preexec

    async def start(self):
        url = await super().start()
        try:
            self._limit(self.pid)
        except OSError as e:            # read-only cgroups (some containers): rlimits only
            self.log.warning("no cgroup limits for %s: %s", self.user.name, e)
        return url

    def _limit(self, pid):
        mem = int(S["mem_limit"])
        quota = int(float(S["cpu_limit"]) * 100_000)
        for kind, path in _cgroup_dirs(self.user.name).items():
            os.makedirs(path, exist_ok=True)
            if kind == "v2":
                top = os.path.dirname(path)
                _write(os.path.join(top, "cgroup.subtree_control"), "+memory +cpu +pids")
                _write(os.path.join(path, "memory.max"), mem)
                _write(os.path.join(path, "cpu.max"), f"{quota} 100000")
                _write(os.path.join(path, "pids.max"), S["nproc_limit"])
            elif kind == "memory":
                _write(os.path.join(path, "memory.limit_in_bytes"), mem)
            elif kind == "cpu":
                _write(os.path.join(path, "cpu.cfs_period_us"), 100_000)
                _write(os.path.join(path, "cpu.cfs_quota_us"), quota)
            else:
                _write(os.path.join(path, "pids.max"), S["nproc_limit"])
            _write(os.path.join(path, "cgroup.procs"), pid)
        self.log.info("%s: cgroup limits %d MiB, %s CPUs, %s tasks", self.user.name,
                      mem >> 20, S["cpu_limit"], S["nproc_limit"])


c.JupyterHub.spawner_class = LimitedSpawner
c.Spawner.mem_limit = int(S["mem_limit"])       # shown to the server as MEM_LIMIT
c.Spawner.cpu_limit = float(S["cpu_limit"])
# The course's .venv is the single-user environment: same torch, nbgrader, kernels as `make lab`.
c.Spawner.cmd = [os.path.join(S["venv"], "bin", "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120


def _per_role_config(spawner):
    """Learners and the instructor get different Jupyter config folders (setup.sh writes
    them): learners only have the Assignments tab, the instructor has Formgrader."""
    role = "instructor" if spawner.user.name == S["instructor"] else "learner"
    # A new dict: the configured one may be shared by every spawner.
    spawner.environment = dict(spawner.environment,
                               JUPYTER_CONFIG_PATH=os.path.join(HUB_ROOT, "jupyter", role),
                               PATH=os.path.join(S["venv"], "bin") + ":/usr/local/bin:/usr/bin:/bin")


c.Spawner.pre_spawn_hook = _per_role_config

# Idle culling: a server nobody used for cull_idle_s is stopped (its kernels and ranks go too).
c.JupyterHub.load_roles = [{
    "name": "idle-culler",
    "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
    "services": ["idle-culler"],
}]
c.JupyterHub.services = [{
    "name": "idle-culler",
    "command": [sys.executable, "-m", "jupyterhub_idle_culler",
                f"--timeout={int(S['cull_idle_s'])}", "--cull-every=60"],
}]
