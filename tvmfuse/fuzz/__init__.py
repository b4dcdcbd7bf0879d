"""Differential fuzzing: seeded random CNNs (:mod:`.graphs`) compiled by tvmfuse and compared with
onnxruntime (:mod:`.check`), random INT8 kernel cases bit-exact against their numpy references (:mod:`.int8`),
and the campaign over a range of seeds (:mod:`.campaign`; command line: ``bench/fuzz.py``).

Needs onnxruntime (the ``test`` or ``bench`` extra) for the references.
"""
