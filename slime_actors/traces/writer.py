"""The trace writer is slime_actors/recorder/writer.py (the runtime records without importing the tools that read
traces); this name stays for code that imports it from here."""

from ..recorder.writer import (DIGESTS, SEGMENTS, TRACE_FORMAT, TRACE_VERSION, TraceWriter, digest,  # noqa: F401
                               trace_file_name)
