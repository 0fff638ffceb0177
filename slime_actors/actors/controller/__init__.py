"""The controller role: the actor that runs the RL loop, and its parts -- one file each, all of the same shape (a
class built from the controller, `Part(ctl)`):

    actor.py           Controller: the actor (its messages: engines and trainer ranks reporting, `status`); builds
                       the parts and runs the loop
    surface.py         Ctl: what the loop may use of the controller (a declared surface, checked by
                       tests/test_controller_surface.py)
    loop.py            the RL loop on one page, as slime's train.py and train_async.py
    engines.py         Engines: the rollout workers' weight versions, pause/resume, ending a rollout, weight sync
    training_group.py  TrainingGroup: the trainer ranks' rendezvous, failure and restart from the last checkpoint
    checkpoints.py     Checkpoints: --save (or the rolling RUN_DIR/ckpt), --save-hf, --load, resume
    evaluations.py     Evaluations: when to evaluate, eval rollouts, their history and saved responses
    debug_data.py      DebugData: --save-debug-rollout-data / --load-debug-rollout-data
    metrics.py         Metrics: metrics.jsonl, TensorBoard/W&B, hack alarms, curves.png, the job's result
"""

from .actor import Controller

__all__ = ["Controller"]
