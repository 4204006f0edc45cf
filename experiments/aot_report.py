"""The ahead-of-time fit check's report (`experiments.aot_compile`): memory against HBM,
model FLOPs, and the step time by the TPU compiler's two cost models (`optimal_seconds` and
the sum of its per-op estimates, `bert_jax.hlo_cycles`), each with the MFU, tokens/s, days
and chip-hours it implies; both together as a range, and that range calibrated against
measured runs (`experiments.tpu_calibration`) as the headline.
"""

from __future__ import annotations

import dataclasses

from experiments.tpu_slice import accelerator_type

GiB = 1024**3


@dataclasses.dataclass(frozen=True)
class MemoryUse:
    """Per-device bytes of one compiled program (fields of XLA's memory analysis)."""

    arguments: int
    outputs: int
    aliased: int  # outputs written into donated arguments' buffers (counted once)
    temporaries: int
    generated_code: int

    @property
    def total(self) -> int:
        """Peak bytes the program needs on one device."""
        return self.arguments + self.outputs - self.aliased + self.temporaries + self.generated_code

    @classmethod
    def of(cls, compiled) -> MemoryUse:
        stats = compiled.memory_analysis()
        if stats is None:
            raise RuntimeError("the compiler gave no memory analysis for this program")
        return cls(
            arguments=stats.argument_size_in_bytes,
            outputs=stats.output_size_in_bytes,
            aliased=stats.alias_size_in_bytes,
            temporaries=stats.temp_size_in_bytes,
            generated_code=stats.generated_code_size_in_bytes,
        )


def eval_peak_bytes(train: MemoryUse, evaluate: MemoryUse) -> int:
    """Peak bytes while evaluating mid-training: the whole train state stays resident.

    The eval step takes only the params, but the optimizer state (and the train batch's
    buffers) live on, so its own needs come on top of the train step's arguments.
    """
    return (
        train.arguments
        + evaluate.outputs
        + evaluate.temporaries
        + evaluate.generated_code
        + max(evaluate.arguments - train.arguments, 0)
    )


# The TPU runtime keeps part of HBM for itself: the compiler counts 15.48 GiB usable on a
# 16 GiB v3 core and 15.75 GiB on a v5e chip. A plan must leave at least this fraction.
HBM_HEADROOM = 0.035


def fits(peak_bytes: int, hbm_bytes: int, headroom: float = HBM_HEADROOM) -> bool:
    """Whether a program needing `peak_bytes` per device fits in `hbm_bytes` less headroom."""
    return peak_bytes <= hbm_bytes * (1 - headroom)


def projected_seconds(
    flops_per_step: float, steps: int, peak_flops_per_device: float, devices: int, mfu: float
) -> float:
    """Wall-clock seconds for `steps` steps at model-FLOPs utilisation `mfu`."""
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu}")
    return flops_per_step * steps / (peak_flops_per_device * devices * mfu)


def implied_mfu(
    flops_per_step: float, step_seconds: float, peak_flops_per_device: float, devices: int
) -> float:
    """The model-FLOPs utilisation of a step of `flops_per_step` model FLOPs taking
    `step_seconds` on `devices` devices (the inverse of `projected_seconds`)."""
    if not step_seconds > 0:
        raise ValueError(f"step_seconds must be positive, got {step_seconds}")
    return flops_per_step / (step_seconds * peak_flops_per_device * devices)


def duration(days: float) -> str:
    """`days` as people say it: minutes under an hour, hours under two days, else days."""
    hours = days * 24
    if hours < 1:
        return f"{hours * 60:.0f} min"
    return f"{hours:.1f} h" if hours < 48 else f"{days:.1f} days"


def duration_range(shortest: float, longest: float) -> str:
    """Two durations in days as a range, the unit said once where both share it."""
    a, b = duration(shortest), duration(longest)
    if a == b:
        return a
    (x, unit_a), (y, unit_b) = a.split(" "), b.split(" ")
    return f"{x}-{y} {unit_a}" if unit_a == unit_b else f"{a}-{b}"


def _span(a: str, b: str) -> str:
    return a if a == b else f"{a}-{b}"


@dataclasses.dataclass(frozen=True)
class Plan:
    """A run's figures at a given step time: its FLOPs, slice, steps and tokens."""

    flops_per_step: float
    peak_flops_per_device: float
    num_devices: int
    num_chips: int
    steps: int
    tokens_per_step: int = 0

    def mfu(self, step_seconds: float) -> float:
        return implied_mfu(
            self.flops_per_step, step_seconds, self.peak_flops_per_device, self.num_devices
        )

    def days(self, step_seconds: float) -> float:
        return step_seconds * self.steps / 86400

    def chip_hours(self, step_seconds: float) -> float:
        return self.days(step_seconds) * 24 * self.num_chips

    def tokens_per_second(self, step_seconds: float, padding: float = 0.0) -> float:
        return self.tokens_per_step * (1 - padding) / step_seconds

    def range_text(
        self,
        shortest: float,
        longest: float,
        usd_per_chip_hour: float | None = None,
        padding: float | None = None,
    ) -> str:
        """Step time, MFU, tokens/s, time to train, chip-hours (and cost) from `shortest`
        to `longest` seconds a step."""
        parts = [
            _span(f"{shortest * 1e3:.1f}", f"{longest * 1e3:.1f}") + " ms/step",
            "MFU "
            + _span(f"{100 * self.mfu(longest):.1f}", f"{100 * self.mfu(shortest):.1f}")
            + "%",
        ]
        if self.tokens_per_step:
            kind = "token slots/s" if padding is None else "real tokens/s"
            fast = self.tokens_per_second(shortest, padding or 0.0)
            slow = self.tokens_per_second(longest, padding or 0.0)
            parts.append(_span(f"{slow:,.0f}", f"{fast:,.0f}") + f" {kind}")
        when = duration_range(self.days(shortest), self.days(longest))
        hours = _span(f"{self.chip_hours(shortest):,.0f}", f"{self.chip_hours(longest):,.0f}")
        parts.append(f"{self.steps:,} steps = {when} ({hours} chip-hours)")
        if usd_per_chip_hour:
            cheap = self.chip_hours(shortest) * usd_per_chip_hour
            dear = self.chip_hours(longest) * usd_per_chip_hour
            parts.append(_span(f"${cheap:,.0f}", f"${dear:,.0f}"))
        return ", ".join(parts)


@dataclasses.dataclass
class FitReport:
    """What the fit check found for one config on one slice."""

    topology: str
    device_kind: str
    num_devices: int
    num_chips: int
    mesh_shape: dict[str, int]
    hbm_bytes: int
    train: MemoryUse
    evaluate: MemoryUse
    flops_per_step: float
    steps: int
    peak_flops_per_device: float
    compile_seconds: float
    # The compiler's estimate of one train step (unrolled layers), s; None: no estimate.
    compiler_step_seconds: float | None = None
    # The cost model's HBM bytes read and written per device by that step; None: unknown.
    compiler_bytes: float | None = None
    # The cost model's FLOPs per device of that step; None: unknown.
    compiler_flops: float | None = None
    layout: str = ""  # what was compiled: mesh, weight update, remat, scan (`layout_of`)
    estimated: bool = True  # whether the compiler's estimate was asked for
    tokens_per_step: int = 0  # token slots of a step's rows (global batch x sequence length)
    packed: bool = False  # rows hold several instances (`data.pack`)
    # The same step by the compiler's per-op estimates (`bert_jax.hlo_cycles`), s; None:
    # none (no clock known for the chip, --noestimate).
    per_op_step_seconds: float | None = None
    # What the estimates are calibrated by (`experiments.tpu_calibration.Calibration`).
    calibration: object = None

    @property
    def plan(self) -> Plan:
        return Plan(
            self.flops_per_step,
            self.peak_flops_per_device,
            self.num_devices,
            self.num_chips,
            self.steps,
            self.tokens_per_step,
        )

    @property
    def estimates(self) -> dict[str, float | None]:
        """The step's seconds by each cost model (`experiments.tpu_calibration.MODELS`)."""
        return {"optimal_seconds": self.compiler_step_seconds, "per_op": self.per_op_step_seconds}

    @property
    def calibrated_range(self) -> tuple[float, float] | None:
        """(shortest, longest) step time the estimates imply on a TPU, by the calibration."""
        if self.calibration is None:
            return None
        return self.calibration.step_range(self.estimates)

    @property
    def compiler_mfu(self) -> float | None:
        """The MFU the compiler's step-time estimate implies."""
        if self.compiler_step_seconds is None:
            return None
        return implied_mfu(
            self.flops_per_step,
            self.compiler_step_seconds,
            self.peak_flops_per_device,
            self.num_devices,
        )

    @property
    def cost_model_ratio(self) -> float | None:
        """The cost model's FLOPs of the whole step over the analytic model FLOPs: below 1,
        something is priced at less than its work (a Pallas kernel without a cost estimate
        counts zero), so the time estimate is too low."""
        if not self.compiler_flops:
            return None
        return self.compiler_flops * self.num_devices / self.flops_per_step

    @property
    def compiler_days(self) -> float | None:
        """Days to train this config's steps at the compiler's step-time estimate."""
        if self.compiler_step_seconds is None:
            return None
        return self.compiler_step_seconds * self.steps / 86400

    @property
    def eval_peak(self) -> int:
        return eval_peak_bytes(self.train, self.evaluate)

    @property
    def fits(self) -> bool:
        return fits(self.train.total, self.hbm_bytes) and fits(self.eval_peak, self.hbm_bytes)

    def days(self, mfu: float) -> float:
        seconds = projected_seconds(
            self.flops_per_step, self.steps, self.peak_flops_per_device, self.num_devices, mfu
        )
        return seconds / 86400

    def real_tokens_per_second(self, padding: float) -> float | None:
        """Real (non-padding) tokens per second at the compiler's estimate, for rows whose
        fraction `padding` is padding (what `benchmarks.bench_packing` measures on a corpus:
        packing lowers it; the step's time per row stays the same)."""
        if not 0 <= padding < 1:
            raise ValueError(f"padding must be in [0, 1), got {padding}")
        if self.compiler_step_seconds is None:
            return None
        return self.tokens_per_step * (1 - padding) / self.compiler_step_seconds

    def format(
        self, mfu: float, usd_per_chip_hour: float | None = None, padding: float | None = None
    ) -> str:
        def gib(n):
            return f"{n / GiB:7.2f} GiB"

        t, e = self.train, self.evaluate
        step_seconds = projected_seconds(
            self.flops_per_step, 1, self.peak_flops_per_device, self.num_devices, mfu
        )
        lines = [
            f"slice {self.topology} ({accelerator_type(self.topology)}): {self.num_devices} x "
            f"{self.device_kind} ({self.num_chips} chips), mesh {self.mesh_shape}, compiled in "
            f"{self.compile_seconds:.0f} s",
            f"layout: {self.layout}",
            f"per-device memory     train step   eval step   (HBM {gib(self.hbm_bytes)})",
            f"  arguments        {gib(t.arguments)}  {gib(e.arguments)}",
            f"  outputs          {gib(t.outputs)}  {gib(e.outputs)}",
            f"  aliased (donated){gib(t.aliased)}  {gib(e.aliased)}",
            f"  temporaries      {gib(t.temporaries)}  {gib(e.temporaries)}",
            f"  generated code   {gib(t.generated_code)}  {gib(e.generated_code)}",
            f"  total            {gib(t.total)}  {gib(self.eval_peak)} (with the train state)",
            f"  fits: {'yes' if self.fits else 'NO'} "
            f"({100 * max(t.total, self.eval_peak) / self.hbm_bytes:.0f}% of HBM; at most "
            f"{100 * (1 - HBM_HEADROOM):.1f}% is usable)",
            f"model FLOPs per step  {self.flops_per_step:.4g} (analytic: 6 x params-in-matmuls "
            f"x tokens + attention)",
        ]
        ratio = self.cost_model_ratio
        if ratio is not None:
            lines.append(
                f"cost model FLOPs {self.compiler_flops * self.num_devices:.4g} ({ratio:.2f}x "
                f"the model FLOPs)"
            )
            if ratio < 1:
                lines.append(
                    "  WARNING: the cost model counts fewer FLOPs than the model has: some of "
                    "the step (a Pallas kernel without a cost estimate?) is priced at zero, so "
                    "the compiler's time estimate below is too low"
                )
        lines += [
            f"projected at MFU {mfu:.0%}: {step_seconds * 1e3:.1f} ms/step, {self.steps:,} steps "
            f"= {duration(self.days(mfu))}",
        ]
        if usd_per_chip_hour:
            cost = self.days(mfu) * 24 * self.num_chips * usd_per_chip_hour
            lines.append(f"  at ${usd_per_chip_hour:.2f}/chip-hour: ${cost:,.0f}")
        if self.compiler_step_seconds is None:
            why = "the cost model gave no optimal_seconds" if self.estimated else "--noestimate"
            lines.append(f"compiler's estimate: none ({why})")
            return "\n".join(lines)
        days = self.compiler_days
        lines.append(
            f"compiler's estimate (unrolled layers): {self.compiler_step_seconds * 1e3:.1f} "
            f"ms/step = MFU {self.compiler_mfu:.1%}, {self.steps:,} steps = {duration(days)} "
            f"({days * 24 * self.num_chips:,.0f} chip-hours)"
        )
        rows = "packed rows" if self.packed else "unpacked rows"
        if padding is None:
            slots = self.real_tokens_per_second(0.0)
            lines.append(
                f"  {slots:,.0f} token slots/s ({rows}); --padding=<fraction> counts real tokens"
            )
        else:
            lines.append(
                f"  {self.real_tokens_per_second(padding):,.0f} real tokens/s ({rows} with "
                f"{padding:.1%} padding)"
            )
        if self.compiler_bytes:
            lines.append(
                f"  HBM traffic by the cost model: {self.compiler_bytes / 1e9:.1f} GB per device "
                f"per step"
            )
        if usd_per_chip_hour:
            cost = days * 24 * self.num_chips * usd_per_chip_hour
            lines.append(f"  at ${usd_per_chip_hour:.2f}/chip-hour: ${cost:,.0f}")
        lines += self._both_models(usd_per_chip_hour, padding)
        return "\n".join(lines)

    def _both_models(self, usd_per_chip_hour: float | None, padding: float | None) -> list[str]:
        """The per-op estimate, both models as a range, and the calibrated headline."""
        per_op, plan = self.per_op_step_seconds, self.plan
        lines = []
        if per_op:
            days = plan.days(per_op)
            lines.append(
                f"per-op estimate (estimated_cycles summed at the chip's clock, kernels by their "
                f"cost estimates): {per_op * 1e3:.1f} ms/step = MFU {plan.mfu(per_op):.1%}, "
                f"{self.steps:,} steps = {duration(days)} ({plan.chip_hours(per_op):,.0f} "
                f"chip-hours); {per_op / self.compiler_step_seconds:.2f}x optimal_seconds"
            )
            raw = sorted((self.compiler_step_seconds, per_op))
            lines.append("both cost models: " + plan.range_text(*raw, usd_per_chip_hour, padding))
        else:
            lines.append("per-op estimate: none (no clock known for this chip)")
        calibrated = self.calibrated_range
        if calibrated is None:
            lines.append("calibrated estimate: none (no calibration record)")
            return lines
        lines.append(
            "CALIBRATED ESTIMATE (headline): "
            + plan.range_text(*calibrated, usd_per_chip_hour, padding)
        )
        lines.append(f"  calibrated by {self.calibration.describe()}")
        return lines
