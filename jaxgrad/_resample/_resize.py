"""resize: ONNX Resize's coordinate conventions (and so PyTorch's and TensorFlow's) on resample."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from jaxgrad import _checks, _implementation
from jaxgrad._resample import _ops, _plan

COORDINATE_TRANSFORMATION_MODES = (
    "half_pixel",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_half_pixel_for_nn",
    "half_pixel_symmetric",
)
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def resize(
    x: ArrayLike,
    output_shape: Sequence[int] | None = None,
    *,
    scales: Sequence[float] | None = None,
    mode: str = "nearest",
    coordinate_transformation_mode: str = "half_pixel",
    nearest_mode: str = "round_prefer_floor",
    implementation: str | None = None,
) -> jax.Array:
    """Resizes ``x`` with ONNX Resize's semantics, differentiably through ``resample``.

    Give exactly one of ``output_shape`` and ``scales``. Per axis, with input
    length ``n_in``: from ``output_shape``, ``n_out`` is given and the scale is
    ``s = n_out / n_in``; from ``scales``, ``n_out = floor(n_in * s)`` and the
    coordinates use the given ``s``. Output index ``o`` reads input coordinate
    ``u`` by ``coordinate_transformation_mode`` (``L = s * n_in``, unrounded)::

      half_pixel            (o + 0.5) / s - 0.5
      pytorch_half_pixel    (o + 0.5) / s - 0.5, or 0 when L == 1
      align_corners         o * (n_in - 1) / (L - 1), or 0 when L == 1
      asymmetric            o / s
      tf_half_pixel_for_nn  (o + 0.5) / s
      half_pixel_symmetric  n_in / 2 * (1 - n_out / L) + (o + 0.5) / s - 0.5

    computed in float64 output by output, in the order ONNX's reference
    evaluator uses, so that exact ties round the same way. ``mode="nearest"``
    then rounds ``u`` by ``nearest_mode`` (``round_prefer_floor`` sends ties down,
    ``round_prefer_ceil`` up) and ``mode="linear"`` interpolates between the two
    neighbours; indices clamp to the edges, as in ``resample``.

    Ports: PyTorch ``F.interpolate(mode="bilinear", align_corners=False)`` is
    ``mode="linear"`` with ``"half_pixel"``; ``align_corners=True`` is
    ``"align_corners"``; PyTorch ``"nearest"`` is ``"asymmetric"`` with
    ``nearest_mode="floor"``; ``"nearest-exact"`` is ``"half_pixel"`` with
    ``"round_prefer_ceil"`` (PyTorch computes in float32: where float arithmetic
    can land either side of an exact tie, it may read the other neighbour; the
    conventions page has an example). TensorFlow's ``half_pixel_centers=True``
    bilinear is ``"half_pixel"``. ``jax.image.resize(..., "linear")`` equals
    ``"half_pixel"`` linear when every axis grows (it antialiases when shrinking;
    ``resize`` does not).

    Args:
      x: array of rank >= 1; floating, or integer or bool for ``mode="nearest"``.
      output_shape: the output's shape, one non-negative length per axis (zero
        lengths give an empty result, as ``jax.image.resize`` does).
      scales: one positive, finite scale per axis (ONNX's ``scales`` input).
      mode: ``"nearest"`` or ``"linear"``.
      coordinate_transformation_mode: one of the six above.
      nearest_mode: ``"round_prefer_floor"`` (ONNX's default),
        ``"round_prefer_ceil"``, ``"floor"`` or ``"ceil"``.
      implementation: ``None`` (default), ``"xla"`` or ``"pallas"``: which arithmetic
        computes the op, as for ``resample``, which computes it.

    Returns:
      The resized array, with the dtype of ``x``.

    Raises:
      TypeError: ``x`` is not an array, or its dtype does not suit ``mode``, or
        its shape has a symbolic dimension (``jax.export``).
      ValueError: both or neither of ``output_shape`` and ``scales``; a negative
        length or a scale that is not positive; a per-axis argument of the wrong
        length; an unknown mode; ``scales`` that give an output length of 0; an
        empty axis of ``x`` to be resized into a non-empty one; an axis longer
        than ``2**31 - 1``; an unknown ``implementation``, or ``"pallas"`` where
        it cannot run.

    Examples:
      PyTorch's ``F.interpolate(x, scale_factor=2, mode="linear")``:

      >>> import jax.numpy as jnp, jaxgrad
      >>> x = jnp.array([0.0, 1.0, 4.0], dtype=jnp.float32)
      >>> jaxgrad.resize(x, (6,), mode="linear")
      Array([0.  , 0.25, 0.75, 1.75, 3.25, 4.  ], dtype=float32)

    References:
      ONNX ``Resize`` (opset 19); DirectML ``DML_RESAMPLE2_OPERATOR_DESC``.
    """
    op = "resize"
    x = _checks.as_array(op, "x", x)
    _ops.check_rank(op, "x", x)
    mode = _checks.choice(op, "mode", mode, _ops.MODES)
    ctm = _checks.choice(
        op,
        "coordinate_transformation_mode",
        coordinate_transformation_mode,
        COORDINATE_TRANSFORMATION_MODES,
    )
    nearest = _checks.choice(op, "nearest_mode", nearest_mode, NEAREST_MODES)
    impl = _implementation.check(op, implementation)
    _ops.check_dtype(op, "x", x, allow_integers=mode == "nearest")
    if (output_shape is None) == (scales is None):
        raise ValueError(
            f"{op}: give exactly one of output_shape and scales, got "
            f"{'both' if output_shape is not None else 'neither'}"
        )
    if scales is None:
        out_shape = _ops.check_shape(op, "output_shape", output_shape, x.ndim)
        _ops.check_samples(op, x.shape, out_shape)
        if 0 in x.shape or 0 in out_shape:  # empty in or out, as jax.image.resize
            return jnp.zeros(out_shape, x.dtype)
        scales_ = tuple(m / n for m, n in zip(out_shape, x.shape, strict=True))
    else:
        scales_ = _ops.positive_scales(op, scales, x.ndim)
        out_shape = tuple(math.floor(n * s) for n, s in zip(x.shape, scales_, strict=True))
        if 0 in out_shape:
            raise ValueError(
                f"{op}: floor(x.shape * scales) = {out_shape} has a zero length "
                f"(x.shape {x.shape}, scales {scales_})"
            )
    axes = tuple(
        axis_of(ctm, mode, nearest, n_in, n_out, s)
        for n_in, n_out, s in zip(x.shape, out_shape, scales_, strict=True)
    )
    return _ops.compiled_core(x, axes, False, impl)  # type: ignore[no-any-return]


def axis_of(
    ctm: str, mode: str, nearest_mode: str, n_in: int, n_out: int, scale: float
) -> _plan.Axis:
    """How ``resize`` resamples one axis of ``n_in`` inputs to ``n_out`` outputs."""
    # ONNX's round_prefer_floor is ceil(u - 0.5): ties go down.
    rounding, shift = {
        "round_prefer_floor": ("up", 0.5),
        "round_prefer_ceil": ("half_up", 0.0),
        "floor": ("down", 0.0),
        "ceil": ("up", 0.0),
    }[nearest_mode]
    if mode == "linear":
        coordinates = _Coordinates(ctm, n_in, n_out, scale, 0.0, None)
        return _plan.Axis(n_in, n_out, coordinates, True, rounding)
    coordinates = _Coordinates(ctm, n_in, n_out, scale, shift, rounding)
    return _plan.Axis(n_in, n_out, coordinates, False, rounding)


# Outputs whose coordinates are compared at once where a period is checked (64 KiB
# of float64 each): the check's memory does not grow with the axis.
_CHECKED_AT_ONCE = 8192


@dataclasses.dataclass(frozen=True)
class _Coordinates:
    """ONNX's input coordinate of each output, evaluated output by output, less
    ``shift`` (which turns round_prefer_floor into a rounding up).

    ``period`` is the pattern of the plan (``u(kP + j) = u(j) + kQ``) only where it
    gives the same taps as ONNX's expression evaluated at each output. Evaluated in
    float64 one by one, coordinates that are exactly whole (or half) in real numbers
    can land either side of it, and nearest neighbour would then read another input
    through the period than ONNX's reference reads (18 outputs of 14 inputs,
    asymmetric: output 9 at 9 / (18 / 14) = 6.999999999999999, where the period puts
    it at 7). Linear weights follow the period, within float64 rounding of ONNX's.
    """

    mode: str  # coordinate_transformation_mode
    n_in: int
    n_out: int
    scale: float
    shift: float
    rounding: str | None  # nearest neighbour's (the plan's); None for linear

    def at(self, o: np.ndarray) -> np.ndarray:
        return _onnx_coordinates(self.mode, self.n_in, self.n_out, self.scale, o) - self.shift

    @functools.cached_property
    def period(self) -> tuple[int, int] | None:
        found = self._slope_period()
        if found is None or self.rounding is None or self._reads_as_evaluated(*found):
            return found
        return None

    def _slope_period(self) -> tuple[int, int] | None:
        """``(P, Q)`` from the slope of the coordinates, ``Q / P``, where it has one."""
        length = self.scale * self.n_in  # L, the unrounded output length
        if self.mode in ("pytorch_half_pixel", "align_corners") and length == 1:
            return None  # one coordinate for every output
        if self.mode == "align_corners":
            return _plan.period_of((length - 1) / (self.n_in - 1)) if self.n_in > 1 else None
        return _plan.period_of(self.scale)

    def _reads_as_evaluated(self, p: int, q: int) -> bool:
        """Whether nearest neighbour reads the same input at every output through the
        period ``(p, q)`` as through the coordinate evaluated at that output."""
        assert self.rounding is not None
        first_period = _plan.rounded(self.at(np.arange(p, dtype=np.float64)), self.rounding)
        for start in range(0, self.n_out, _CHECKED_AT_ONCE):
            o = np.arange(start, min(start + _CHECKED_AT_ONCE, self.n_out))
            k, j = np.divmod(o, p)
            evaluated = _plan.rounded(self.at(o.astype(np.float64)), self.rounding)
            repeated = first_period[j] + k * q
            inputs = (np.clip(r, 0, self.n_in - 1) for r in (evaluated, repeated))
            if not np.array_equal(*inputs):
                return False
        return True


def _onnx_coordinates(ctm: str, n_in: int, n_out: int, scale: float, o: np.ndarray) -> np.ndarray:
    """Input coordinate of the outputs ``o``, in ONNX's reference expression order."""
    length = scale * n_in  # L, the unrounded output length
    if ctm == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if ctm == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if length != 1 else np.zeros(o.shape)
    if ctm == "align_corners":
        return o * (n_in - 1) / (length - 1) if length != 1 else np.zeros(o.shape)
    if ctm == "asymmetric":
        return o / scale
    if ctm == "tf_half_pixel_for_nn":
        return (o + 0.5) / scale
    # half_pixel_symmetric
    adjustment = n_out / length
    offset = n_in / 2 * (1 - adjustment)
    return offset + (o + 0.5) / scale - 0.5
