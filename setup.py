"""The one C extension, slime_actors/recorder/_fastrec.c (the trace record's packer and queue); everything else is in
pyproject.toml. It is optional: without a compiler the install goes on, and the trace writer packs its records with
msgpack instead -- the same bytes, ~0.2 us a record slower (slime_actors/recorder/writer.py, `rec_py` and
`PyRecorder`)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("slime_actors.recorder._fastrec", ["slime_actors/recorder/_fastrec.c"], optional=True)])
