"""TensorBoard event files written with the tensorboard package alone: scalars and text, the two kinds a run logs.

    tb = TensorBoardWriter("runs/x/tensorboard", purge_step=None)
    tb.add_scalar("train/loss", 0.3, step); tb.add_text("rollout/samples", markdown, step); tb.flush(); tb.close()

The same events as torch.utils.tensorboard's SummaryWriter writes (the records of tensorboard's EventFileWriter;
text as the text plugin's string tensor under TAG/text_summary; `purge_step` as a SessionLog START at that step,
which hides the events of a crashed run from that step on), without importing torch: the head process -- the
controller writes the metrics -- would otherwise load torch for this alone (~250 MiB and a second or two of CPU at
every start, docs/performance.md).
"""

from __future__ import annotations

import time


# The events are written to the file by the writer's own thread, in the order they were added, and on disk at the
# latest FLUSH_SECS after (at once on flush() and close()). The queue to that thread is long enough for a step's rows
# (tensorboard's 10 made adding a step's ~60 scalars wait on the thread, ~1-2 ms of the controller's step).
FLUSH_SECS = 2.0
QUEUE = 4096


class TensorBoardWriter:
    def __init__(self, logdir: str, purge_step: int | None = None):
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        self._writer = EventFileWriter(logdir, max_queue_size=QUEUE, flush_secs=FLUSH_SECS)
        if purge_step is not None:
            self._writer.add_event(Event(step=purge_step, file_version="brain.Event:2"))
            self._writer.add_event(Event(step=purge_step, session_log=SessionLog(status=SessionLog.START)))

    def _add(self, summary, step: int, walltime: float | None = None) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        self._writer.add_event(Event(summary=summary, step=int(step),
                                     wall_time=time.time() if walltime is None else walltime))

    def add_scalar(self, tag: str, value: float, step: int, walltime: float | None = None) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary
        self._add(Summary(value=[Summary.Value(tag=tag, simple_value=float(value))]), step, walltime)

    def add_text(self, tag: str, text: str, step: int, walltime: float | None = None) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
        from tensorboard.plugins.text.plugin_data_pb2 import TextPluginData
        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
            plugin_name="text", content=TextPluginData(version=0).SerializeToString()))
        tensor = TensorProto(dtype="DT_STRING", string_val=[text.encode("utf-8")],
                             tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
        self._add(Summary(value=[Summary.Value(tag=tag + "/text_summary", metadata=meta, tensor=tensor)]), step,
                  walltime)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
