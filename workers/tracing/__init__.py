"""Tracing: the record layout and event kinds (``records``), the per-rank tracer (``tracer``,
compiled buffer ``_tracer_core``), the gathered trace and its analysis (``analysis``), live
trace files of a controller job (``stream``) and the per-rank timeline figure (``timeline``,
Bokeh; it runs where a trace is looked at, never on a rank)."""
