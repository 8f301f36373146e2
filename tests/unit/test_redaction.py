"""The one rule for secrets: which options hold one, and how stored and shown text hides them."""

from __future__ import annotations

from elastic_train._internal.redaction import (
    public_options,
    redact_argv,
    redact_conf,
    redact_url,
    redacted_options,
)
from elastic_train.driver.launch_run import continuing_command
from elastic_train.driver.launch_settings import LaunchSettings
from elastic_train.rendezvous_config import RendezvousConfig
from tests.support.paths import REPO


def test_secret_names_are_dropped_or_masked_also_nested():
    options = {"endpoint_url": "http://h:9", "key": "AK", "aws_secret_access_key": "S",
               "client_kwargs": {"region_name": "r", "aws_session_token": "T"}}
    assert public_options(options) == {"endpoint_url": "http://h:9",
                                       "client_kwargs": {"region_name": "r"}}
    assert redacted_options(options) == {
        "endpoint_url": "http://h:9", "key": "***", "aws_secret_access_key": "***",
        "client_kwargs": {"region_name": "r", "aws_session_token": "***"}}


def test_conf_strings_argv_and_urls():
    assert redact_conf("timeout=60,password=hunter2,token=x") \
        == "timeout=60,password=***,token=***"
    assert redact_argv(["--rdzv-conf", "password=a", "--rdzv_conf=username=u,passwd=b",
                        "--storage-option", "secret=c", "--storage-option=endpoint_url=e",
                        "train.py", "--lr", "0.1"]) == [
        "--rdzv-conf", "password=***", "--rdzv_conf=username=u,passwd=***",
        "--storage-option", "secret=***", "--storage-option=endpoint_url=e",
        "train.py", "--lr", "0.1"]
    assert redact_url("https://me:pw@etcd:2379/x") == "https://me:***@etcd:2379/x"
    assert redact_url("etcd:2379") == "etcd:2379"


def test_rendezvous_config_without_secrets_drops_every_secret_looking_entry(tmp_path):
    key = tmp_path / "client.key"
    key.write_text("")
    config = RendezvousConfig(backend="etcd", endpoint="h:2379", run_id="j",
                              conf={"username": "u", "password": "p", "key": str(key)})
    assert {"password", "key"}.isdisjoint(config.without_secrets().conf)
    assert config.without_secrets().conf["username"] == "u"


def test_launch_records_and_hints_are_redacted(tmp_path):
    argv = ["--rdzv-backend", "etcd", "--rdzv-endpoint", "h:2379", "--rdzv-conf",
            "password=hunter2", "--storage-option", "key=AK",
            f"{REPO}/tests/e2e/scripts/launch_script.py", "out", "3", "--db", "https://u:pw@h"]
    settings = LaunchSettings(target=argv[8], target_args=argv[9:], rdzv_backend="etcd",
                              rdzv_endpoint="h:2379",
                              rdzv_conf="password=hunter2", storage_option=["key=AK"],
                              storage_path=str(tmp_path), name="n")
    command = continuing_command(settings, argv)
    text = repr(command) + repr(settings.flags())
    assert "hunter2" not in text and "AK" not in text
    assert "password=***" in text and "key=***" in text
    # the program's own arguments are the user's, kept as given (resume compares them)
    assert command[-5:] == argv[8:] and settings.flags()["target_args"] == argv[9:]
