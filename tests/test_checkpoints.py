"""The checkpoint layout's helpers (slime_actors/checkpoints.py): what the controller, buffer and trainer ranks write
into an iteration directory, and when it counts as a checkpoint."""

from __future__ import annotations

import json

from slime_actors.checkpoints import (
    BUFFER_FILE,
    META,
    TRACKER,
    buffer_file,
    commit_checkpoint,
    detect_layout,
    iter_dir,
    latest_checkpoint,
    read_meta,
    trainer_dir,
)


def _parts(root, n):
    """What the trainer ranks and the buffer write before the controller commits iteration n."""
    it = iter_dir(root, n)
    trainer_dir(it).mkdir(parents=True)
    (trainer_dir(it) / "model.safetensors").write_bytes(b"x")
    buffer_file(it).write_bytes(b"\x80")
    return it


def test_commit_makes_an_iteration_the_latest_checkpoint(tmp_path):
    root = tmp_path / "ckpt"
    _parts(root, 2)
    assert latest_checkpoint(root) is None                   # written, not committed: not a checkpoint yet
    path = commit_checkpoint(root, 2, {"next_rollout_id": 2, "weight_version": 2})
    assert path == iter_dir(root, 2) and latest_checkpoint(root) == path
    assert read_meta(path) == {"next_rollout_id": 2, "weight_version": 2}
    assert (root / TRACKER).read_text() == "2" and not list(root.rglob("*.tmp"))
    assert detect_layout(root).kind == "ours" and detect_layout(path).kind == "ours-iter"
    assert buffer_file(path).name == BUFFER_FILE and trainer_dir(path).name == "trainer"


def test_an_interrupted_later_save_leaves_the_committed_one_latest(tmp_path):
    root = tmp_path / "ckpt"
    _parts(root, 1)
    commit_checkpoint(root, 1, {"next_rollout_id": 1})
    _parts(root, 2)                                          # the job died before committing iteration 2
    assert latest_checkpoint(root) == iter_dir(root, 1)
    assert json.loads((iter_dir(root, 1) / META).read_text())["next_rollout_id"] == 1
