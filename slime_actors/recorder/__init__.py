"""What the runtime records as it runs, at the runtime's level: the trace writer an actor's mailbox hands every message
to (writer.py; its hot-path record packed in C: _fastrec.c, built by setup.py, optional), what the trace header says
about the machine (environment.py), and the profiler's file names and clock mark (profiles.py). The tools that read
traces back (slime_actors/traces/: reader, query, diff, replay, export) sit a floor above and import from here; the
mailbox imports nothing of it (mailbox/tracing.py declares what it needs)."""
