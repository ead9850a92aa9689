"""Callbacks on worker 0's thread, and stopping a run from Python: a callback's exception,
request_stop() from another thread, and Ctrl-C."""

import gc
import os
import signal
import threading
import time
import weakref

import pytest

import lockstep
from conftest import cli_summary, mlp_config, write_yaml


def test_callbacks_see_every_logged_step_and_eval():
    trainer = lockstep.Trainer(lockstep.Config.from_dict(mlp_config(eval_every=20)))
    steps, evals, threads = [], [], set()

    def on_step(m):
        steps.append(m)
        threads.add(threading.get_ident())

    trainer.on_step(on_step)
    trainer.on_eval(evals.append)
    summary = trainer.run()
    assert [m.step for m in steps] == [10, 20, 30, 40]
    assert all(isinstance(m, lockstep.StepMetrics) and m.total_steps == 40 for m in steps)
    assert steps[-1].loss == pytest.approx(summary.final_train_loss)
    assert 0 < steps[-1].lr and steps[-1].samples_per_s > 0
    assert [e.step for e in evals] == [20, 40]
    assert all(isinstance(e, lockstep.EvalMetrics) for e in evals)
    assert evals[-1].loss == pytest.approx(summary.eval_loss)
    assert threading.get_ident() not in threads  # worker 0's thread, not the caller's


def test_an_exception_in_a_callback_stops_the_run_and_is_raised(tmp_path):
    config = lockstep.Config.from_dict(mlp_config(checkpoint={"dir": str(tmp_path / "ckpt")}))
    trainer = lockstep.Trainer(config)
    seen = []

    def on_step(m):
        seen.append(m.step)
        if m.step == 20:
            raise ValueError("stop here")

    trainer.on_step(on_step)
    with pytest.raises(ValueError, match="stop here"):
        trainer.run()
    assert seen == [10, 20]  # no callback after the one that raised
    saved = lockstep.load_checkpoint(tmp_path / "ckpt")
    assert 20 <= saved.step < 40  # stopped cleanly, with a checkpoint


def test_request_stop_from_another_thread_leaves_a_checkpoint_that_resumes_exactly(tmp_path):
    path = write_yaml(tmp_path / "mlp.yaml", mlp_config(
        checkpoint={"dir": str(tmp_path / "ckpt")}, log_every=5))
    whole = cli_summary(tmp_path, write_yaml(tmp_path / "whole.yaml", mlp_config(log_every=5)))
    trainer = lockstep.Trainer(lockstep.Config.from_yaml(path))
    logged, asked = threading.Event(), threading.Event()

    def on_step(m):  # holds worker 0 at step 10 until the other thread has asked
        if m.step == 10:
            logged.set()
            asked.wait(60)

    def stop():
        logged.wait(60)
        trainer.request_stop()
        asked.set()

    trainer.on_step(on_step)
    stopper = threading.Thread(target=stop)
    stopper.start()
    summary = trainer.run()
    stopper.join()
    assert summary.stopped_early and 10 <= summary.steps < 40
    assert summary.checkpoint and os.path.exists(summary.checkpoint)
    resumed = cli_summary(tmp_path, path, "--resume")
    assert resumed["resumed_from_step"] == summary.steps
    assert resumed["param_hash"] == whole["param_hash"]


def test_ctrl_c_stops_cleanly_then_raises_keyboard_interrupt(tmp_path):
    assert threading.current_thread() is threading.main_thread()
    config = lockstep.Config.from_dict(mlp_config(checkpoint={"dir": str(tmp_path / "ckpt")}))
    trainer = lockstep.Trainer(config)

    def on_step(m):
        if m.step == 10:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the main thread runs Python's handler meanwhile

    trainer.on_step(on_step)
    with pytest.raises(KeyboardInterrupt):
        trainer.run()
    saved = lockstep.load_checkpoint(tmp_path / "ckpt")
    assert 10 <= saved.step < 40


def test_a_callback_must_be_callable_and_set_before_run():
    trainer = lockstep.Trainer(lockstep.Config.from_dict(mlp_config(steps=1)))
    with pytest.raises(TypeError, match="callable"):
        trainer._native.on_step(3)
    refused = []

    def on_step(m):  # from inside the run: the workers read the callbacks without the lock
        try:
            trainer.on_eval(print)
        except ValueError as e:
            refused.append(str(e))

    trainer.on_step(on_step)
    trainer.run()
    assert refused == ["set the callbacks before run()"]


def test_a_trainer_its_own_callback_refers_to_is_collected():
    trainer = lockstep.Trainer(lockstep.Config.from_dict(mlp_config(steps=1)))
    trainer.on_step(lambda m, t=trainer: t.request_stop())  # a cycle through the C++ trainer
    alive = weakref.ref(trainer)
    del trainer
    gc.collect()
    assert alive() is None
