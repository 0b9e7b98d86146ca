"""Options of the triton backend; kept apart so reading them imports no Triton."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator


class TritonOptions(BaseModel):
    """Options of the triton backend (``--attn-opt prefill_block_m=32``)."""

    prefill_block_m: int = Field(64, ge=16, le=256, description="rows of a query tile when the step prefills")

    @field_validator("prefill_block_m")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError(f"must be a power of two, got {value}")
        return value
