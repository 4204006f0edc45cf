"""The compiler's second cost model (`bert_jax.hlo_cycles`) and the calibrated range
(`experiments.tpu_calibration`), on a hand-written program text and hand-made records:
no libtpu."""

# ruff: noqa: E501  (HLO lines are as long as the compiler writes them)

import json

import pytest

from bert_jax import hlo_cycles
from experiments import tpu_calibration

HLO = """\
HloModule jit_train_step, is_scheduled=true

%fused (a: f32[8]) -> f32[8] {
  %a = f32[8]{0:T(128)} parameter(0)
  ROOT %n = f32[8]{0:T(128)} negate(%a)
}

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0:T(128)}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8]{0:T(128)} get-tuple-element(%p), index=1
  %y = f32[8]{0:T(128)} fusion(%x), kind=kLoop, calls=%fused, backend_config={"estimated_cycles":"100"}
  ROOT %t = (s32[], f32[8]{0:T(128)}) tuple(%i, %y)
}

%cond (p: (s32[], f32[8])) -> pred[] {
  %p = (s32[], f32[8]{0:T(128)}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (a: f32[8]) -> f32[8] {
  %a = f32[8]{0:T(128)} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[8]{0:T(128)}) tuple(%zero, %a)
  %w = (s32[], f32[8]{0:T(128)}) while(%init), condition=%cond, body=%body, metadata={op_name="jit(train_step)/while"}
  %k = f32[8]{0:T(128)} custom-call(%a), custom_call_target="tpu_custom_call", backend_config={"custom_call_config": {"body": "abc", "cost_estimate": {"flops": 2000, "transcendentals": 0, "bytes_accessed": 100}}}
  %m = f32[8]{0:T(128)} fusion(%a), kind=kOutput, calls=%fused, backend_config={"estimated_cycles":"50"}
  %ar = f32[8]{0:T(128)} all-reduce(%m), replica_groups={}, to_apply=%fused
  ROOT %r = f32[8]{0:T(128)} add(%k, %ar), backend_config={"estimated_cycles":"10"}
}
"""


def test_per_op_cycles_count_loop_bodies_for_every_trip_and_price_kernels():
    found = hlo_cycles.op_cycles(HLO, peak_flops=1e3, hbm_bytes_per_second=10.0)
    assert found.loops == [("jit(train_step)/while", 4)]
    assert found.counted == 100 + 50 + 10  # each op once: what optimal_seconds sees of a loop
    assert found.cycles == 4 * 100 + 50 + 10
    # The kernel: 2,000 FLOPs at 1,000 FLOP/s = 2 s, 100 bytes at 10 B/s = 10 s: the slower.
    assert found.kernel_seconds == pytest.approx(10.0) and found.kernels == 1
    assert found.unpriced == 1  # the all-reduce carries no estimate
    assert found.seconds(clock_hz=46.0) == pytest.approx(460 / 46 + 10)
    # Without the chip's figures a kernel cannot be priced: it counts as unpriced.
    bare = hlo_cycles.op_cycles(HLO)
    assert bare.kernel_seconds == 0 and bare.unpriced == 2


def test_a_kernel_cost_estimate_escaped_inside_a_string_is_read():
    attrs = r'backend_config="{\"cost_estimate\": {\"flops\": 8, \"transcendentals\": 1, \"bytes_accessed\": 4}}"'
    assert hlo_cycles.kernel_seconds(attrs, peak_flops=2.0, hbm_bytes_per_second=2.0) == 4.0
    assert hlo_cycles.kernel_seconds("backend_config={}", 1.0, 1.0) is None


def test_per_op_seconds_use_the_chips_clock():
    # v4: 1.05 GHz; the kernel by v4's 275 TFLOP/s and 1.2 TB/s.
    seconds = hlo_cycles.per_op_seconds(HLO, "TPU v4", 275e12)
    assert seconds == pytest.approx(460 / 1.05e9 + 100 / 1.2e12)
    assert hlo_cycles.per_op_seconds(HLO, "TPU v6 lite", 918e12) is None  # clock unknown
    # Each clock is the chip's peak over its matrix units' multiply-adds a cycle.
    macs = {"TPU v2": 16384, "TPU v3": 2 * 16384, "TPU v4": 8 * 16384, "TPU v5 lite": 4 * 16384,
            "TPU v5": 8 * 16384}  # fmt: skip
    peaks = {"TPU v2": 22.5e12, "TPU v3": 61.5e12, "TPU v4": 275e12, "TPU v5 lite": 197e12,
             "TPU v5": 459e12}  # fmt: skip
    for kind, clock in hlo_cycles.CLOCK_HZ.items():
        assert peaks[kind] / (2 * macs[kind]) == pytest.approx(clock, rel=0.02)


def _calibration(tmp_path):
    record = {
        "runs": [
            {"name": "a", "slice": "v4-128", "measured_mfu": 0.5,
             "estimated_mfu": {"optimal_seconds": 0.625, "per_op": 0.4}},
            {"name": "b", "slice": "v5e-256", "measured_mfu": 0.7,
             "estimated_mfu": {"optimal_seconds": 1.0, "per_op": 0.7}},
            {"name": "not used", "slice": "v4-8", "measured_mfu": 0.1, "use": False,
             "estimated_mfu": {"optimal_seconds": 1.0}},
        ]
    }  # fmt: skip
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(record))
    return tpu_calibration.load(str(path))


def test_the_calibrated_range_divides_each_models_estimate_by_each_runs_ratio(tmp_path):
    calibration = _calibration(tmp_path)
    assert [run.name for run in calibration.runs] == ["a", "b"]
    assert calibration.ratios("optimal_seconds") == pytest.approx([0.8, 0.7])
    assert calibration.ratios("per_op") == pytest.approx([1.25, 1.0])
    # optimal 1.0 s: 1.25 s and 1.43 s; per-op 1.5 s: 1.2 s and 1.5 s: they overlap in 1.25-1.43.
    low, high = calibration.step_range({"optimal_seconds": 1.0, "per_op": 1.5})
    assert (low, high) == (pytest.approx(1.25), pytest.approx(1 / 0.7))
    # per-op 3.0 s: 2.4-3.0 s, no overlap with 1.25-1.43 s: both spans together.
    low, high = calibration.step_range({"optimal_seconds": 1.0, "per_op": 3.0})
    assert (low, high) == (pytest.approx(1.25), pytest.approx(3.0))
    # One model only (no clock for the per-op sum): that model's runs alone.
    low, high = calibration.step_range({"optimal_seconds": 1.0, "per_op": None})
    assert (low, high) == (pytest.approx(1.25), pytest.approx(1 / 0.7))
    assert calibration.step_range({"optimal_seconds": None}) is None
    text = calibration.describe()
    assert "2 measured runs" in text and "optimal_seconds x0.70-0.80" in text
    assert "overlap" in text
    assert "per-op cycles x1.00-1.25" in text
    assert tpu_calibration.load(str(tmp_path / "none.json")) is None


def test_each_runs_own_time_is_in_its_range_and_leave_one_out_predicts_it_by_the_others(
    tmp_path,
):
    calibration = _calibration(tmp_path)
    for run in calibration.runs:  # in-sample: the measured time (1) lies in its own range
        low, high = calibration.step_range(run.relative_estimates())
        assert low <= 1 + 1e-12 and high >= 1 - 1e-12
    # a (ratios 0.8, 1.25) by b's (0.7, 1.0) alone: optimal 0.8 / 0.7, per-op 1.25 / 1.0, no
    # overlap: both; b by a's: 0.7 / 0.8 and 1.0 / 1.25. Neither covers the other's time (1).
    (name_a, range_a), (name_b, range_b) = tpu_calibration.leave_one_out(calibration)
    assert name_a == "a" and range_a == (pytest.approx(0.8 / 0.7), pytest.approx(1.25))
    assert name_b == "b" and range_b == (pytest.approx(0.8), pytest.approx(0.875))


def test_the_shipped_calibration_record_holds_three_measured_runs():
    calibration = tpu_calibration.load()
    assert calibration is not None and len(calibration.runs) >= 3
    for run in calibration.runs:
        assert 0 < run.measured_mfu < 1
        assert run.ratio("optimal_seconds") and run.ratio("per_op")


def test_the_calibration_page_shows_its_records_table():
    with open(tpu_calibration.RECORD) as f:
        record = json.load(f)
    with open(tpu_calibration.RECORD.removesuffix(".json") + ".md") as f:
        assert tpu_calibration.table(record) in f.read()
