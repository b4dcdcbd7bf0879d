"""Auto-tuning: the tuning-log store (``database``, used by compile) and the MetaSchedule driver (``tuner``)."""
