"""specreplay.traces: the Parquet trace format (schema, writer, reader, validation).

Where it sits: workloads -> models -> impls -> observers -> engines -> **traces** -> check ->
workflows -> views -> cli. Nothing here imports torch.
"""

from specreplay.traces.errors import TraceError
from specreplay.traces.trace import Trace

__all__ = ["Trace", "TraceError"]
