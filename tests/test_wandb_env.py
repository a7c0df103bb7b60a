"""wandb's own variables decide what the user left unset; no key stops the job in one line."""

import os

import pytest

from pipeline.config import LoggerConfig
from pipeline.preflight import PreflightError
from pipeline.wandb_env import check_wandb, wandb_init_switches

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
def test_a_local_mode_or_a_key_lets_the_job_start(bare_home, monkeypatch, env, mode):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    check_wandb(LoggerConfig(kind="wandb", mode=mode))


def test_an_explicit_online_mode_beats_the_variable(bare_home, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(PreflightError, match="logger.mode=online"):
        check_wandb(LoggerConfig(kind="wandb", mode="online"))


def test_a_key_from_wandb_login_counts(bare_home, monkeypatch):
    """`wandb login` writes the key to the netrc file under the server's host."""
    monkeypatch.setenv("WANDB_BASE_URL", "https://api.wandb.ai")
    netrc = bare_home / ".netrc"
    netrc.write_text(f"machine api.wandb.ai\n  login user\n  password {KEY}\n")
    netrc.chmod(0o600)
    check_wandb(LoggerConfig(kind="wandb"))


def test_wandb_offline_in_the_settings_file_counts(bare_home):
    """`wandb offline` records the mode in wandb's settings file, not in the environment."""
    config_dir = bare_home / "wandb-config"
    config_dir.mkdir()
    (config_dir / "settings").write_text("[default]\nmode = offline\n")
    check_wandb(LoggerConfig(kind="wandb"))


def test_no_wandb_needs_nothing(bare_home):
    check_wandb(LoggerConfig(kind="none"))
