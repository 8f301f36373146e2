"""Settings are checked where they enter, once, by one rule per kind: the ``ELASTIC_TRAIN_*``
switches and seconds, ``should_checkpoint(prior_mtbf_s=...)``, every ``--rdzv-conf`` key
(the keys each backend takes, the closest one for a misspelt key) and the rules that cross
launch's flags, which ``--dry-run`` applies as the launch does."""

from __future__ import annotations

import json

import pytest

import elastic_train as et
from elastic_train._internal import env_vars
from elastic_train._internal.rendezvous_backends import lookup
from elastic_train.agent.node_policy import NodePolicy
from elastic_train.cli.launch_command import launch_settings, main_launch
from elastic_train.errors import ConfigError
from tests.support.paths import REPO

SCRIPT = f"{REPO}/tests/e2e/scripts/plain_torchrun_script.py"
ETCD = ["--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1:2379"]


@pytest.mark.parametrize("word, on", [("false", False), ("OFF", False), ("no", False),
                                      ("0", False), ("True", True), ("yes", True),
                                      ("on", True), ("1", True)])
@pytest.mark.parametrize("variable, field", [(env_vars.ZYGOTE, "zygote"),
                                             (env_vars.STANDBY, "standby"),
                                             (env_vars.LOCAL_TIER, "local_tier"),
                                             (env_vars.RAY_STRICT, "ray_strict")])
def test_every_switch_takes_the_same_words(variable, field, word, on):
    assert getattr(env_vars.Switches.from_environ({variable: word}), field) is on


@pytest.mark.parametrize("variable", [env_vars.ZYGOTE, env_vars.STANDBY, env_vars.LOCAL_TIER,
                                      env_vars.RAY_STRICT])
def test_a_switch_of_another_word_is_refused_naming_the_variable(variable):
    with pytest.raises(ConfigError) as caught:
        env_vars.Switches.from_environ({variable: "maybe"})
    said = str(caught.value)
    assert f"{variable}='maybe' is invalid" in said and "false" in said and "on" in said


@pytest.mark.parametrize("value, example", [("20s", "e.g. 20"), ("1m", "e.g. 60"),
                                            ("-3", "e.g. 20"), ("0", "e.g. 20")])
def test_lease_ttl_is_a_number_of_seconds(value, example):
    with pytest.raises(ConfigError) as caught:
        env_vars.Switches.from_environ({env_vars.LEASE_TTL_S: value})
    said = str(caught.value)
    assert f"{env_vars.LEASE_TTL_S}={value!r} is invalid" in said and "seconds" in said
    assert example in said
    assert env_vars.Switches.from_environ({env_vars.LEASE_TTL_S: "2.5"}).lease_ttl_s == 2.5


@pytest.mark.parametrize("value", ["4h", "x", 0, -5, True, None])
def test_should_checkpoint_takes_a_positive_number_of_seconds(value):
    with pytest.raises(ConfigError) as caught:
        et.should_checkpoint(prior_mtbf_s=value)
    said = str(caught.value)
    assert f"prior_mtbf_s={value!r} is invalid" in said and "seconds" in said
    if value == "4h":
        assert "e.g. 14400" in said


@pytest.mark.parametrize("conf, said", [
    ("outage_timeout=30s", "--rdzv-conf outage_timeout='30s' is invalid: use a number of "
                           "seconds >= 0 (no unit), e.g. 30."),
    ("outage_timout=5", "has no key 'outage_timout'; did you mean outage_timeout?"),
    ("ca_cert=/no/such.pem", "--rdzv-conf ca_cert='/no/such.pem' is invalid: no such file"),
    ("protocol=bad", "--rdzv-conf protocol='bad' is invalid: use http or https."),
    ("watch_check_interval=0", "--rdzv-conf watch_check_interval=0 is invalid"),
    ("node_policy=my_pkg.Policy", "name the policy as module:Class"),
])
def test_a_bad_rdzv_conf_key_or_value_is_refused_before_anything_starts(capsys, conf, said):
    assert main_launch([*ETCD, "--rdzv-conf", conf, SCRIPT], {}) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err


def test_a_misspelt_password_key_is_refused_without_its_value(capsys):
    assert main_launch([*ETCD, "--rdzv-conf", "pasword=hunter2", SCRIPT], {}) == 2
    err = capsys.readouterr().err
    assert "no key 'pasword'; did you mean password?" in err and "hunter2" not in err


def test_a_key_of_another_backend_says_whose_it_is(capsys):
    assert main_launch(["--standalone", "--rdzv-conf", "outage_timeout=5", SCRIPT], {}) == 2
    assert "it is a key of --rdzv-backend etcd or etcd-v3" in capsys.readouterr().err


def test_torchs_own_c10d_keys_are_accepted_and_parsed():
    conf = ("join_timeout=60,last_call_timeout=5,close_timeout=10,read_timeout=30,timeout=90,"
            "use_agent_store=false,is_host=1,store_type=tcp,keep_alive_interval=2,"
            "keep_alive_max_attempt=4")
    settings, _ = launch_settings(["--nnodes", "1:2", "--rdzv-backend", "c10d",
                                   "--rdzv-endpoint", "127.0.0.1:29400", "--rdzv-id", "j",
                                   "--rdzv-conf", conf, SCRIPT], {})
    parsed = settings.rendezvous.conf
    assert (parsed["use_agent_store"], parsed["is_host"], parsed["timeout"]) == (False, True, 90)


def test_the_python_api_checks_its_conf_by_the_same_table():
    with pytest.raises(ConfigError, match="no key 'join_timout'; did you mean join_timeout"):
        et.RendezvousConfig(backend="etcd", endpoint="h:2379", run_id="j",
                            conf={"join_timout": 5})
    assert lookup("etcd", "x").check_conf({"outage_timeout": "0"}, "c") == {"outage_timeout": 0}
    policy = NodePolicy()
    assert et.RendezvousConfig(backend="c10d", endpoint="h:29400", run_id="j", conf={
        "node_policy": policy}).conf["node_policy"] is policy


def test_a_conf_from_pet_rdzv_conf_is_named_by_its_variable(monkeypatch):
    monkeypatch.setenv("PET_RDZV_CONF", "outage_timeout=2m")
    with pytest.raises(ConfigError, match=r"PET_RDZV_CONF outage_timeout='2m' .* e\.g\. 120"):
        et.RendezvousConfig(backend="etcd", endpoint="h:2379", run_id="j")


@pytest.mark.parametrize("argv", [["--standalone"], ["--nproc-per-node", "1"]],
                         ids=["standalone", "one-node"])
def test_rdzv_conf_is_kept_on_one_node_as_torchrun_keeps_it(argv):
    settings, _ = launch_settings([*argv, "--rdzv-conf", "node_policy=pkg.mod:Policy",
                                   SCRIPT], {})
    assert settings.rendezvous.conf["node_policy"] == "pkg.mod:Policy"


def test_dry_run_applies_the_rules_across_configs_as_the_launch(capsys):
    assert main_launch(["--dry-run", "--replace-stragglers", SCRIPT], {}) == 2
    err = capsys.readouterr().err
    assert "--replace-stragglers" in err and "--spares" in err


@pytest.mark.parametrize("argv, said", [
    (["--max-restarts", "3", "--max-failures", "0"],
     "--max-restarts 3 and --max-failures 0 disagree"),
    (["--quiet", "--verbose"], "--quiet (no live status line) and --verbose"),
])
def test_contradictory_flags_are_refused(capsys, argv, said):
    assert main_launch(["--dry-run", *argv, SCRIPT], {}) == 2
    assert said in capsys.readouterr().err


def test_max_failures_alone_sets_the_budget_named_by_its_flag():
    settings, _ = launch_settings(["--max-failures", "2", SCRIPT], {})
    assert settings.run_config.failure_config.max_failures == 2
    assert settings.source("max_restarts") == "--max-failures"


def test_standalone_notes_the_node_count_it_ignores_and_dry_run_lists_it(capsys):
    assert main_launch(["--dry-run", "--standalone", "--nnodes", "2", SCRIPT], {}) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["nnodes"]["value"] == 1
    assert any("--nnodes=2 ignored" in note for note in report["notes"]), report["notes"]
