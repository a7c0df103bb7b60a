"""wandb's own variables decide what the user left unset; no key, a server that cannot be
reached or one that refuses the key stops the job in one line, before Ray. No test here talks
to anything beyond this machine: servers are local threads or closed local ports."""

import base64
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeline.runtime import wandb_env
from pipeline.job.config import LoggerConfig
from pipeline.checks.preflight import PreflightError
from pipeline.runtime.wandb_env import check_wandb, wandb_init_switches
from tests.driver.cli_run import refused_before_ray


KEY = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture()
def bare_home(monkeypatch, tmp_path):
    """No key, no mode, no netrc, no settings file: a new user's machine."""
    for name in list(os.environ):
        if name.startswith("WANDB_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / ".netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    return tmp_path


@pytest.fixture()
def asked(bare_home, monkeypatch):
    """The servers check_wandb asks, answered here: no request leaves the process."""
    calls = []
    monkeypatch.setattr(wandb_env, "server_problem",
                        lambda base_url, key: calls.append((base_url, key)))
    return calls


def test_switches_pass_only_what_the_user_set():
    unset = LoggerConfig(kind="wandb")
    assert wandb_init_switches(unset, {}) == {"project": "dflash"}
    assert wandb_init_switches(unset, {"WANDB_PROJECT": "theirs", "WANDB_MODE": "offline",
                                       "WANDB_ENTITY": "team"}) == {}
    explicit = LoggerConfig(kind="wandb", project="p", entity="e", name="n", mode="offline")
    assert wandb_init_switches(explicit, {"WANDB_PROJECT": "theirs"}) == {
        "project": "p", "entity": "e", "name": "n", "mode": "offline"}


def test_no_key_and_nothing_set_says_how_in_one_line(bare_home):
    with pytest.raises(PreflightError) as err:
        check_wandb(LoggerConfig(kind="wandb"))
    message = str(err.value)
    assert "\n" not in message
    assert "wandb login" in message and "WANDB_MODE=offline" in message
    assert "logger.mode=offline" in message


@pytest.mark.parametrize("env,mode", [
    ({"WANDB_MODE": "offline"}, None),
    ({"WANDB_MODE": "disabled"}, None),
    ({}, "offline"),
    ({"WANDB_API_KEY": KEY}, None),
    ({"WANDB_API_KEY": KEY, "WANDB_MODE": "offline"}, "online"),
])
def test_a_local_mode_or_a_key_lets_the_job_start(asked, monkeypatch, env, mode):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    check_wandb(LoggerConfig(kind="wandb", mode=mode))


def test_an_explicit_online_mode_beats_the_variable(bare_home, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(PreflightError, match="logger.mode=online"):
        check_wandb(LoggerConfig(kind="wandb", mode="online"))


def test_a_key_from_wandb_login_counts(bare_home, asked, monkeypatch):
    """`wandb login` writes the key to the netrc file under the server's host."""
    monkeypatch.setenv("WANDB_BASE_URL", "https://api.wandb.ai")
    netrc = bare_home / ".netrc"
    netrc.write_text(f"machine api.wandb.ai\n  login user\n  password {KEY}\n")
    netrc.chmod(0o600)
    check_wandb(LoggerConfig(kind="wandb"))
    assert asked == [("https://api.wandb.ai", KEY)]  # the key is checked where it is for


def test_wandb_offline_in_the_settings_file_counts(bare_home, asked):
    """`wandb offline` records the mode in wandb's settings file, not in the environment."""
    config_dir = bare_home / "wandb-config"
    config_dir.mkdir()
    (config_dir / "settings").write_text("[default]\nmode = offline\n")
    check_wandb(LoggerConfig(kind="wandb"))
    assert asked == []  # offline: no server to ask


def test_no_wandb_needs_nothing(bare_home):
    check_wandb(LoggerConfig(kind="none"))


@pytest.mark.parametrize("env,mode,asks", [
    ({"WANDB_MODE": "offline", "WANDB_API_KEY": KEY}, None, False),
    ({"WANDB_API_KEY": KEY}, "offline", False),
    ({"WANDB_MODE": "disabled"}, None, False),
    ({"WANDB_API_KEY": KEY}, None, True),
])
def test_only_an_online_run_asks_the_server(asked, monkeypatch, env, mode, asks):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    check_wandb(LoggerConfig(kind="wandb", mode=mode))
    assert [key for _, key in asked] == ([KEY] if asks else [])  # at wandb's default server


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_that_cannot_be_reached_is_one_line_at_once(bare_home, monkeypatch):
    url = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    monkeypatch.setenv("WANDB_BASE_URL", url)
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    t0 = time.monotonic()
    with pytest.raises(PreflightError) as err:
        check_wandb(LoggerConfig(kind="wandb"))
    line = str(err.value)
    assert "\n" not in line and time.monotonic() - t0 < wandb_env.SERVER_TIMEOUT_S
    assert f"the wandb server at {url} cannot be reached" in line
    assert "WANDB_BASE_URL" in line and "WANDB_MODE=offline" in line


class _Server(ThreadingHTTPServer):
    """A local stand-in for the wandb server: answers ``status`` and keeps what it was sent."""

    def __init__(self, status: int) -> None:
        self.status, self.seen = status, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                server.seen.append((self.path, self.headers.get("Authorization"), body))
                self.send_response(server.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()


@pytest.fixture()
def server(request, bare_home, monkeypatch):
    srv = _Server(request.param)
    monkeypatch.setenv("WANDB_BASE_URL", srv.url)
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("server", [401, 403], indirect=True)
def test_a_refused_key_is_one_line_naming_wandb_login(server):
    with pytest.raises(PreflightError) as err:
        check_wandb(LoggerConfig(kind="wandb"))
    line = str(err.value)
    assert "\n" not in line
    assert f"the wandb server at {server.url} refused the API key (HTTP {server.status})" in line
    assert "wandb login" in line and "WANDB_MODE=offline" in line
    path, auth, _ = server.seen[0]
    assert path == "/graphql" and base64.b64decode(auth.split()[1]).decode() == f"api:{KEY}"


@pytest.mark.parametrize("server", [200, 500], indirect=True)
def test_a_server_that_answers_lets_the_job_start(server):
    check_wandb(LoggerConfig(kind="wandb"))  # a 500 passes: wandb's own retries cope
    assert len(server.seen) == 1


@pytest.mark.slow
def test_train_cli_stops_before_ray_when_wandb_cannot_be_reached(tiny_assets, tmp_path):
    """The issue's case: an API key and no network. One line, exit 2, before Ray starts."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("WANDB_") and k.lower() not in ("http_proxy", "all_proxy")}
    env.update(DFLASH_ASSETS_DIR=tiny_assets.root, RAY_ADDRESS="", HOME=str(tmp_path),
               NETRC=str(tmp_path / ".netrc"), WANDB_CONFIG_DIR=str(tmp_path / "wandb"),
               WANDB_API_KEY=KEY, WANDB_BASE_URL=f"http://127.0.0.1:{_closed_port()}")
    output = refused_before_ray(env, "logger=wandb", f"train.out_dir={tmp_path / 'run'}")
    lines = [line for line in output.splitlines() if "cannot be reached" in line]
    assert len(lines) == 1 and "WANDB_MODE=offline" in lines[0], output[-3000:]
