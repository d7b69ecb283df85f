"""The trace's refusal, apart from trace.py so that the modules trace.py uses (meta_cache.py) can raise
it without importing trace.py back."""


class TraceRefused(Exception):
    """The real-tensor trace cannot stand for what torch.export would capture; the message says why."""
