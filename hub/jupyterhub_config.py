# JupyterHub configuration of the lab's local course hub (see hub/README.md).
#
# Started by hub/localhub.py (`make hub`, tests/test_hub.py), which sets the PP_LAB_HUB_* variables below.
# Everything listens on 127.0.0.1 only. PAM checks the passwords of real Unix accounts, and the local
# process spawner starts each user's JupyterLab as that user (setuid), from the single-user environment
# that hub/setup.sh built: the pins of pyproject.toml, lab_src installed, nbgrader's Assignments panel.
import os
import shlex
from pathlib import Path

c = get_config()  # noqa: F821 - JupyterHub's config loader defines it

HOME = Path(os.environ["PP_LAB_HUB_HOME"])          # venv/ and node/ from hub/setup.sh
STATE = Path(os.environ["PP_LAB_HUB_STATE"])        # this hub's database, secrets, logs, config, exchange
VENV = HOME / "venv"
PORT = int(os.environ.get("PP_LAB_HUB_PORT", "8000"))

# ---- network: the proxy faces the browser, the hub and the users' servers sit behind it, all on loopback
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = PORT
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = int(os.environ.get("PP_LAB_HUB_API_PORT", PORT + 1))
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ.get('PP_LAB_HUB_PROXY_API_PORT', PORT + 2)}"
c.ConfigurableHTTPProxy.command = [str(HOME / "node" / "node_modules" / ".bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(STATE / "proxy.pid")
c.ConfigurableHTTPProxy.debug = False

# ---- state
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(STATE / "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True          # stopping the hub stops every user's server
c.JupyterHub.cleanup_proxy = True
c.JupyterHub.shutdown_on_logout = True       # logging out stops the user's server, its kernels and checks
c.JupyterHub.log_level = os.environ.get("PP_LAB_HUB_LOG_LEVEL", "INFO")

# ---- who may log in: real Unix accounts, checked by PAM
c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allowed_users = set(os.environ.get("PP_LAB_HUB_USERS", "").split())
c.Authenticator.admin_users = set(os.environ.get("PP_LAB_HUB_ADMINS", "").split())
c.PAMAuthenticator.open_sessions = False     # no login session bookkeeping (no systemd-logind here)

# ---- each user's JupyterLab, as that user, from the shared single-user environment
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.ip = "127.0.0.1"
cmd = [str(VENV / "bin" / "jupyterhub-singleuser")]
cpus = os.environ.get("PP_LAB_HUB_CPUS")     # e.g. "0" or "0-1": pin every user's server (and so its checks)
if cpus:
    cmd = ["taskset", "-c", cpus, *cmd]
c.Spawner.cmd = cmd
c.Spawner.args = ["--LabApp.news_url=None"]
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 180                # two cores, other users' checks running: be patient
c.Spawner.http_timeout = 180
c.Spawner.environment = {
    # nbgrader, torchrun, alembic and jupyter of the environment come first
    "PATH": f"{VENV / 'bin'}:/usr/local/bin:/usr/bin:/bin",
    # nbgrader_config.py (course id, exchange) and labconfig/ (extensions students do not need)
    "JUPYTER_CONFIG_PATH": str(STATE / "etc" / "jupyter"),
    # a check's torchrun workers use one thread each (lab_src/harness/launcher.py); say so explicitly
    "LAB_OMP_THREADS": "1",
}
extra = os.environ.get("PP_LAB_HUB_SPAWNER_ENV")   # "NAME=value NAME=value", e.g. from the test
if extra:
    c.Spawner.environment.update(dict(item.split("=", 1) for item in shlex.split(extra)))
