"""Target comparison reports: ``tvmfuse compare`` and :func:`compare`.

Builds each arm (a target, a precision, tuning logs), checks every contender's outputs against
onnxruntime FP32, times them together in interleaved rounds with paired confidence intervals, profiles
where their time goes, and writes ``report.json`` (the single source), ``report.md`` and ``index.html``.
"""

from .report import SCHEMA, Report
from .run import compare

__all__ = ["SCHEMA", "Report", "compare"]
