"""MetaSchedule's loggers under handlers that tvmfuse did not put there (an application's, a test runner's):
tuning configures its loggers around them and leaves them in place."""

from __future__ import annotations

import logging

import pytest

from tvmfuse.tune import tuner


@pytest.fixture
def package_logger():
    package = logging.getLogger(tuner.MS_LOGGER)
    before = list(package.handlers)
    yield package
    for handler in list(package.handlers):
        if handler not in before:
            package.removeHandler(handler)


def test_metaschedule_alone_fails_on_a_handler_without_a_name(package_logger, tmp_path):
    from tvm.s_tir import meta_schedule as ms

    package_logger.addHandler(logging.NullHandler())  # no name: what an embedding application may add
    with pytest.raises(AttributeError, match="format"):
        ms.logging.get_loggers_from_work_dir(str(tmp_path), ["task"])


@pytest.mark.parametrize("name", [None, "app.audit"])
def test_task_logger_keeps_a_handler_it_did_not_create(package_logger, tmp_path, name):
    foreign = logging.NullHandler()
    foreign.set_name(name)
    package_logger.addHandler(foreign)
    for _ in range(2):  # configured twice, as two tasks of one run are
        logger = tuner._task_logger(str(tmp_path), "task")
        assert logger.name.startswith(tuner.MS_LOGGER + ".logging.task_")
        assert foreign in package_logger.handlers
    logger.info("logged")
    assert (tmp_path / "logs" / f"{logger.name}.log").read_text().strip().endswith("logged")
    console = [h for h in package_logger.handlers if type(h) is logging.StreamHandler]
    assert console and all(h.level == logging.WARNING for h in console)
