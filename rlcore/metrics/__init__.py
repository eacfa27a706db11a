"""What a step measures: its metrics under verl's names and its timers (``step``), model FLOPs
utilisation (``flops``), validation metrics (``validation``), the line a person reads (``progress``),
and the stop of a run whose numbers are no longer finite (``finite``)."""
