import pytest
from pydantic import ValidationError

from workers.reward.config import RewardConfig, SandboxConfig


def test_defaults_are_valid_and_isolate_everything():
    config = RewardConfig()
    assert config.sandbox.use_namespaces and config.sandbox.use_landlock and config.sandbox.isolate_network
    assert config.check_timeout_s >= 3 * config.math_timeout_s


def test_unknown_field_is_rejected_by_name():
    with pytest.raises(ValidationError, match="num_wrokers"):
        RewardConfig(num_wrokers=4)


def test_nested_sandbox_error_names_the_field_path():
    with pytest.raises(ValidationError) as error:
        RewardConfig(sandbox={"cpu_seconds": 0})
    assert error.value.errors()[0]["loc"] == ("sandbox", "cpu_seconds")


def test_hard_limit_must_leave_room_for_math_verify():
    with pytest.raises(ValidationError, match=r"check_timeout_s \(5.0\) must be at least 3 × math_timeout_s \(6\)"):
        RewardConfig(math_timeout_s=2, check_timeout_s=5)


def test_math_timeout_is_whole_seconds():
    # math-verify's signal.alarm takes whole seconds.
    with pytest.raises(ValidationError, match="math_timeout_s"):
        RewardConfig(math_timeout_s=1.5)


def test_sandbox_round_trips_through_json():
    config = SandboxConfig(memory_mb=256, isolate_network=False)
    assert SandboxConfig.model_validate_json(config.model_dump_json()) == config
