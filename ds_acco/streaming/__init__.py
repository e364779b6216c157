"""Layer 3, streaming: Streaming DiLoCo, one int8 fragment synchronised at a time.

Owns the fragment schedule, the streaming engine (local inner steps, fragment rounds on the
communication thread, the merge), re-sharding a saved state onto another number of ranks,
:func:`build` for a plain model, and the streaming phase ``mode: "auto"`` may switch a sharded job to
(:mod:`ds_acco.streaming.phase`; handed to the round engine by the front ends).

May import: layers 0-2 and torch; never ``ds_acco.rounds`` (the two engines share their
lifecycle through ``ds_acco.comm.engine_lifecycle``).
"""

from ds_acco.streaming.build import build, fragments_of, phase_factory
from ds_acco.streaming.engine import FragmentRecord, StreamingEngine
from ds_acco.streaming.phase import PhaseFactory, StreamingPhase
from ds_acco.streaming.schedule import sync_fragment, sync_offset

__all__ = ["FragmentRecord", "PhaseFactory", "StreamingEngine", "StreamingPhase", "build", "fragments_of",
           "phase_factory", "sync_fragment", "sync_offset"]
