"""The one reading rule of NBMPI_* on/off switches (workers/core/switches.py) and its users."""
import pytest

from nbmpi.workers.core.switches import OFF_WORDS, env_switch


@pytest.mark.parametrize("raw", ["0", "off", "OFF", " false ", "No"])
def test_off_words_turn_a_switch_off(raw):
    assert env_switch("NBMPI_X", env={"NBMPI_X": raw}) is False
    assert env_switch("NBMPI_X", default=False, env={"NBMPI_X": raw}) is False


@pytest.mark.parametrize("raw", ["1", "on", "yes", "true", "anything"])
def test_other_values_turn_it_on(raw):
    assert env_switch("NBMPI_X", default=False, env={"NBMPI_X": raw}) is True


@pytest.mark.parametrize("env", [{}, {"NBMPI_X": ""}, {"NBMPI_X": "  "}])
def test_unset_or_empty_gives_the_default(env):
    assert env_switch("NBMPI_X", env=env) is True
    assert env_switch("NBMPI_X", default=False, env=env) is False


def test_the_process_environment_is_read_on_every_call(monkeypatch):
    from nbmpi.workers.core import jit_warmup, runtime
    from nbmpi.workers.distarray import context
    from nbmpi.workers.fused_reductions import rebinding_guard
    from nbmpi.workers.launch import environment

    for word in OFF_WORDS:
        monkeypatch.setenv("NBMPI_DISTARRAY_GC_PAUSE", word)
        monkeypatch.setenv("NBMPI_JIT_WARMUP", word)
        monkeypatch.setenv("NBMPI_TRACE", word)
        monkeypatch.setenv(rebinding_guard.ENV, word)
        assert not context.env_gc_pause() and not jit_warmup.enabled() and not rebinding_guard.enabled()
        assert not runtime.tracing_enabled_by_env()
        assert not environment.guard_enabled({environment.GUARD_ENV: word})
    monkeypatch.setenv("NBMPI_DISTARRAY_GC_PAUSE", "1")
    monkeypatch.delenv("NBMPI_JIT_WARMUP")
    monkeypatch.setenv(rebinding_guard.ENV, "on")
    assert context.env_gc_pause() and jit_warmup.enabled() and rebinding_guard.enabled()
    assert environment.guard_enabled({})
