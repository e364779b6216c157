"""Every field of the "acco" block, fuzzed: wrong types, out-of-range values, unknown keys."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ds_acco import AccoConfigError, parse_acco_config
from ds_acco.config import AccoConfig, TelemetryConfig
from ds_acco.config.names import Mode
from ds_acco.config.schema import FASTEST

# field -> (strategy of values that must be rejected)
NOT_BOOL = st.one_of(st.integers(min_value=2), st.text(min_size=2).filter(lambda s: s.lower() not in
                     {"true", "false", "yes", "no", "on", "off", "1", "0", "t", "f", "y", "n"}), st.floats())
NEGATIVE_INT = st.integers(max_value=-1)
BAD = {
    "enabled": NOT_BOOL,
    # every mode the schema takes, from its own names (a hand list missed "auto" and "fastest": a Hypothesis draw
    # of "auto" failed CI once)
    "mode": st.text().filter(lambda s: s not in {*(m.value for m in Mode), FASTEST}),
    "policy": st.text().filter(lambda s: s not in ("fixed", "adaptive")),
    "warmup_steps": st.one_of(NEGATIVE_INT, st.text(min_size=1).filter(lambda s: not s.strip().lstrip("-").isdigit()),
                              st.floats(allow_nan=True).filter(lambda f: f != int(f) if f == f and abs(f) < 1e18 else True)),
    "comm_dtype": st.text().filter(lambda s: s not in ("auto", "fp32", "bf16", "fp16")),
    "grad_accum_dtype": st.sampled_from(["float32", "int8", "", "FP32", "half"]),
    "timeout_s": st.one_of(st.floats(max_value=0.999), st.floats(min_value=604800.01), st.just(float("nan")), st.text(min_size=1).filter(lambda s: not _is_number(s))),
    "check_finite": NOT_BOOL,
}


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("field", sorted(BAD))
def test_each_field_rejects_bad_values_naming_it(field):
    @settings(max_examples=40, deadline=None)
    @given(BAD[field])
    def check(value):
        with pytest.raises(AccoConfigError) as info:
            parse_acco_config({field: value})
        assert f"acco.{field}" in str(info.value)

    check()


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1).filter(lambda k: k not in AccoConfig.model_fields))
def test_unknown_keys_are_rejected_with_the_allowed_list(key):
    with pytest.raises(AccoConfigError) as info:
        parse_acco_config({"mode": "acco", key: 1})
    assert "unknown key" in str(info.value) and "policy" in str(info.value)


@settings(max_examples=40, deadline=None)
@given(st.text(min_size=1).filter(lambda k: k not in TelemetryConfig.model_fields))
def test_unknown_telemetry_keys_are_rejected(key):
    with pytest.raises(AccoConfigError) as info:
        parse_acco_config({"telemetry": {key: 1}})
    assert "acco.telemetry." in str(info.value) and "log_every" in str(info.value)


@settings(max_examples=60, deadline=None)
@given(st.fixed_dictionaries({}, optional={
    "mode": st.sampled_from(["sync", "dpu", "acco"]), "policy": st.sampled_from(["fixed", "adaptive"]),
    "warmup_steps": st.integers(0, 10**6), "timeout_s": st.floats(min_value=1.0, max_value=604800.0),
    "comm_dtype": st.sampled_from(["auto", "fp32", "bf16", "fp16"]), "check_finite": st.booleans()}))
def test_valid_blocks_parse_and_fingerprint_deterministically(block):
    a, b = parse_acco_config(block), parse_acco_config(dict(block))
    assert a.fingerprint() == b.fingerprint()
