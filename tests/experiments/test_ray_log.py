"""Ray's own driver messages (its token-authentication notice at start-up among them) go to the results directory's
ray.log, not into the progress lines on stderr; stop_ray() gives Ray its own handlers back. Without Ray started:
the redirection is what ray.init logs through (the "ray" logger's handlers)."""

import logging
import os

import pytest

from experiments.cluster import ray_runtime


def test_ray_messages_go_to_the_log_file_not_stderr(tmp_path, capfd):
    before = logging.getLogger("ray").handlers[:]
    log = tmp_path / "ray.log"
    with ray_runtime._ray_log(log):
        logging.getLogger("ray._private.authentication.authentication_token_setup").warning("Token notice")
    logging.getLogger("ray._private.worker").warning("a later notice")  # Ray's session goes on: still the file
    assert "Token notice" in log.read_text() and "a later notice" in log.read_text()
    assert "notice" not in capfd.readouterr().err
    ray_runtime._restore_ray_log()  # what stop_ray() does
    assert logging.getLogger("ray").handlers == before


def test_without_a_path_nothing_changes():
    before = logging.getLogger("ray").handlers[:]
    with ray_runtime._ray_log(None):
        assert logging.getLogger("ray").handlers == before


def test_a_failed_start_gives_the_handlers_back(tmp_path):
    before = logging.getLogger("ray").handlers[:]
    with pytest.raises(RuntimeError), ray_runtime._ray_log(tmp_path / "ray.log"):
        raise RuntimeError("ray.init failed")
    assert logging.getLogger("ray").handlers == before


def test_a_symlinked_log_is_refused_and_the_target_untouched(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    os.symlink(victim, tmp_path / "ray.log")
    with pytest.raises(ValueError, match="symlink"), ray_runtime._ray_log(tmp_path / "ray.log"):
        pass
    assert victim.read_text() == "keep"
