"""The replica's hooks (swarmlm.noloco.hooks): what a run's loop tells them, in which order, and that their state
travels in its checkpoints. Two in-process replicas of the smallest model, so the events are those of a real run."""

from __future__ import annotations

import contextlib
import json

from swarmlm.noloco.comm.in_process import InProcessHub
from swarmlm.noloco.config import TrainConfig
from swarmlm.noloco.hooks import ClockHook, ReplicaHook
from swarmlm.noloco.observer import ReplicaObserver
from swarmlm.noloco.replica import Replica, checkpoint_dir


class Recorder(ReplicaHook):
    """Writes down every event, and keeps a counter of steps in the checkpoints."""

    def __init__(self):
        self.events: list[tuple] = []
        self.steps_seen = 0

    def started(self, replica, resumed_from, val):
        self.events.append(("started", resumed_from, val is not None))

    @contextlib.contextmanager
    def around_step(self, step):
        self.events.append(("enter", step))
        yield
        self.events.append(("exit", step))

    def trained(self, step):
        self.events.append(("trained", step))

    def before_outer(self, outer_step, theta):
        self.events.append(("before_outer", outer_step))

    def after_outer(self, outer):
        self.events.append(("after_outer", outer.outer_step, outer.group is not None))

    def step_done(self, done):
        self.steps_seen += 1
        self.events.append(("done", done.step, done.outer is not None, done.val is not None, done.stop))

    def state_dict(self):
        return {"recorder_steps": self.steps_seen}

    def load_state_dict(self, state):
        self.steps_seen = state["recorder_steps"]


def _train(tmp_path, **update) -> dict[int, Recorder]:
    config = TrainConfig(method="noloco", model="nano-llama", replicas=2, backend="in_process", out=str(tmp_path / "run"),
                         steps=4, seq_len=16, batch_size=2, eval_every=0, eval_batches=1, checkpoint_every=0,
                         progress=False, device="cpu", outer={"every": 2}, log={"tensorboard": False}).model_copy(update=update)
    hub = InProcessHub(2)
    recorders = {r: Recorder() for r in range(2)}

    def body(rank: int):
        replica = Replica(config, rank, 2, comm=hub.communicator(rank))
        assert [type(h) for h in replica.hooks[:2]] == [ClockHook, ReplicaObserver]
        replica.hooks.append(recorders[rank])
        return replica.run(progress=False)

    hub.run(body)
    return recorders


def test_the_loop_tells_its_hooks_each_event_in_order(tmp_path):
    events = _train(tmp_path)[1].events
    assert events[0] == ("started", None, True)  # a fresh run evaluates before its first step
    assert events[1:6] == [("enter", 1), ("trained", 1), ("exit", 1), ("done", 1, False, False, False), ("enter", 2)]
    # the outer step comes inside the step's hooks, after its gradients; NoLoCo names its group
    assert events[6:10] == [("trained", 2), ("before_outer", 1), ("after_outer", 1, True), ("exit", 2)]
    assert events[-1] == ("done", 4, True, True, False)  # the last step ends with an outer step and an evaluation


def test_a_hooks_state_travels_in_the_checkpoints(tmp_path):
    _train(tmp_path, stop_after=2)
    state = json.loads((checkpoint_dir(tmp_path / "run", 1) / "step-000002" / "state.json").read_text())
    assert state["recorder_steps"] == 2 and "sim_s" in state and "compute_s" in state
    recorders = _train(tmp_path)  # resumes at step 2
    assert recorders[1].events[0] == ("started", 2, False) and recorders[1].steps_seen == 4
