"""Kept for compatibility: the padding functions moved to ``neuronfleet.engine.scheduler.padding``."""

from neuronfleet.engine.scheduler.padding import (
    PAD_SLOT,
    PAD_TOKEN_ID,
    DecodeInputs,
    PrefillInputs,
    kv_slot,
    pad_decode,
    pad_prefill,
)

__all__ = ["PAD_SLOT", "PAD_TOKEN_ID", "DecodeInputs", "PrefillInputs", "kv_slot", "pad_decode", "pad_prefill"]
