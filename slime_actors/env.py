"""Every SLIME_ACTORS_* environment variable, in one place.

The job's flags travel in job.json (slime_actors.config); the environment carries only what a launcher must hand to
a process it starts -- where the job lives and how to reach it, its keys, what the placement gave this process --
and the few per-host settings a user or a batch script sets for the processes of one node. Code reads a variable
through its entry here (`JOIN_TIMEOUT.get()`: the value typed, or the default; ValueError naming the variable when
it cannot be read) and sets one by its name (`{RUN_DIR.name: path}`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


def parse_flag(v: str) -> bool:
    """"0", "false", "no", "off" (any case) are False; anything else is True."""
    return v.strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class EnvVar:
    name: str
    kind: Callable[[str], Any]
    default: Any
    doc: str

    def get(self, environ: Mapping[str, str] | None = None) -> Any:
        """The variable's value as `kind`, or `default` when it is unset or empty."""
        raw = (os.environ if environ is None else environ).get(self.name)
        if raw is None or raw == "":
            return self.default
        try:
            return self.kind(raw)
        except ValueError:
            raise ValueError(f"{self.name} must be {_KIND_WORDS.get(self.kind, 'valid')}, got {raw!r}") from None


_KIND_WORDS = {int: "an integer", float: "a number", parse_flag: "0 or 1"}
ALL: dict[str, EnvVar] = {}


def _var(name: str, kind: Callable[[str], Any] = str, default: Any = None, doc: str = "") -> EnvVar:
    v = EnvVar("SLIME_ACTORS_" + name, kind, default, doc)
    ALL[v.name] = v
    return v


# -- where the job lives: set by every launcher for the processes it starts (slime_actors.runtime.RuntimeConfig) ---
RUN_DIR = _var("RUN_DIR", doc="the run directory (traces/, logs/, keys/, sockets/); default: RuntimeConfig's")
DIRECTORY = _var("DIRECTORY", doc="endpoint of the directory actor (directory/0)")
TRANSPORT = _var("TRANSPORT", doc="ipc (one host) or tcp (several hosts)")
HOST = _var("HOST", doc="address to bind for tcp")
ADVERTISE = _var("ADVERTISE", doc="address peers use to reach this host (tcp); default: the bind address")
CURVE = _var("CURVE", parse_flag, doc="1 to require the job's CURVE keys, 0 to go without; default: keys if the "
                                      "run has them")
TRACE = _var("TRACE", parse_flag, doc="0 to turn tracing off (--trace false)")
TRACE_BODY_LIMIT = _var("TRACE_BODY_LIMIT", int, doc="message bodies larger than this (bytes) are recorded by size "
                                                     "and hash")
TRACE_KEEP_ARRAYS = _var("TRACE_KEEP_ARRAYS", parse_flag, doc="1 to record array bytes too (--trace-keep-arrays)")
TRACE_BATCH_LIMIT = _var("TRACE_BATCH_LIMIT", int, doc="a trainer records the batches it is given up to this many "
                                                       "bytes (for replay); default: 256 MiB")
TRACE_MAX_BYTES = _var("TRACE_MAX_BYTES", int, doc="a process's trace files hold at most this many bytes, rotated "
                                                   "(--trace-max-bytes; 0: no bound)")
HEARTBEAT = _var("HEARTBEAT", float, doc="heartbeat interval in seconds (--heartbeat-interval)")
LIVENESS = _var("LIVENESS", int, doc="missed heartbeats before a peer is declared down (--heartbeat-liveness)")
MAX_MESSAGE_BYTES = _var("MAX_MESSAGE_BYTES", int, doc="mailbox limit: largest message (MailboxConfig)")
SEND_HWM = _var("SEND_HWM", int, doc="mailbox limit: ZeroMQ send high-water mark (MailboxConfig)")
RECV_HWM = _var("RECV_HWM", int, doc="mailbox limit: ZeroMQ receive high-water mark (MailboxConfig)")
MAX_INFLIGHT = _var("MAX_INFLIGHT", int, doc="mailbox limit: asks in flight (MailboxConfig)")
MAX_CONCURRENCY = _var("MAX_CONCURRENCY", int, doc="mailbox limit: handlers running at once (MailboxConfig)")
MALLOC_KEEP_MIB = _var("MALLOC_KEEP_MIB", int, doc="freed MiB glibc keeps for large messages (0: untouched)")
JOB = _var("JOB", doc="the job file (job.json) an actor process builds its config from (launch/actor.py)")

# -- keys: made or taken by the head, handed to every process of the job -----------------------------------------
CURVE_PUBLIC = _var("CURVE_PUBLIC", doc="the job's CURVE public key, Z85")
CURVE_SECRET = _var("CURVE_SECRET", doc="the job's CURVE secret key, Z85")
ENGINE_API_KEY = _var("ENGINE_API_KEY", doc="the engines' HTTP API key (backends.engine_auth)")
ENGINE_ADMIN_KEY = _var("ENGINE_ADMIN_KEY", doc="the engines' HTTP admin key (backends.engine_auth)")
RETRIEVER_KEY = _var("RETRIEVER_KEY", doc="the retriever's HTTP key (search.keys): the job's replicas require it, an "
                                          "external retriever (--retriever-url) is sent it")

# -- what the placement gave one actor process (launch/topology.Placement.process_env, launch/local.py) ------------
ACTOR_CLASS = _var("ACTOR_CLASS", doc="module:Class the actor process builds (a topology role's `class`)")
PLACED_GPUS = _var("GPUS", doc="the GPUs (physical ids) the topology gave this actor; CUDA_VISIBLE_DEVICES shows only "
                        "those")
CPUS = _var("CPUS", doc="the CPUs this actor is pinned to (comma-separated)")
INCARNATION = _var("INCARNATION", int, 0, doc="0 for an actor's first start, +1 per restart by its node agent")
GRADING_PARENT = _var("GRADING_PARENT", int, 0, doc="pid of the reward worker a math-grading process serves (it "
                                                    "exits when that process is gone)")

# -- per-host and run-time settings a user or a batch script sets ----------------------------------------------------
LOG_LEVEL = _var("LOG_LEVEL", str, "info", doc="the console's level in every process of the job: debug, info, "
                                               "warning or error (--log-level sets it for a job); the JSON logs "
                                               "keep info and up")
JOIN_TIMEOUT = _var("JOIN_TIMEOUT", float, 600.0, doc="seconds a node agent or torchrun rank keeps trying to join "
                                                      "the head")
HEAD_PORT = _var("HEAD_PORT", int, doc="the head's directory port in a Slurm job (the batch script reads it)")
TRAINER_ADDR = _var("TRAINER_ADDR", doc="the address trainer rank 0 offers for its process group's store "
                                        "(several hosts)")
WEIGHT_SYNC_ADDR = _var("WEIGHT_SYNC_ADDR", doc="the address trainer rank 0 offers engines for weight broadcasts")
WEIGHT_SYNC_TIMEOUT = _var("WEIGHT_SYNC_TIMEOUT", float, 600.0, doc="seconds a weight update may take before it "
                                                                    "fails")
HEAPWATCH = _var("HEAPWATCH", doc="actors (roles or names, comma-separated) whose Python heap growth is traced and "
                                  "written to RUN_DIR/heapwatch/ (slime_actors/heapwatch.py; a debugging aid: slow)")
HEAPWATCH_EVERY = _var("HEAPWATCH_EVERY", float, 60.0, doc="seconds between SLIME_ACTORS_HEAPWATCH's reports (the "
                                                           "first is the baseline)")
GC_WARN_MS = _var("GC_WARN_MS", float, 50.0, doc="a garbage collection this long (ms) or longer is logged as a warning "
                                                 "(slime_actors/gc_watch.py); 0: off")
GC_FREEZE = _var("GC_FREEZE", parse_flag, True, doc="0 to leave out freezing what an actor process's start-up built "
                                                   "(gc.freeze: later collections do not walk it; during start-up, "
                                                   "what each full collection found alive)")
SGLANG_FLAG_CACHE = _var("SGLANG_FLAG_CACHE", doc="the file where the head remembers --sglang-* flag lists SGLang's "
                                                   "parser accepted, so a job started again skips importing SGLang "
                                                   "(backends/sglang_flag_cache.py); default: "
                                                   "~/.cache/slime-actors/sglang-flag-checks.json; off: check every "
                                                   "time")
MODEL_CACHE = _var("MODEL_CACHE", doc="where built-in models (tiny:NAME, smollm2:135m) are made; default: RUN_DIR/../.models, "
                                      "or ~/.cache/slime-actors/models without a run directory (replay)")
