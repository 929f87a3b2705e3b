"""Compute profiles: measured on one rank, saved and loaded as JSON, refused when missing, corrupt or mismatched."""

import dataclasses
import json

import pytest

from workloads.models import param_sizes
from workloads.profile import ProfileError, load_profile, measure_profile, save_profile


@pytest.fixture(scope="module")
def tiny_profile():
    return measure_profile("tiny", batch_size=8, image_size=16, steps=3, warmup_steps=1)


def test_profile_measures_every_parameter_in_registration_order(tiny_profile):
    p = tiny_profile
    assert p.numels == tuple(param_sizes("tiny", 10)) and p.dtype == "float32" and p.device == "cpu"
    assert p.forward_s > 0 and p.backward_s > 0 and p.optimizer_s > 0
    assert p.step_s == pytest.approx(p.forward_s + p.backward_s + p.optimizer_s)
    assert all(0 <= r <= p.backward_s for r in p.ready_s)
    # backward runs from the head to the input: the classifier's gradients are ready before conv1's
    assert p.ready_s[-1] < p.ready_s[0]
    assert p.id.startswith("tiny-b8-s16-cpu-")


def test_profile_round_trips_through_json(tiny_profile, tmp_path):
    path = save_profile(tiny_profile, tmp_path / "p.json")
    loaded = load_profile(path)
    assert loaded == tiny_profile and loaded.id == tiny_profile.id
    loaded.check_run("tiny", 8, 16, 10)


def test_missing_corrupt_and_mismatched_profiles_are_refused(tiny_profile, tmp_path):
    with pytest.raises(ProfileError, match="does not exist"):
        load_profile(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile(bad)
    data = tiny_profile.as_dict()
    data["params"][0]["numel"] = -3
    bad.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=r"params\[0\]"):
        load_profile(bad)
    data = tiny_profile.as_dict()
    del data["forward_s"]
    bad.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="missing field.*forward_s"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="batch_size = 8, the run has batch_size = 16"):
        tiny_profile.check_run("tiny", 16, 16, 10)
    with pytest.raises(ProfileError, match="model = 'tiny', the run has model = 'resnet18'"):
        tiny_profile.check_run("resnet18", 8, 16, 10)
    edited = dataclasses.replace(tiny_profile, num_classes=12)  # a file whose sizes do not fit its label
    with pytest.raises(ProfileError, match="parameter sizes"):
        edited.check_run("tiny", 8, 16, 12)
