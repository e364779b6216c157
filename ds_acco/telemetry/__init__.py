"""Layer 1, telemetry: what each round did and cost, and the lines ds_acco logs.

Owns :class:`RoundRecord` (one per round per rank), :class:`Telemetry` (the last
records and running sums, "communication hidden"), the JSONL sink, and the start-up
line that tells an ACCO run from a stock one under DeepSpeed's and HF's default logging.

May import: ``ds_acco.errors`` and the standard library. Records are plain data: any
engine fills them, none is imported here.
"""

from ds_acco.telemetry.records import RoundRecord, Telemetry

__all__ = ["RoundRecord", "Telemetry"]
