"""specreplay.traces: the Parquet trace format (schema, writer, reader, validation).

Where it sits: record -> **traces** -> replay -> diff. Nothing here imports torch.
"""

from specreplay.traces.errors import TraceError
from specreplay.traces.trace import Trace

__all__ = ["Trace", "TraceError"]
