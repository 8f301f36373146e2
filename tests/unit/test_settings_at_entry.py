"""Settings are checked where they enter, once, by one rule per kind: the ``ELASTIC_TRAIN_*``
switches and seconds, ``should_checkpoint(prior_mtbf_s=...)``."""

from __future__ import annotations

import pytest

import elastic_train as et
from elastic_train._internal import env_vars
from elastic_train.errors import ConfigError


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
